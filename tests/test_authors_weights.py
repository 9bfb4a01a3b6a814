"""``FusedImplicitDiffusion.from_authors``: the layer built from the authors' DIGNN modules or
their state dicts, found by attribute and key names.

The stand-ins below are written here: modules with the authors' attribute names and shapes
(``Theta_chi``, ``Theta_phi``, ``Theta_varphi``, ``mu``, ``epsilon``; a holder with ``func``,
``max_iter``, ``threshold``), not their code. The layer they give must solve the authors'
equation, whose node i aggregates at ``edge_index[0]``: its oracle is the dense float64 solve
of :mod:`dignn_kernels.reference` (PyG's convention) on ``edge_index.flip(0)``, forward and
Theta gradients. The last test runs the authors' own ``src/layers.py`` from a checkout of
their repository, when there is one.
"""
import importlib
import os
import sys
import types
from pathlib import Path

import pytest
import torch
from torch import nn

import dignn_kernels as dk
from dignn_kernels import reference
from conftest import make_graph, rel_err, thetas

F64 = torch.float64
AUTHORS = Path(os.environ.get("DIGNN_AUTHORS", "/work/authors_dignn"))


class NeuralStandIn(nn.Module):
    """Has what the authors' ImplicitFunc_Neural has: mu, epsilon and three bias-free
    linear maps, Theta_chi: d -> h, Theta_phi: h -> h, Theta_varphi: d -> h."""

    def __init__(self, d, h, mu=2.5, epsilon=1e-5, seed=0, scale=1.0):
        super().__init__()
        torch.manual_seed(seed)
        self.mu, self.epsilon = mu, epsilon
        self.Theta_chi = nn.Linear(d, h, bias=False)
        self.Theta_phi = nn.Linear(h, h, bias=False)
        self.Theta_varphi = nn.Linear(d, h, bias=False)
        with torch.no_grad():
            for lin in (self.Theta_chi, self.Theta_phi, self.Theta_varphi):
                lin.weight.mul_(scale / lin.weight.abs().max())


class RWStandIn(nn.Module):
    """Has what the authors' ImplicitFunc_RW has: mu, no parameters."""

    def __init__(self, mu=2.5):
        super().__init__()
        self.mu = mu


class HolderStandIn(nn.Module):
    """Has what the authors' DEQFixedPoint has: func, max_iter, threshold."""

    def __init__(self, func, max_iter=30, threshold=1e-6):
        super().__init__()
        self.func, self.max_iter, self.threshold = func, max_iter, threshold


class ModelStandIn(nn.Module):
    """A node model holding the holder at ``model`` (as their DIGNN_Neural does), with a
    mu of its own and other layers."""

    def __init__(self, func, max_iter=30):
        super().__init__()
        self.mu = func.mu
        self.fc1 = nn.Linear(3, func.Theta_chi.in_features if hasattr(func, "Theta_chi") else 3)
        self.model = HolderStandIn(func, max_iter)


def directed(n=12, d=4, weighted=True):
    x, ei, _ = make_graph("directed", n=n, d=d, seed=3)
    w = (torch.rand(ei.size(1), dtype=F64, generator=torch.Generator().manual_seed(1)) + 0.2
         if weighted else None)
    return x, ei, w


def authors_oracle(x, ei, w, laplacian, mu, eps, weights, g):
    """(Z*, [dl/dx, dl/dTheta_chi, dl/dTheta_phi, dl/dTheta_varphi]) of the authors'
    equation (aggregation at edge_index[0]) by the dense float64 solve, l = <Z, g>."""
    xd = x.detach().double().requires_grad_()
    params = {k: v.detach().double().requires_grad_() for k, v in weights.items()}
    z, _ = reference.dense_equilibrium(xd, ei.flip(0), w, laplacian=laplacian, mu=mu, eps=eps,
                                       **params)
    return z.detach(), list(torch.autograd.grad(z, [xd] + list(params.values()), g))


