"""FusedImplicitDiffusion against the dense float64 solve, gradcheck and the paper reference."""
import dataclasses

import pytest
import torch

import dignn_kernels as dk
from dignn_kernels import reference
from conftest import (GRAPH_KINDS, LAPLACIANS, gradcheck_layer, make_graph, make_layer, rel_err,
                      thetas)

CONVERGED = dict(max_iter=400, tol=1e-14)


def dense_z(layer, x, ei, w):
    z, _ = reference.dense_equilibrium(x, ei, w, laplacian=layer.laplacian, mu=layer.mu,
                                       eps=layer.eps, **thetas(layer))
    return z


@pytest.mark.parametrize("laplacian", LAPLACIANS)
@pytest.mark.parametrize("kind", GRAPH_KINDS)
def test_forward_matches_dense_solve(kind, laplacian):
    x, ei, w = make_graph(kind)
    layer = make_layer(x.size(1), laplacian, **CONVERGED)
    z = layer(x, ei, w)
    assert layer.iterations < CONVERGED["max_iter"], "the fixed point did not converge"
    assert torch.isfinite(z).all()
    assert rel_err(z, dense_z(layer, x, ei, w)) < 1e-10


@pytest.mark.parametrize("laplacian", ["neural", "rw", "sym"])
@pytest.mark.parametrize("kind", GRAPH_KINDS)
def test_gradcheck(kind, laplacian):
    x, ei, w = make_graph(kind, n=14, d=3)
    layer = make_layer(3, laplacian, h=3, **CONVERGED)
    assert gradcheck_layer(layer, kind, x, ei, w)


