"""``flow=`` (PyG's ``MessagePassing(flow=...)``): ``"source_to_target"`` aggregates at
``edge_index[1]``, ``"target_to_source"`` at ``edge_index[0]`` (the authors' DIGNN code).

Every case is checked against the dense float64 solve of :mod:`dignn_kernels.reference`, whose
convention is PyG's: for ``target_to_source`` its oracle is that solve on
``edge_index.flip(0)``. Forward Z and the gradients of x and the three Theta, on every backend
the CPU runs (the compiled kernels, plain PyTorch, Triton in its interpreter, and the CUDA host
code in its emulator: the last two on fewer, smaller cases, since they are slow), every solver
and every Laplacian; then the graph cache, the argument checks, sparse inputs, prebuilt graphs,
the partitioned solve and the ``dignn`` models.
"""
import copy

import pytest
import torch

import dignn_kernels as dk
from dignn_kernels import reference
from dignn_kernels.backends import triton as tb
from dignn_kernels.distributed import DistributedGraph, GraphPartition, partition
from conftest import LAPLACIANS, make_graph, make_layer, rel_err, thetas

FLOWS = ("source_to_target", "target_to_source")
EXACT = dict(max_iter=400, tol=1e-14)
F64 = torch.float64
# The backends that run on the CPU at full speed: the compiled kernels and plain PyTorch.
# Triton on the CPU runs in its interpreter (tests/conftest.py sets TRITON_INTERPRET=1 when
# there is no GPU, and available_backends then lists it): a few small cases of its own below.
CPU_BACKENDS = [b for b in dk.available_backends(torch.device("cpu")) if b != "triton"]


def directed(weighted: bool, n: int = 12, d: int = 4):
    """(x, edge_index, edge_weight) of a directed graph (some nodes without in- or
    out-edges), float64; edge weights in [0.2, 1.2) or None."""
    x, ei, _ = make_graph("directed", n=n, d=d, seed=3)
    w = None
    if weighted:
        w = torch.rand(ei.size(1), dtype=F64, generator=torch.Generator().manual_seed(1)) + 0.2
    return x, ei, w


def layer_for(laplacian, flow, **kwargs):
    """A float64 layer whose neural weights give flows that differ by several percent."""
    return make_layer(kwargs.pop("d", 4), laplacian, scale=1.0, flow=flow, **kwargs)


def oracle(layer, x, ei, w, g):
    """(Z*, [dl/dx, dl/dTheta...]) of the dense float64 solve in the layer's flow, for
    l = <Z, g>: the PyG-convention oracle on ``edge_index.flip(0)`` for target_to_source."""
    graph_ei = ei if layer.flow == "source_to_target" else ei.flip(0)
    xd = x.detach().double().requires_grad_()
    params = {k: v.detach().double().requires_grad_() for k, v in thetas(layer).items()}
    z, _ = reference.dense_equilibrium(xd, graph_ei, w, laplacian=layer.laplacian,
                                       mu=layer.mu, eps=layer.eps, **params)
    grads = torch.autograd.grad(z, [xd] + list(params.values()), g)
    return z.detach(), list(grads)


def solve(layer, x, ei, w, g):
    """(Z, [dl/dx, dl/dTheta...]) of the layer, expecting the cg -> anderson fallback warning
    exactly when cg meets a directed graph."""
    xr = x.detach().clone().requires_grad_()
    if layer.solver == "cg":
        with pytest.warns(UserWarning, match="solver='anderson' runs instead"):
            z = layer(xr, ei, w)
        assert layer.solver_used == "anderson"
    else:
        z = layer(xr, ei, w)
        assert layer.solver_used == layer.solver
    grads = torch.autograd.grad(z, [xr] + list(thetas(layer).values()), g)
    return z.detach(), list(grads)