def layer_and_grads(layer, x, ei, w, g):
    xr = x.detach().clone().requires_grad_()
    z = layer(xr, ei, w)
    return z.detach(), list(torch.autograd.grad(z, [xr] + list(thetas(layer).values()), g))


# ------------------------------------------------------------------ what is read --

@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_neural_holder_reproduces_the_authors_equation(weighted):
    x, ei, w = directed(weighted=weighted)
    func = NeuralStandIn(4, 3).double()
    layer = dk.FusedImplicitDiffusion.from_authors(HolderStandIn(func, max_iter=198))
    assert (layer.laplacian, layer.flow, layer.mu, layer.eps) == \
        ("neural", "target_to_source", 2.5, 1e-5)
    assert (layer.in_channels, layer.metric_channels, layer.max_iter, layer.tol) == \
        (4, 3, 200, 0.0)
    assert layer.theta_chi.weight.dtype == F64
    for ours, theirs in (("theta_chi", "Theta_chi"), ("theta_phi", "Theta_phi"),
                         ("theta_varphi", "Theta_varphi")):
        assert torch.equal(getattr(layer, ours).weight, getattr(func, theirs).weight)
        assert getattr(layer, ours).weight.data_ptr() != getattr(func, theirs).weight.data_ptr()
    g = torch.linspace(-1.0, 1.0, x.numel(), dtype=F64).view_as(x)
    z, grads = layer_and_grads(layer, x, ei, w, g)
    assert layer.iterations == 200  # tol = 0: their whole budget, max_iter + 2
    want_z, want_grads = authors_oracle(x, ei, w, "neural", 2.5, 1e-5, thetas(layer), g)
    assert rel_err(z, want_z) < 1e-12
    for got, want in zip(grads, want_grads):
        assert rel_err(got, want) < 1e-10
    # PyG's convention (the layer's default) solves another equation on this graph
    pyg, _ = reference.dense_equilibrium(x, ei, w, laplacian="neural", mu=2.5, eps=1e-5,
                                         **thetas(layer))
    assert rel_err(z, pyg) > 1e-2


@pytest.mark.parametrize("kind", ["directed", "undirected"])
def test_a_holder_gives_their_fixed_point_iteration_at_any_budget(kind):
    """From their DEQFixedPoint the layer runs their iteration (``solver="fixed_point"``), not
    the layer's default (cg on an undirected graph, Anderson on a directed one): with a
    budget far from converged, the same Z as the paper's iteration applied as many times."""
    x, ei, _ = make_graph(kind, n=12, d=4, seed=3)
    func = NeuralStandIn(4, 3).double()
    layer = dk.FusedImplicitDiffusion.from_authors(HolderStandIn(func, max_iter=2))
    assert (layer.solver, layer.max_iter, layer.tol) == ("fixed_point", 4, 0.0)
    with torch.no_grad():
        z = layer(x, ei)
        want = reference.reference_implicit_diffusion(
            x, ei.flip(0), laplacian="neural", mu=2.5, eps=1e-5, max_iter=4, tol=0.0,
            **{k: v.detach() for k, v in thetas(layer).items()})
    assert rel_err(z, want) < 1e-12
    assert layer.iterations == 4
    converged, _ = reference.dense_equilibrium(x, ei.flip(0), laplacian="neural", mu=2.5,
                                               eps=1e-5, **thetas(layer))
    assert rel_err(z, converged.detach()) > 1e-4  # far from the equilibrium: a real test
    assert dk.FusedImplicitDiffusion.from_authors(func).solver == "auto"  # no budget: defaults