def test_gradcheck_unnormalized():
    x, ei, w = make_graph("weighted", n=14, d=3)
    layer = make_layer(3, "unnormalized", **CONVERGED)
    x.requires_grad_()
    assert torch.autograd.gradcheck(lambda x: layer(x, ei, w), (x,), eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("laplacian", LAPLACIANS)
@pytest.mark.parametrize("kind", ["symmetric", "directed", "weighted", "zero_rows"])
def test_float32_matches_float64(kind, laplacian):
    x, ei, w = make_graph(kind, n=40, d=8)
    layer = make_layer(8, laplacian, max_iter=60, tol=0.0)
    x.requires_grad_()
    z64 = layer(x, ei, w)
    g = torch.randn_like(z64)
    grads64 = torch.autograd.grad(z64, [x] + list(layer.parameters()), g)
    layer32 = make_layer(8, laplacian, max_iter=60, tol=0.0, dtype=torch.float32)
    x32 = x.detach().float().requires_grad_()
    z32 = layer32(x32, ei, w.float() if w is not None else None)
    grads32 = torch.autograd.grad(z32, [x32] + list(layer32.parameters()), g.float())
    assert z32.dtype == torch.float32
    assert rel_err(z32, z64) < 2e-6
    for a, b in zip(grads32, grads64):
        assert rel_err(a, b) < 2e-5


@pytest.mark.parametrize("laplacian", ["neural", "rw", "sym"])
@pytest.mark.parametrize("kind", ["symmetric", "directed", "duplicates", "isolated"])
def test_matches_paper_reference(kind, laplacian):
    """Same iterates as the paper's algorithm (max_iter iterations from Z_0 = 0), and the same
    implicit gradients once both have converged."""
    x, ei, w = make_graph(kind, n=30, d=6, dtype=torch.float64)
    layer = make_layer(6, laplacian, max_iter=10, tol=0.0)
    x.requires_grad_()
    z = layer(x, ei, w)
    z_ref = reference.reference_implicit_diffusion(x, ei, w, laplacian=laplacian, mu=layer.mu,
                                                   max_iter=10, tol=0.0, **thetas(layer))
    assert rel_err(z, z_ref) < 1e-12
    layer.max_iter, layer.tol = 300, 1e-13
    params = [x] + list(layer.parameters())
    g = torch.randn_like(z)
    got = torch.autograd.grad(layer(x, ei, w), params, g)
    ref = reference.reference_implicit_diffusion(x, ei, w, laplacian=laplacian, mu=layer.mu,
                                                 max_iter=300, tol=1e-13, **thetas(layer))
    want = torch.autograd.grad(ref, params, g)
    for a, b in zip(got, want):
        assert rel_err(a, b) < 1e-9


@pytest.mark.parametrize("laplacian", LAPLACIANS)
@pytest.mark.parametrize("kind", ["symmetric", "directed", "zero_rows", "isolated"])
def test_torch_backend_agrees(kind, laplacian):
    x, ei, w = make_graph(kind, n=30, d=6)
    fused = make_layer(6, laplacian, max_iter=12, tol=0.0)
    plain = make_layer(6, laplacian, max_iter=12, tol=0.0, backend="torch")
    plain.load_state_dict(fused.state_dict())
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    za, zb = fused(xa, ei, w), plain(xb, ei, w)
    assert fused.backend_used == "cpu" and plain.backend_used == "torch"
    assert rel_err(za, zb) < 1e-12
    g = torch.randn_like(za)
    ga = torch.autograd.grad(za, [xa] + list(fused.parameters()), g)
    gb = torch.autograd.grad(zb, [xb] + list(plain.parameters()), g)
    for a, b in zip(ga, gb):
        assert rel_err(a, b) < 1e-10
    assert fused.backward_iterations == plain.backward_iterations == 12


def test_guard_zero_feature_rows_stay_finite():
    """All-zero feature rows give chi = 0; the guard keeps z_i = x_i with no NaN or Inf,
    forward and backward, in float32 at the paper's settings."""
    x, ei, _ = make_graph("zero_rows", n=50, d=8, dtype=torch.float32)
    x[7] = 0.0
    layer = dk.FusedImplicitDiffusion(8, mu=2.2)  # default init, not shrunk
    x.requires_grad_()
    z = layer(x, ei)
    assert torch.isfinite(z).all()
    zero = (x.detach() == 0).all(dim=1)
    assert zero.sum() >= 10
    assert torch.equal(z[zero], torch.zeros_like(z[zero]))
    z.square().sum().backward()
    assert torch.isfinite(x.grad).all()
    for p in layer.parameters():
        assert torch.isfinite(p.grad).all()


def test_isolated_nodes_keep_their_features():
    x, ei, _ = make_graph("isolated")
    for laplacian in LAPLACIANS:
        z = make_layer(x.size(1), laplacian)(x, ei)
        assert torch.equal(z[-4:], x[-4:])


def test_input_formats_agree():
    """edge_index, a torch sparse CSR / COO adjacency (PyG's adj_t: row = target) and
    non-contiguous tensors give one answer."""
    x, ei, w = make_graph("directed", n=30, d=6)
    layer = make_layer(6, max_iter=20)
    z = layer(x, ei, w)
    n = x.size(0)
    ones = torch.ones(ei.size(1), dtype=x.dtype)
    coo = torch.sparse_coo_tensor(ei.flip(0), ones, (n, n), check_invariants=True)
    assert rel_err(layer(x, coo), z) < 1e-14
    assert rel_err(layer(x, coo.to_sparse_csr()), z) < 1e-14
    x_nc = x.t().contiguous().t()
    ei_nc = torch.stack([ei[0], ei[1]], dim=1).t()
    assert not x_nc.is_contiguous() and not ei_nc.is_contiguous()
    assert rel_err(layer(x_nc, ei_nc), z) < 1e-14


def test_torch_sparse_sparsetensor_input():
    torch_sparse = pytest.importorskip("torch_sparse", reason="torch_sparse is optional")
    x, ei, _ = make_graph("directed", n=30, d=6)
    layer = make_layer(6, max_iter=20)
    n = x.size(0)
    adj_t = torch_sparse.SparseTensor(row=ei[1], col=ei[0], sparse_sizes=(n, n))
    assert rel_err(layer(x, adj_t), layer(x, ei)) < 1e-14


def test_low_precision_inputs():
    x, ei, _ = make_graph("symmetric", n=40, d=8, dtype=torch.float32)
    layer = make_layer(8, dtype=torch.float32, max_iter=20)
    z32 = layer(x, ei)
    for dt in (torch.float16, torch.bfloat16):
        z = layer(x.to(dt), ei)
        assert z.dtype == dt
        assert rel_err(z.float(), layer(x.to(dt).float(), ei)) < 1e-2
        assert rel_err(z.float(), z32) < 5e-2


def test_diagnostics_and_tolerance():
    x, ei, _ = make_graph("symmetric", n=40, d=8)
    layer = make_layer(8, "rw", mu=4.0, max_iter=500, tol=1e-6)
    assert layer.iterations is None
    x.requires_grad_()
    z = layer(x, ei)
    it = layer.iterations
    assert 2 < it < 500
    assert layer.relative_residual <= 1e-6 < reference_rel_at(layer, x, ei, it - 1)
    assert layer.residual == pytest.approx(layer.relative_residual * float(z.detach().norm()),
                                          rel=1e-9)
    assert layer.backward_iterations is None
    z.sum().backward()
    assert 2 < layer.backward_iterations < 500
    assert layer.backward_residual > 0


def reference_rel_at(layer, x, ei, iters):
    """Relative residual of the plain iteration after `iters` iterations."""
    probe = make_layer(x.size(1), layer.laplacian, mu=layer.mu, max_iter=iters, tol=0.0)
    probe(x.detach(), ei)
    return probe.relative_residual


def test_deterministic_bitwise():
    x, ei, w = make_graph("weighted", n=200, d=16, dtype=torch.float32)
    layer = make_layer(16, dtype=torch.float32)
    outs = []
    for threads in (1, 2, 2):
        torch.set_num_threads(threads)
        xr = x.clone().requires_grad_()
        z = layer(xr, ei, w)
        grads = torch.autograd.grad(z.square().sum(), [xr] + list(layer.parameters()))
        outs.append([z.detach()] + list(grads))
    for other in outs[1:]:
        for a, b in zip(outs[0], other):
            assert torch.equal(a, b)


def test_graph_preprocessing_is_cached():
    x, ei, w = make_graph("weighted")
    layer = make_layer(x.size(1))
    layer(x, ei, w)
    g1 = dk.cached_graph(ei, x.size(0), w)
    layer(x, ei, w)
    assert dk.cached_graph(ei, x.size(0), w) is g1
    w.mul_(2.0)  # an in-place change of the graph is noticed
    g2 = dk.cached_graph(ei, x.size(0), w)
    assert g2 is not g1 and torch.allclose(g2.value.sum(), 2 * g1.value.sum())


@pytest.mark.slow  # a subprocess or a compile: seconds; `-m "not slow"` leaves it out
def test_torch_compile():
    x, ei, w = make_graph("weighted", n=30, d=6, dtype=torch.float32)
    layer = make_layer(6, dtype=torch.float32, max_iter=15)
    want = layer(x, ei, w)
    compiled = torch.compile(layer)
    got = compiled(x, ei, w)
    assert rel_err(got, want) < 1e-6
    xr = x.clone().requires_grad_()
    compiled(xr, ei, w).sum().backward()
    xe = x.clone().requires_grad_()
    layer(xe, ei, w).sum().backward()
    assert rel_err(xr.grad, xe.grad) < 1e-5


def _capture_query_must_not_run():
    raise AssertionError("torch.cuda.is_current_stream_capturing was traced by Dynamo")


def test_host_reads_are_not_traced(monkeypatch):
    """Under torch.compile the host-read test answers False before it asks whether a CUDA
    graph is being captured (a query Dynamo cannot trace: fullgraph=True failed on CUDA).
    A stand-in CUDA tensor makes the CUDA branch reachable on the CPU."""
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing",
                        _capture_query_must_not_run)

    class OnCuda:
        is_cuda = True

    on_cuda = OnCuda()

    @torch.compile(fullgraph=True, backend="eager")
    def guarded(t):
        return t + 1 if dk.solvers.host_reads_allowed(on_cuda) else t

    assert torch.equal(guarded(torch.zeros(3)), torch.zeros(3))