def check_against_oracle(layer, x, ei, w, z_tol=1e-10, g_tol=1e-8):
    g = torch.linspace(-1.0, 1.0, x.numel(), dtype=F64).view_as(x)
    z, grads = solve(layer, x, ei, w, g)
    want_z, want_grads = oracle(layer, x, ei, w, g)
    assert layer.iterations < layer.max_iter, "the forward solve did not converge"
    assert rel_err(z, want_z) < z_tol, (layer.flow, rel_err(z, want_z))
    assert len(grads) == (4 if layer.laplacian == "neural" else 1)
    for name, got, want in zip(["x"] + list(thetas(layer)), grads, want_grads):
        assert rel_err(got, want) < g_tol, (layer.flow, name, rel_err(got, want))
    # the flows solve different equations here: the oracle of the other flow is far off
    other = copy.deepcopy(layer)
    other.flow = FLOWS[1 - FLOWS.index(layer.flow)]
    assert rel_err(z, oracle(other, x, ei, w, g)[0]) > 1e-3


# --------------------------------------------------- every backend, solver, Laplacian --

@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("laplacian", LAPLACIANS)
@pytest.mark.parametrize("solver", dk.SOLVERS)
@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("flow", FLOWS)
def test_matches_dense_solve(flow, backend, solver, laplacian, weighted):
    x, ei, w = directed(weighted)
    layer = layer_for(laplacian, flow, backend=backend, solver=solver, **EXACT)
    check_against_oracle(layer, x, ei, w)
    assert layer.backend_used == backend


def _interpreted_triton():
    if not tb.available("cpu"):
        pytest.skip("the Triton kernels were compiled for the GPU in this session "
                    "(TRITON_INTERPRET unset); tests/test_triton.py runs them on CUDA")


@pytest.mark.parametrize("flow,solver,laplacian", [
    ("source_to_target", "fixed_point", "neural"), ("target_to_source", "fixed_point", "neural"),
    ("target_to_source", "cg", "rw")])
def test_triton_interpreter_matches_dense_solve(flow, solver, laplacian):
    """backend="triton" on CPU tensors in Triton's interpreter (slow: a small graph; cg on
    this directed graph runs anderson, so every solver's code runs)."""
    _interpreted_triton()
    x, ei, w = directed(True, n=8, d=3)
    layer = layer_for(laplacian, flow, d=3, h=3, backend="triton", solver=solver, **EXACT)
    check_against_oracle(layer, x, ei, w)
    assert layer.backend_used == "triton"


@pytest.fixture(scope="module")
def emu():
    """The CUDA host code built for the emulator of csrc/cuda/simt.cuh (the build of
    tests/test_cuda_emulated.py, cached on disk per version of the sources)."""
    import test_cuda_emulated
    return test_cuda_emulated.emu.__wrapped__()


def test_emulated_cuda_matches_dense_solve(emu, monkeypatch):
    """The layer on the CUDA ops' host code and kernels (their fused fixed-point solve, the
    path a GPU runs), in the emulator; the emulated build has no Anderson ops."""
    from test_cuda_emulated import emulated_cpu_backend
    emulated_cpu_backend(emu, monkeypatch)
    x, ei, w = directed(True, n=10, d=4)
    layer = layer_for("neural", "target_to_source", backend="cpu", **EXACT)
    check_against_oracle(layer, x, ei, w)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("solver", dk.SOLVERS)
@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("flow", FLOWS)
def test_gpu_backends_match_dense_solve(flow, backend, solver):
    """Both flows on the GPU backends, every solver, against the same CPU float64 oracle."""
    dev = torch.device("cuda")
    if backend not in dk.available_backends(dev):
        pytest.skip(f"the {backend} backend is not in this build")
    x, ei, w = directed(True)
    layer = layer_for("neural", flow, backend=backend, solver=solver, **EXACT).to(dev)
    g = torch.linspace(-1.0, 1.0, x.numel(), dtype=F64).view_as(x)
    z, grads = solve(layer, x.to(dev), ei.to(dev), w.to(dev), g.to(dev))
    assert layer.backend_used == backend and z.is_cuda
    assert layer.iterations < layer.max_iter, "the forward solve did not converge"
    want_z, want_grads = oracle(copy.deepcopy(layer).cpu(), x, ei, w, g)
    assert rel_err(z.cpu(), want_z) < 1e-10, (flow, rel_err(z.cpu(), want_z))
    for name, got, want in zip(["x"] + list(thetas(layer)), grads, want_grads):
        assert rel_err(got.cpu(), want) < 1e-8, (flow, name, rel_err(got.cpu(), want))


# ---------------------------------------------------------- undirected and the cache --