def test_every_source_gives_the_same_layer():
    func = NeuralStandIn(4, 3, mu=2.0, epsilon=1e-6)
    holder = HolderStandIn(func, max_iter=15)
    model = ModelStandIn(func, max_iter=15)
    sources = {"func": (func, {}), "holder": (holder, {}), "model": (model, {}),
               "func state": (func.state_dict(), {"mu": 2.0}),
               "holder state": (holder.state_dict(), {"mu": 2.0}),
               "model state": (model.state_dict(), {"mu": 2.0})}
    assert "model.func.Theta_chi.weight" in model.state_dict()
    for name, (source, given) in sources.items():
        layer = dk.FusedImplicitDiffusion.from_authors(source, **given)
        assert (layer.laplacian, layer.flow, layer.mu, layer.in_channels,
                layer.metric_channels) == ("neural", "target_to_source", 2.0, 4, 3), name
        for ours, theirs in (("theta_chi", "Theta_chi"), ("theta_phi", "Theta_phi"),
                             ("theta_varphi", "Theta_varphi")):
            assert torch.equal(getattr(layer, ours).weight, getattr(func, theirs).weight)
        # the iteration budget comes from a holder only; otherwise the layer's defaults
        assert (layer.max_iter, layer.tol) == ((17, 0.0) if "state" not in name and
                                               name != "func" else (10, 1e-6)), name


def test_the_swap_leaves_the_global_generator_alone():
    # Swapping their layer in the middle of their training must not change any later random
    # draw (their dropout masks, the next split's initialization): the layer's own
    # initialization, overwritten by their weights, draws from a forked generator.
    func = NeuralStandIn(4, 3, mu=2.0, epsilon=1e-6)
    torch.manual_seed(5)
    expected = torch.rand(8)
    torch.manual_seed(5)
    dk.FusedImplicitDiffusion.from_authors(HolderStandIn(func, max_iter=5))
    assert torch.equal(torch.rand(8), expected)


def test_random_walk_holder_reproduces_the_authors_equation():
    x, ei, w = directed()
    holder = HolderStandIn(RWStandIn(mu=2.2), max_iter=150)
    layer = dk.FusedImplicitDiffusion.from_authors(holder, in_channels=4)
    assert (layer.laplacian, layer.flow, layer.mu, layer.max_iter, layer.tol) == \
        ("rw", "target_to_source", 2.2, 152, 0.0)
    assert list(layer.parameters()) == []
    g = torch.linspace(-1.0, 1.0, x.numel(), dtype=F64).view_as(x)
    z, (gx,) = layer_and_grads(layer, x, ei, w, g)
    want_z, (want_gx,) = authors_oracle(x, ei, w, "rw", 2.2, 1e-6, {}, g)
    assert rel_err(z, want_z) < 1e-12 and rel_err(gx, want_gx) < 1e-10
    # the empty state dict of ImplicitFunc_RW: everything given
    rw = dk.FusedImplicitDiffusion.from_authors(holder.state_dict(), laplacian="rw",
                                                in_channels=4, mu=2.2)
    assert (rw.laplacian, rw.flow, rw.mu) == ("rw", "target_to_source", 2.2)


def test_overrides_win():
    func = NeuralStandIn(4, 3)
    layer = dk.FusedImplicitDiffusion.from_authors(
        HolderStandIn(func, max_iter=20), backend="torch", solver="anderson", tol=1e-9,
        max_iter=50, mu=3.0, eps=1e-4, flow="source_to_target", in_channels=4)
    assert (layer.backend, layer.solver, layer.tol, layer.max_iter, layer.mu, layer.eps,
            layer.flow) == ("torch", "anderson", 1e-9, 50, 3.0, 1e-4, "source_to_target")
    assert torch.equal(layer.theta_phi.weight, func.Theta_phi.weight)


# ------------------------------------------------------------------------ errors --