def _compile_backends():
    return [b for b in ("cpu", "torch", "triton")
            if b in dk.available_backends(torch.device("cpu"))]


@pytest.mark.parametrize("solver", ["fixed_point", "cg"])
@pytest.mark.parametrize("backend", _compile_backends())
def test_torch_compile_fullgraph(monkeypatch, backend, solver):
    """torch.compile(layer, fullgraph=True), forward and backward, on every backend this
    machine runs, with a prebuilt CSRGraph (the graph cache lookup is not traced). The host
    checks are switched on and the capture query made to fail if it is ever traced."""
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing",
                        _capture_query_must_not_run)
    torch._dynamo.reset()
    x, ei, w = make_graph("weighted", n=30, d=6, dtype=torch.float32)
    graph = dk.build_graph(ei, x.size(0), w)
    layer = make_layer(6, dtype=torch.float32, max_iter=15, backend=backend, solver=solver,
                       sync_checks=True)
    xe = x.clone().requires_grad_()
    want = layer(xe, ei, w)
    want.square().sum().backward()
    compiled = torch.compile(layer, fullgraph=True)
    xc = x.clone().requires_grad_()
    got = compiled(xc, graph)
    got.square().sum().backward()
    assert layer.backend_used == backend
    assert rel_err(got, want) < 1e-5
    assert rel_err(xc.grad, xe.grad) < 1e-4
    for p in layer.parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all()


