"""The layer as users drive it with its defaults: the solver chosen per graph (``"auto"``), a
plain model trained with no warning of any kind, autocast, inference mode, and TorchScript
refused with the fix."""
import warnings

import pytest
import torch
from torch import nn

import dignn_kernels as dk
from dignn_kernels import reference
from dignn_kernels.solvers import auto_solver

from conftest import LAPLACIANS, make_graph, rel_err, thetas

GRAPH_KINDS = ["symmetric", "directed", "weighted", "isolated", "self_loops", "duplicates",
               "zero_rows", "batch"]


def _strong(layer, scale):
    """Metric weights that make lambda_max(Delta) pass the default mu = 2.2 (paper theorem
    "Spectral Range of Delta_Phi"): a small chi = D tanh(||Θχ x||) under large neural edge
    weights W_ij = a tanh(1/(||q_i - q_j|| + eps)) tanh(|p_i . p_j|) (eq. 12-14)."""
    with torch.no_grad():
        layer.theta_chi.weight.mul_(0.5 / scale)
        layer.theta_phi.weight.mul_(10.0 * scale)
        layer.theta_varphi.weight.mul_(0.05)
    return layer


# ----------------------------------------------------------------- solver="auto" --

@pytest.mark.parametrize("kind", GRAPH_KINDS)
@pytest.mark.parametrize("laplacian", LAPLACIANS)
def test_auto_picks_per_graph_and_solves_the_equation(kind, laplacian):
    """The default solver: cg on an undirected graph, anderson on a directed one, and the
    answer is the equilibrium of the dense float64 solve (paper eq. 17)."""
    torch.manual_seed(0)
    x, ei, w = make_graph(kind, n=24, d=5)
    layer = dk.FusedImplicitDiffusion(5, laplacian=laplacian, max_iter=400, tol=1e-12).double()
    assert layer.solver == "auto"
    z = layer(x, ei, w)
    assert layer.solver_used == ("anderson" if kind == "directed" else "cg")
    want, _ = reference.dense_equilibrium(x, ei, w, laplacian=laplacian, mu=layer.mu,
                                          **thetas(layer))
    assert rel_err(z, want) < 1e-9


def test_auto_rule():
    assert auto_solver(True) == "cg" and auto_solver(False) == "anderson"
    for storage in (torch.bfloat16, torch.float16):
        assert auto_solver(True, storage) == auto_solver(False, storage) == "fixed_point"


@pytest.mark.parametrize("storage", [torch.bfloat16, torch.float16])
def test_auto_with_16bit_storage_runs_the_fixed_point(storage):
    x, ei, _ = make_graph("symmetric", n=20, d=4, dtype=torch.float32)
    layer = dk.FusedImplicitDiffusion(4, laplacian="rw", storage_dtype=storage)
    layer(x, ei)
    assert layer.solver_used == "fixed_point"


def test_the_paper_fixed_point_stays_one_argument_away():
    x, ei, _ = make_graph("symmetric", n=20, d=4, dtype=torch.float64)
    layer = dk.FusedImplicitDiffusion(4, laplacian="rw", solver="fixed_point",
                                      max_iter=10, tol=0.0).double()
    z = layer(x, ei)
    assert layer.solver_used == "fixed_point" and layer.iterations == 10
    want = reference.reference_implicit_diffusion(x, ei, None, laplacian="rw", mu=layer.mu,
                                                  max_iter=10, tol=0.0)
    assert rel_err(z, want) < 1e-12


@pytest.mark.parametrize("bad", ["", "Auto", "fixed-point", "newton", 3, None])
def test_unknown_solver_lists_auto(bad):
    with pytest.raises(ValueError, match=r"solver must be one of \('auto', 'fixed_point'"):
        dk.FusedImplicitDiffusion(4, solver=bad)


@pytest.mark.parametrize("directed,scale", [(False, 1.0), (False, 4.0), (True, 1.0),
                                             (True, 2.0)])