def test_more_than_one_match_asks_for_a_prefix():
    two = nn.Module()
    two.a = HolderStandIn(NeuralStandIn(4, 3, seed=1))
    two.b = HolderStandIn(NeuralStandIn(4, 3, seed=2))
    with pytest.raises(ValueError, match=r"2 DEQFixedPoint .*'a', 'b'.*prefix="):
        dk.FusedImplicitDiffusion.from_authors(two)
    layer = dk.FusedImplicitDiffusion.from_authors(two, prefix="b")
    assert torch.equal(layer.theta_chi.weight, two.b.func.Theta_chi.weight)
    state = two.state_dict()
    with pytest.raises(ValueError, match=r"2 sets of Theta weights.*'a.func', 'b.func'.*prefix="):
        dk.FusedImplicitDiffusion.from_authors(state, mu=2.5)
    layer = dk.FusedImplicitDiffusion.from_authors(state, prefix="a.func", mu=2.5)
    assert torch.equal(layer.theta_chi.weight, two.a.func.Theta_chi.weight)
    with pytest.raises(ValueError, match="prefix='c' names no submodule"):
        dk.FusedImplicitDiffusion.from_authors(two, prefix="c")
    with pytest.raises(ValueError, match="prefix='c' matches no key"):
        dk.FusedImplicitDiffusion.from_authors(state, prefix="c", mu=2.5)


def test_key_and_shape_errors():
    func = NeuralStandIn(4, 3)
    state = {f"model.func.{k}": v for k, v in func.state_dict().items()}
    with pytest.raises(ValueError, match="mu must be given"):
        dk.FusedImplicitDiffusion.from_authors(state)
    missing = {k: v for k, v in state.items() if "varphi" not in k}
    with pytest.raises(ValueError, match=r"lacks model\.func\.Theta_varphi\.weight"):
        dk.FusedImplicitDiffusion.from_authors(missing, mu=2.5)
    bad = dict(state, **{"model.func.Theta_phi.weight": torch.zeros(3, 4)})
    with pytest.raises(ValueError, match=r"Theta_phi\.weight has shape \[3, 4\].*must be "
                                         r"\[3, 3\]"):
        dk.FusedImplicitDiffusion.from_authors(bad, mu=2.5)
    with pytest.raises(ValueError, match=r"Theta_chi\.weight must be a floating matrix"):
        dk.FusedImplicitDiffusion.from_authors(
            dict(state, **{"model.func.Theta_chi.weight": torch.zeros(3, 4, dtype=torch.long)}),
            mu=2.5)
    with pytest.raises(ValueError, match="holds no Theta_chi.weight"):
        dk.FusedImplicitDiffusion.from_authors({"fc1.weight": torch.zeros(2, 2)}, mu=2.5)
    with pytest.raises(ValueError, match="in_channels=5 contradicts the authors' weights"):
        dk.FusedImplicitDiffusion.from_authors(func, in_channels=5)
    with pytest.raises(ValueError, match="laplacian='rw' contradicts"):
        dk.FusedImplicitDiffusion.from_authors(func, laplacian="rw")
    with pytest.raises(ValueError, match="in_channels must be given"):
        dk.FusedImplicitDiffusion.from_authors(HolderStandIn(RWStandIn()))
    with pytest.raises(ValueError, match="laplacian='neural' but the source holds no Theta"):
        dk.FusedImplicitDiffusion.from_authors(RWStandIn(), in_channels=4, laplacian="neural")
    with pytest.raises(ValueError, match="found no DIGNN implicit function"):
        dk.FusedImplicitDiffusion.from_authors(nn.Linear(3, 3))
    with pytest.raises(TypeError, match="source must be the authors' module"):
        dk.FusedImplicitDiffusion.from_authors([1, 2])
    with pytest.raises(ValueError, match="mu must be a finite number > 0"):
        dk.FusedImplicitDiffusion.from_authors(NeuralStandIn(4, 3, mu=-1.0))


# ------------------------------------------------------------ the authors' code --

def _scatter_add(src, index, dim=0, dim_size=None):
    """torch_scatter.scatter_add as the authors call it (dim 0, 1-D index)."""
    assert dim == 0
    size = (dim_size if dim_size is not None else int(index.max()) + 1,) + tuple(src.shape[1:])
    return torch.zeros(size, dtype=src.dtype, device=src.device).index_add_(0, index, src)