@pytest.mark.parametrize("laplacian", LAPLACIANS)
def test_undirected_graph_same_both_ways(laplacian):
    x, ei, w = make_graph("weighted", n=16, d=4)
    out = {}
    for flow in FLOWS:
        layer = layer_for(laplacian, flow)
        xr = x.clone().requires_grad_()
        z = layer(xr, ei, w)
        out[flow] = [z] + list(torch.autograd.grad(z.sum(), [xr] + list(layer.parameters())))
    for a, b in zip(*out.values()):
        assert torch.equal(a, b)


def test_cache_keeps_the_flows_apart():
    """The same edge_index object, both flows in turn: each call gets its own flow's graph
    and its own flow's equilibrium, every time."""
    x, ei, w = directed(True)
    graphs = {flow: dk.cached_graph(ei, x.size(0), w, flow=flow) for flow in FLOWS}
    assert graphs[FLOWS[0]] is not graphs[FLOWS[1]]
    want = {FLOWS[0]: dk.build_graph(ei, x.size(0), w),
            FLOWS[1]: dk.build_graph(ei.flip(0), x.size(0), w)}
    assert not torch.equal(want[FLOWS[0]].rowptr, want[FLOWS[1]].rowptr)
    layers = {flow: layer_for("neural", flow, **EXACT) for flow in FLOWS}
    layers[FLOWS[1]].load_state_dict(layers[FLOWS[0]].state_dict())
    g = torch.ones_like(x)
    expected = {flow: oracle(layers[flow], x, ei, w, g)[0] for flow in FLOWS}
    for _ in range(3):
        for flow in FLOWS:
            graph = dk.cached_graph(ei, x.size(0), w, flow=flow)
            assert graph is graphs[flow] and graph.flow == flow
            for field in ("rowptr", "col", "value", "degree"):
                assert torch.equal(getattr(graph, field), getattr(want[flow], field)), field
            assert rel_err(layers[flow](x, ei, w), expected[flow]) < 1e-10


# -------------------------------------------------------------------- bad arguments --

@pytest.mark.parametrize("bad", ["source-to-target", "in", None, 0, ("target_to_source",)])
def test_bad_flow_names_the_argument(bad):
    x, ei, _ = directed(False)
    calls = [lambda: dk.FusedImplicitDiffusion(4, flow=bad),
             lambda: dk.build_graph(ei, 12, flow=bad),
             lambda: dk.cached_graph(ei, 12, flow=bad),
             lambda: partition(ei, 12, 1, flow=bad)]
    for call in calls:
        with pytest.raises(ValueError, match="flow must be 'source_to_target' or "
                                             "'target_to_source'"):
            call()


def test_sparse_tensor_with_target_to_source_is_refused():
    """A sparse adjacency is PyG's adj_t (rows are the targets): as PyG, the transposed
    tensor is asked for. With the default flow it is read as before."""
    x, ei, w = directed(True)
    n = x.size(0)
    coo = torch.sparse_coo_tensor(torch.stack([ei[1], ei[0]]), w, (n, n),
                                  check_invariants=True)
    layer = layer_for("rw", "target_to_source", **EXACT)
    for adj in (coo, coo.to_sparse_csr()):
        with pytest.raises(ValueError, match="pass in the transposed sparse tensor"):
            layer(x, adj)
        with pytest.raises(ValueError, match="flow='target_to_source' is invalid"):
            dk.build_graph(adj, n, flow="target_to_source")
    # the transposed tensor with the default flow is the target_to_source model
    transposed = torch.sparse_coo_tensor(ei, w, (n, n), check_invariants=True)
    default = layer_for("rw", "source_to_target", **EXACT)
    assert rel_err(default(x, transposed), layer(x, ei, w)) < 1e-12