def test_prebuilt_graph_is_checked():
    x, ei, w = make_graph("weighted", n=30, d=6, dtype=torch.float32)
    layer = make_layer(6, dtype=torch.float32)
    graph = dk.build_graph(ei, x.size(0), w)
    with pytest.raises(ValueError, match="edge_weight goes into the CSRGraph"):
        layer(x, graph, w)
    with pytest.raises(ValueError, match="the CSRGraph has 30 nodes but x has 29 rows"):
        layer(x[:29], graph)
    assert torch.equal(layer(x, graph), layer(x, ei, w))


def test_sync_checks():
    """By default the CPU checks x for NaN (a read is free there); with sync_checks=False, as
    on a GPU by default, nothing is read back and the NaN shows in the output and stats."""
    x, ei, _ = make_graph("symmetric", n=20, d=4, dtype=torch.float32)
    x[3, 1] = float("nan")
    with pytest.raises(ValueError, match="x contains NaN or Inf"):
        make_layer(4, dtype=torch.float32)(x, ei)
    quiet = make_layer(4, dtype=torch.float32, sync_checks=False)
    z = quiet(x, ei)
    assert torch.isnan(z).any() and quiet.residual != quiet.residual  # NaN, not raised
    with pytest.raises(ValueError, match="sync_checks must be None, True or False"):
        dk.FusedImplicitDiffusion(4, sync_checks="yes")


def test_auto_backend_rule(monkeypatch):
    """On a GPU, auto takes the CUDA kernels below TRITON_MIN_ENTRIES CSR entries and Triton
    from there on (the H100 benchmark's crossover); the CPU always takes the C++ kernels."""
    registry = dk.backends._REGISTRY
    for name in ("cuda", "triton"):
        monkeypatch.setitem(registry, name, dataclasses.replace(
            registry[name], available=lambda device: device.type == "cuda"))
    gpu = torch.device("cuda", 0)
    small = dk.available_backends(gpu, dk.backends.TRITON_MIN_ENTRIES - 1)
    large = dk.available_backends(gpu, dk.backends.TRITON_MIN_ENTRIES)
    assert small == ("cuda", "triton", "torch") and large == ("triton", "cuda", "torch")
    assert dk.available_backends(gpu) == small
    assert dk.available_backends(torch.device("cpu"), 10 ** 9)[0] == "cpu"


def test_repr_and_parameters():
    layer = dk.FusedImplicitDiffusion(16, metric_channels=8)
    shapes = {k: tuple(v.shape) for k, v in layer.named_parameters()}
    assert shapes == {"theta_chi.weight": (8, 16), "theta_phi.weight": (8, 8),
                      "theta_varphi.weight": (8, 16)}
    assert "mu=2.2" in repr(layer)
    assert list(dk.FusedImplicitDiffusion(16, laplacian="rw").parameters()) == []


def test_blow_up_is_not_mistaken_for_convergence():
    """float32, mu far below lambda_max: the iterate overflows; the loop must stop and say
    the solve diverged, not report inf <= tol * inf as converged."""
    from dignn_kernels.solvers import DivergenceWarning
    x, ei, _ = make_graph("symmetric", n=40, d=8, dtype=torch.float32)
    layer = make_layer(8, "rw", mu=0.02, max_iter=400, tol=1e-6, dtype=torch.float32)
    with pytest.warns(DivergenceWarning, match="mu=0.02"):
        layer(x, ei)
    assert layer.iterations < 400
    assert not layer.relative_residual <= 1e-6