@pytest.mark.parametrize("backend", ["cpu", "torch"])
def test_defaults_do_not_diverge_where_the_fixed_point_does(directed, scale, backend):
    """Metric weights large enough that lambda_max(Delta) passes mu = 2.2 (about 2x and 4x
    on the directed graph, up to 8x on the symmetric one): the fixed point diverges and says
    so on every backend (on the directed graph a guard row has no edges, so its check holds),
    the default layer solves the same equation with no warning."""
    x, ei, _ = make_graph("directed" if directed else "symmetric", n=40, d=6,
                          dtype=torch.float64)
    torch.manual_seed(1)
    layer = _strong(dk.FusedImplicitDiffusion(6, max_iter=300, tol=1e-10,
                                              backend=backend).double(), scale)
    paper = dk.FusedImplicitDiffusion(6, solver="fixed_point", max_iter=300,
                                      tol=1e-10, backend=backend).double()
    paper.load_state_dict(layer.state_dict())
    with pytest.warns(dk.DivergenceWarning, match="solver='fixed_point' diverged"):
        paper(x, ei)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        z = layer(x, ei)
    want, delta = reference.dense_equilibrium(x, ei, mu=layer.mu, **thetas(layer))
    assert float(torch.linalg.eigvals(delta.detach()).real.max()) > layer.mu
    assert rel_err(z, want) < 1e-7


@pytest.mark.parametrize("backend", ["cpu", "torch"])
def test_anderson_far_past_the_condition_on_a_directed_graph_says_so(backend):
    """lambda_max(Delta) about 7x mu on a directed graph: Anderson's window of 5 does not
    reach the equilibrium in 300 sweeps; the layer warns with the fix instead of returning
    the iterate silently."""
    x, ei, _ = make_graph("directed", n=40, d=6, dtype=torch.float64)
    torch.manual_seed(1)
    layer = _strong(dk.FusedImplicitDiffusion(6, max_iter=300, tol=1e-10,
                                              backend=backend).double(), 4.0)
    with pytest.warns(dk.DivergenceWarning, match="solver='anderson' did not converge"):
        layer(x, ei)
    assert layer.solver_used == "anderson"


# ------------------------------------------------------------ a plain first model --

class PlainModel(nn.Module):
    """A newcomer's model: Linear -> ReLU -> the layer with its defaults -> Linear."""

    def __init__(self, features, hidden, classes):
        super().__init__()
        self.lin1 = nn.Linear(features, hidden)
        self.diffusion = dk.FusedImplicitDiffusion(hidden)
        self.lin2 = nn.Linear(hidden, classes)

    def forward(self, x, edge_index):
        h = nn.functional.dropout(self.lin1(x).relu(), 0.5, self.training)
        return self.lin2(self.diffusion(h, edge_index))


@pytest.mark.parametrize("directed", [False, True])
@pytest.mark.parametrize("homophily", [0.85, 0.2])
def test_a_plain_model_trains_with_no_warning(directed, homophily):
    """200 epochs of the plain model with the layer's defaults, every warning an error, on
    generated graphs (the paper's graphs: bench/accuracy/plain_model_defaults.py): no
    divergence, and the homophilous graph is learned."""
    from dignn.data import csbm
    data = csbm(num_nodes=300, homophily=homophily, num_splits=1, seed=0)
    ei = data.edge_index
    if directed:  # keep one direction of every pair, and a tenth of them both ways
        keep = ei[0] < ei[1]
        ei = torch.cat([ei[:, keep], ei[:, keep][:, ::10].flip(0)], dim=1)
    torch.manual_seed(0)
    model = PlainModel(data.num_features, 32, data.num_classes)
    opt = torch.optim.Adam(model.parameters(), lr=0.05, weight_decay=5e-4)
    split = data.splits[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(200):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(data.x, ei)[split.train],
                                               data.y[split.train])
            loss.backward()
            opt.step()
        model.eval()
        pred = model(data.x, ei).argmax(1)
    assert model.diffusion.solver_used == ("anderson" if directed else "cg")
    acc = float((pred[split.test] == data.y[split.test]).float().mean())
    if homophily > 0.5:
        assert acc > 0.8


# ---------------------------------------------------------------------- autocast --