def test_prebuilt_graph_must_match_the_layer_flow():
    x, ei, w = directed(True)
    layer = layer_for("neural", "target_to_source", **EXACT)
    with pytest.raises(ValueError, match="built with flow='source_to_target' but the layer "
                                         "has flow='target_to_source'"):
        layer(x, dk.build_graph(ei, x.size(0), w))
    graph = dk.build_graph(ei, x.size(0), w, flow="target_to_source")
    assert graph.flow == "target_to_source"
    assert torch.equal(layer(x, graph), layer(x, ei, w))
    with pytest.raises(ValueError, match="has flow='source_to_target'"):
        layer_for("neural", "source_to_target")(x, graph)
    # a graph assembled by hand is checked: its flow must be one of the two
    hand = dk.CSRGraph(num_nodes=graph.num_nodes, rowptr=graph.rowptr, col=graph.col,
                       value=graph.value, degree=graph.degree, symmetric=False, flow="in")
    with pytest.raises(ValueError, match="CSRGraph.flow"):
        hand.check()


def test_flow_in_repr_and_copies():
    layer = dk.FusedImplicitDiffusion(4, flow="target_to_source")
    assert layer.flow == "target_to_source"
    assert "flow='target_to_source'" in repr(layer)
    assert copy.deepcopy(layer).flow == "target_to_source"
    assert "flow='source_to_target'" in repr(dk.FusedImplicitDiffusion(4))
    # a layer pickled before the argument existed has no flow of its own: PyG's default
    del layer.__dict__["flow"]
    assert layer.flow == "source_to_target"


# -------------------------------------------------------------- partitioned solve --

@pytest.mark.parametrize("laplacian", ["neural", "rw"])
def test_partitioned_solve_follows_the_flow(world_of_one, tmp_path, laplacian):
    x, ei, w = directed(True)
    layer = layer_for(laplacian, "target_to_source", **EXACT)
    part = partition(ei, x.size(0), 1, edge_weight=w, flow="target_to_source")
    assert part.flow == "target_to_source" and "target_to_source" in repr(part)
    part.save(tmp_path / "graph.part")
    loaded = GraphPartition.load(tmp_path / "graph.part")
    assert loaded.flow == "target_to_source"
    graph = DistributedGraph(loaded)
    xr = x.clone().requires_grad_()
    z = layer(xr[graph.owned], graph)
    z_full, grads_full = solve(layer, x, ei, w, torch.ones_like(x))
    assert rel_err(z, z_full[graph.owned]) < 1e-12
    grads = torch.autograd.grad(z.sum(), [xr] + list(thetas(layer).values()))
    for a, b in zip(grads, grads_full):
        assert rel_err(a, b) < 1e-10
    # a partition of the other flow is refused by the layer, and a CSRGraph of another flow
    # by partition
    with pytest.raises(ValueError, match="partition was built with flow='source_to_target'"):
        layer(x, DistributedGraph(partition(ei, x.size(0), 1, edge_weight=w)))
    with pytest.raises(ValueError, match="built with flow='source_to_target'"):
        partition(dk.build_graph(ei, x.size(0), w), x.size(0), 1, flow="target_to_source")


# ------------------------------------------------------------------- dignn models --

def test_node_classifier_flow_is_the_flipped_graph():
    """flow="target_to_source" on edge_index: the default model on edge_index.flip(0), the
    implicit layer and the adj input unit's A X alike."""
    from dignn import DIGNNNodeClassifier, DIGNNGraphClassifier
    from dignn.models import adjacency_matrix
    x, ei, _ = directed(False)
    n = x.size(0)
    assert torch.equal(adjacency_matrix(ei, n, flow="target_to_source").to_dense(),
                       adjacency_matrix(ei.flip(0), n).to_dense())
    torch.manual_seed(0)
    models = {flow: DIGNNNodeClassifier(4, 6, 3, input_unit="adj", flow=flow,
                                        max_iter=200, tol=1e-12).double().eval()
              for flow in FLOWS}
    models[FLOWS[1]].load_state_dict(models[FLOWS[0]].state_dict())
    assert models[FLOWS[1]].diffusion.flow == FLOWS[1]
    out = models[FLOWS[1]](x, ei)
    assert torch.allclose(out, models[FLOWS[0]](x, ei.flip(0)), rtol=0, atol=1e-12)
    assert not torch.allclose(out, models[FLOWS[0]](x, ei), rtol=0, atol=1e-4)
    graph_model = DIGNNGraphClassifier(4, 6, 3, flow="target_to_source")
    assert graph_model.diffusion.flow == "target_to_source"
    with pytest.raises(ValueError, match="flow must be"):
        DIGNNNodeClassifier(4, 6, 3, flow="both")