@pytest.fixture
def authors_layers(monkeypatch):
    """The authors' src/layers.py, imported from their checkout with a torch_scatter
    stand-in (scatter_add by index_add_) in sys.modules."""
    src = AUTHORS / "nodeclassification" / "src"
    if not (src / "layers.py").is_file():
        pytest.skip(f"no checkout of the authors' DIGNN at {AUTHORS} (set DIGNN_AUTHORS); "
                    f"bench/peers/peers.py runs the same comparison against it")
    scatter = types.ModuleType("torch_scatter")
    scatter.scatter_add = _scatter_add
    package = types.ModuleType("src")
    package.__path__ = [str(src)]
    monkeypatch.setitem(sys.modules, "torch_scatter", scatter)
    monkeypatch.setitem(sys.modules, "src", package)
    for name in ("src.solvers", "src.layers"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    # their backward hook calls torch.cuda.synchronize(), which needs a GPU
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args, **kwargs: None)
    layers = importlib.import_module("src.layers")
    yield layers
    for name in ("src.solvers", "src.layers"):
        sys.modules.pop(name, None)


@pytest.mark.parametrize("kind", ["neural", "rw"])
def test_matches_the_authors_code(authors_layers, kind):
    """Their DEQFixedPoint(ImplicitFunc_*) on a weighted directed graph, threshold 0 (their
    whole budget), and from_authors(their module): the same Z (the same number of
    applications of the same map) and gradients of x and the Thetas (both adjoints
    converged), and both the dense float64 solve of their equation."""
    x, ei, w = directed()
    torch.manual_seed(0)
    mu, their_max_iter = 2.5, 120
    if kind == "neural":
        func = authors_layers.ImplicitFunc_Neural(4, 3, mu, epsilon=1e-5).double()
        with torch.no_grad():
            for lin in (func.Theta_chi, func.Theta_phi, func.Theta_varphi):
                lin.weight.mul_(1.0 / lin.weight.abs().max())
    else:
        func = authors_layers.ImplicitFunc_RW(mu)
    fwd = authors_layers.fwd_solver
    deq = authors_layers.DEQFixedPoint(func, fwd, fwd, their_max_iter, 0.0).train()
    layer = dk.FusedImplicitDiffusion.from_authors(deq, in_channels=4)
    assert (layer.laplacian, layer.max_iter, layer.tol) == (kind, their_max_iter + 2, 0.0)
    g = torch.linspace(-1.0, 1.0, x.numel(), dtype=F64).view_as(x)

    xa = x.clone().requires_grad_()
    their_params = [getattr(func, t).weight for t in ("Theta_chi", "Theta_phi", "Theta_varphi")
                    ] if kind == "neural" else []
    za = deq(xa, ei, w)
    theirs = [za.detach()] + list(torch.autograd.grad(za, [xa] + their_params, g))
    z, grads = layer_and_grads(layer, x, ei, w, g)
    ours = [z] + grads
    assert len(ours) == len(theirs) == (5 if kind == "neural" else 2)
    assert rel_err(ours[0], theirs[0]) < 1e-13  # the same applications
    for a, b in zip(ours[1:], theirs[1:]):
        assert rel_err(a, b) < 1e-10
    want_z, want_grads = authors_oracle(x, ei, w, kind, mu, 1e-5, thetas(layer), g)
    assert rel_err(theirs[0], want_z) < 1e-12
    for got, want in zip(theirs[1:], want_grads):
        assert rel_err(got, want) < 1e-10
    # a short budget, far from converged: the same number of applications of the map
    short = authors_layers.DEQFixedPoint(func, fwd, fwd, 2, 0.0).eval()
    with torch.no_grad():
        z_short = short(x, ei, w)
    ours_short = dk.FusedImplicitDiffusion.from_authors(short, in_channels=4)
    assert ours_short.max_iter == 4
    assert rel_err(ours_short(x, ei, w), z_short) < 1e-13
    ours_short.max_iter = 3
    assert rel_err(ours_short(x, ei, w), z_short) > 1e-4