AUTOCAST_DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", AUTOCAST_DEVICES)
@pytest.mark.parametrize("low", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("laplacian", LAPLACIANS)
@pytest.mark.parametrize("solver", ["auto", "fixed_point"])
def test_every_laplacian_under_autocast(device, low, laplacian, solver):
    """Under torch.autocast the layer computes in float32 and returns x's dtype: float32 x
    gives the result and gradients of the layer outside autocast, bit for bit (the backward
    outside the region, as torch recommends: inside it torch's own backward of the
    projections' GEMMs runs in 16 bits); a 16-bit x (what an autocast Linear hands on) gives
    that result rounded to x's dtype."""
    x, ei, w = make_graph("weighted", n=20, d=6, dtype=torch.float32)
    x, ei, w = x.to(device), ei.to(device), w.to(device)
    layer = dk.FusedImplicitDiffusion(6, laplacian=laplacian, solver=solver).to(device)
    xa = x.clone().requires_grad_()
    want = layer(xa, ei, w)
    want.square().sum().backward()
    want_grads = [xa.grad] + [p.grad.clone() for p in layer.parameters()]
    layer.zero_grad()
    xb = x.clone().requires_grad_()
    with torch.autocast(device, dtype=low):
        got = layer(xb, ei, w)
    got.square().sum().backward()
    assert got.dtype == torch.float32
    assert torch.equal(got, want)
    for a, b in zip([xb.grad] + [p.grad for p in layer.parameters()], want_grads):
        assert torch.equal(a, b)
    with torch.autocast(device, dtype=low):
        half = layer(x.to(low), ei, w)
    assert half.dtype == low
    assert torch.equal(half, layer(x.to(low).float(), ei, w).to(low))


@pytest.mark.parametrize("device", AUTOCAST_DEVICES)
@pytest.mark.parametrize("laplacian", ["rw", "sym", "unnormalized"])
@pytest.mark.parametrize("solver", ["cg", "anderson", "fixed_point"])
def test_the_solve_and_its_backward_ignore_autocast(device, laplacian, solver):
    """The solve op and its backward compute in the dtype they are given inside an autocast
    region too (the fixed Laplacians have no GEMM of torch's own in their backward, so the
    whole step, backward inside the region, equals the step outside it bit for bit)."""
    x, ei, w = make_graph("weighted", n=20, d=6, dtype=torch.float32)
    x, ei, w = x.to(device), ei.to(device), w.to(device)
    layer = dk.FusedImplicitDiffusion(6, laplacian=laplacian, solver=solver, max_iter=30)

    def step():
        xa = x.clone().requires_grad_()
        z = layer(xa, ei, w)
        z.square().sum().backward()
        return z, xa.grad

    want = step()
    with torch.autocast(device, dtype=torch.bfloat16):
        got = step()
    for a, b in zip(got, want):
        assert torch.equal(a, b)


@pytest.mark.parametrize("low", [torch.bfloat16, torch.float16])
def test_a_model_under_autocast(low):
    """A Linear under autocast hands the layer 16-bit features: the model runs and trains."""
    x, ei, _ = make_graph("symmetric", n=30, d=8, dtype=torch.float32)
    torch.manual_seed(0)
    model = PlainModel(8, 16, 3)
    y = torch.randint(0, 3, (30,))
    with torch.autocast("cpu", dtype=low):
        out = model(x, ei)
        loss = nn.functional.cross_entropy(out.float(), y)
    loss.backward()
    assert out.dtype == low
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


# ---------------------------------------------------------------- inference mode --

@pytest.mark.parametrize("laplacian", LAPLACIANS)
@pytest.mark.parametrize("where", ["inside", "after"])
def test_inference_mode_tensors(laplacian, where):
    """x and edge_index made under torch.inference_mode(), used inside it and after it: the
    answer of ordinary tensors."""
    x, ei, w = make_graph("weighted", n=20, d=4, dtype=torch.float32)
    layer = dk.FusedImplicitDiffusion(4, laplacian=laplacian)
    with torch.no_grad():
        want = layer(x, ei, w)
    dk.clear_graph_cache()
    with torch.inference_mode():
        xi, eii, wi = x.clone(), ei.clone(), w.clone()
        if where == "inside":
            got = layer(xi, eii, wi)
    if where == "after":
        with torch.no_grad():
            got = layer(xi, eii, wi)
    assert torch.equal(got, want)


# -------------------------------------------------------------------- TorchScript --

@pytest.mark.parametrize("how", ["script", "trace", "script_in_a_model", "trace_in_a_model"])
def test_torchscript_is_refused_with_the_fix(how):
    layer = dk.FusedImplicitDiffusion(4)
    x, ei = torch.randn(3, 4), torch.tensor([[0, 1], [1, 2]])
    module = nn.Sequential(nn.Identity(), layer) if how.endswith("model") else layer
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch: TorchScript is deprecated
        with pytest.raises(RuntimeError, match=r"does not support TorchScript .*torch\.compile"):
            if how.startswith("script"):
                torch.jit.script(module)
            elif how == "trace":
                torch.jit.trace(layer, (x, ei))
            else:
                torch.jit.trace(lambda u, e: layer(u, e) * 2, (x, ei))
