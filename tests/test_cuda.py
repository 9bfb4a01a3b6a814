"""The CUDA kernels on a GPU (marker ``cuda``; skipped cleanly where torch sees no GPU).

Every op against the CPU kernels on every graph kind and channel layout, power-law graphs with
hub rows of thousands of neighbours, the layer against the dense float64 solve and gradcheck,
bitwise determinism, a training step captured in a CUDA graph and replayed, torch.compile,
solves that never synchronize with the host, and the chi = 0 guard. The kernels' logic is also
tested without a GPU by test_cuda_emulated.py.
"""
import copy

import pytest
import torch

import dignn_kernels as dk
from dignn_kernels import ops, reference, solvers, synthetic
from dignn_kernels.backends import get_backend
from conftest import GRAPH_KINDS, LAPLACIANS, make_graph, make_layer, rel_err, thetas
from gpu_op_cases import (ROW_PRODUCT_CASES, OpInputs, check_against_cpu, check_fused_storage16,
                          check_row_product, check_row_product_errors,
                          check_scheduled_row_pass, check_scheduled_row_pass_errors,
                          check_storage16,
                          graph_case)

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

DEV = torch.device("cuda")
CONVERGED = dict(max_iter=400, tol=1e-14)


def to_dev(*tensors):
    return [t.to(DEV) if isinstance(t, torch.Tensor) else t for t in tensors]


def cuda_run(name, *args):
    out = getattr(torch.ops.dignn, name)(*to_dev(*args))
    out = out if isinstance(out, tuple) else (out,)
    assert all(o.device.type == "cuda" for o in out), name
    return tuple(o.cpu() for o in out)


def power_law_with_hub(n=4000, m=40000, hub=17, hub_degree=3000, seed=0):
    """A Penn94-shaped (scaled down) graph plus one hub of `hub_degree` neighbours both ways."""
    ei = synthetic.penn94_like_graph(n, m, seed=seed)
    g = torch.Generator().manual_seed(seed)
    nbrs = torch.randperm(n, generator=g)[:hub_degree + 1]
    nbrs = nbrs[nbrs != hub][:hub_degree]
    spokes = torch.stack([nbrs, torch.full_like(nbrs, hub)])
    return torch.cat([ei, spokes, spokes.flip(0)], dim=1)


def test_cuda_kernels_were_built():
    """With a GPU present the CUDA kernels must be there (not silently absent)."""
    assert dk._build_info.WITH_CUDA, "reinstall with a CUDA toolkit (DIGNN_WITH_CUDA=1)"
    for name in ("neural_edge_weights", "implicit_diffusion", "implicit_diffusion_backward"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"dignn::{name}", "CUDA"), name


# ------------------------------------------------------------------ ops vs the CPU ops --

@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("kind", GRAPH_KINDS)
def test_every_op_matches_cpu(kind, dtype):
    check_against_cpu(cuda_run, graph_case(kind, dtype=dtype), context=kind)
    if dtype == torch.float32:  # 16-byte channel vectors
        check_against_cpu(cuda_run, graph_case(kind, d=8, h=8, dtype=dtype), context=kind)


@pytest.mark.parametrize("d,h,dtype", [
    (1, 1, torch.float64), (64, 64, torch.float32), (16, 128, torch.float32),
    (300, 8, torch.float32), (8, 300, torch.float32), (70, 66, torch.float64),
    (6, 10, torch.float32), (64, 64, torch.float64)])
def test_channel_layouts(d, h, dtype):
    check_against_cpu(cuda_run, graph_case("directed", n=60, d=d, h=h, dtype=dtype),
                      max_iter=5, context=f"d={d} h={h} {dtype}")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("kind", ["hub", "hub_in", "hub_out"])
def test_heavy_rows(kind, dtype):
    """A row of 599 neighbours is a heavy row of 5 segments, combined in order (CSR,
    transposed, both)."""
    check_against_cpu(cuda_run, graph_case(kind, n=600, d=8, h=8, dtype=dtype), max_iter=5,
                      context=kind)


@pytest.mark.parametrize("storage_dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("kind,n,d,h", [("symmetric", 40, 8, 4), ("directed", 40, 6, 3),
                                        ("hub", 600, 64, 64), ("hub_out", 600, 300, 8)])
def test_16bit_storage(kind, n, d, h, storage_dtype):
    """The 16-bit passes against the same kernels' float32 passes on the widened inputs (the row
    pass bit for bit, rounded on the device as torch rounds on the CPU) and against the CPU
    kernels' 16-bit passes (gpu_op_cases.check_storage16; nvcc may contract the gradient
    pass's products differently per instantiation: 1e-6 there)."""
    check_storage16(cuda_run, graph_case(kind, n=n, d=d, h=h, dtype=torch.float32),
                    storage_dtype, grad_tol=1e-6, context=f"{kind} d={d}")


@pytest.mark.parametrize("storage_dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("kind,n,d,h", [("symmetric", 40, 8, 4), ("directed", 40, 6, 3),
                                        ("hub", 600, 64, 64)])
def test_fused_solves_with_16bit_storage(kind, n, d, h, storage_dtype):
    """The fused forward and backward with 16-bit iterates: the CPU kernels' iteration counts
    (early stops on the device flag included) and values to a 16-bit rounding
    (gpu_op_cases.check_fused_storage16)."""
    check_fused_storage16(cuda_run, graph_case(kind, n=n, d=d, h=h, dtype=torch.float32),
                          storage_dtype, context=kind)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_power_law_graph_with_a_hub_of_thousands(dtype):
    ei = power_law_with_hub()
    case = OpInputs(ei, 4000, 16, 16, dtype)
    assert int((case.rowptr[1:] - case.rowptr[:-1]).max()) >= 3000
    check_against_cpu(cuda_run, case, max_iter=4, context="power law")


def test_int64_columns():
    check_against_cpu(cuda_run, graph_case("hub_in", n=300, col_dtype=torch.int64), max_iter=3)


@pytest.mark.parametrize("tol", [1e-3, 1e-9])
@pytest.mark.parametrize("kind", ["symmetric", "directed", "hub"])
def test_convergence_on_the_device(kind, tol):
    """Once the device flag is set the remaining steps carry the result: same iterations,
    iterate and stats as the CPU solve, which stops there."""
    n = 300 if kind == "hub" else 24
    check_against_cpu(cuda_run, graph_case(kind, n=n), max_iter=60, tol=tol, context=kind)


def test_unaligned_features():
    case = graph_case("symmetric", n=40, d=8, h=4, dtype=torch.float32)
    n = case.x.size(0)
    base = torch.randn(n * 8 + 1, device=DEV)
    x = base[1:].view(n, 8)
    assert x.data_ptr() % 16 != 0
    x.copy_(case.x)
    rp, cl, a, chi, p, q = to_dev(case.rowptr, case.col, case.a, case.chi, case.p, case.q)
    got = dk.implicit_diffusion(rp, cl, a, x, chi, p, q, mu=3.0, max_iter=2, tol=0.0)
    want = dk.implicit_diffusion(case.rowptr, case.col, case.a, case.x, case.chi, case.p,
                                 case.q, mu=3.0, max_iter=2, tol=0.0)
    assert rel_err(got[0].cpu(), want[0]) < 5e-6 and float(got[1][0]) == float(want[1][0]) == 2


@pytest.mark.parametrize("kind", ["symmetric", "directed"])
def test_opcheck(kind):
    case = graph_case(kind, n=30)
    c = {k: v.to(DEV) if isinstance(v, torch.Tensor) else v for k, v in vars(case).items()}
    t = to_dev(*case.t)
    req = lambda *ts: [u.clone().requires_grad_() for u in ts]  # noqa: E731
    samples = {
        "neural_edge_weights": [(c["rowptr"], c["col"], c["a"], *req(c["p"], c["q"]), 1e-6)],
        "neural_edge_weights_backward": [(c["rowptr"], c["col"], c["a"], c["p"], c["q"], 1e-6,
                                          c["grad_w"], *t)],
        "diffusion_step": [(c["rowptr"], c["col"], c["w"], c["chi"], c["kappa"], c["x"],
                            c["z"], 2.2)],
        "csr_fma": [(c["rowptr"], c["col"], c["w"], c["z"], c["x"], c["cy"], c["rs"]),
                    (c["rowptr"], c["col"], c["w"], c["z"], c["x"], c["cy"], c["rs"],
                     ops.csr_schedule(c["rowptr"], c["col"]))],
        "csr_schedule": [(c["rowptr"], c["col"])],
        "row_product": [(c["rowptr"], c["col"], c["w"], c["cy"], c["rs"],
                         ops.csr_schedule(c["rowptr"], c["col"]), c["z"],
                         torch.empty_like(c["z"]), torch.zeros(1, dtype=torch.float64,
                                                               device=DEV))],
        "neural_weight_grad": [(c["rowptr"], c["col"], c["a"], c["p"], c["q"], c["z"], c["v"],
                                1e-6, *t)],
        "implicit_diffusion": [(c["rowptr"], c["col"], c["a"], c["x"], c["chi"], c["p"],
                                c["q"], None, 3.0, 1e-6, 8, 1e-8, *t)],
        "implicit_diffusion_backward": [(c["rowptr"], c["col"], c["a"], c["w"], c["kappa"], *t,
                                         c["x"], c["chi"], c["p"], c["q"], c["z"], c["g"], 3.0,
                                         1e-6, 8, 1e-8)],
    }
    for name, args_list in samples.items():
        for args in args_list:
            torch.library.opcheck(getattr(torch.ops.dignn, name).default, args)
    # the one differentiable solve op: the fused CUDA loop and the solvers' cg loop
    for solver in ("fixed_point", "cg"):
        torch.library.opcheck(torch.ops.dignn.implicit_solve.default, (
            c["rowptr"], c["col"], c["a"], *req(c["x"], c["chi"], c["p"], c["q"]), None, *t,
            None, 3.0, 1e-6, 8, 1e-8, solver if solver == "fixed_point" else "anderson",
            "cuda", 0, 5))


def test_argument_errors():
    case = graph_case("symmetric")
    rp, cl, a, p, q = to_dev(case.rowptr, case.col, case.a, case.p, case.q)
    with pytest.raises(RuntimeError, match="is on cpu but the graph is on cuda"):
        ops.neural_edge_weights(rp, cl, a, case.p, q)
    x, chi = case.x.to(DEV), case.chi.to(DEV)
    for kwargs, match in [(dict(mu=0.0), "mu must be a finite number > 0"),
                          (dict(mu=float("nan")), "mu must be a finite number > 0"),
                          (dict(mu=2.0, max_iter=0), "max_iter must be an integer >= 1")]:
        with pytest.raises(ValueError, match=match):
            dk.implicit_diffusion(rp, cl, a, x, chi, p, q, **kwargs)
    with pytest.raises(RuntimeError, match="q must have dtype"):
        ops.neural_edge_weights(rp, cl, a, p, q.float())


@pytest.mark.parametrize("kind,d,dtype", ROW_PRODUCT_CASES)
def test_row_product_is_the_row_pass_with_its_dots(kind, d, dtype):
    check_row_product(torch.ops.dignn, graph_case(kind, n=300, d=d, dtype=dtype), DEV,
                      exact=False, context=f"{kind} d={d} {dtype}")


def test_row_product_argument_errors():
    check_row_product_errors(torch.ops.dignn, DEV)


@pytest.mark.parametrize("kind,d,dtype", ROW_PRODUCT_CASES)
def test_row_pass_on_a_given_schedule(kind, d, dtype):
    check_scheduled_row_pass(torch.ops.dignn, graph_case(kind, n=300, d=d, dtype=dtype), DEV,
                             context=f"{kind} d={d} {dtype}")


def test_row_pass_schedule_errors():
    check_scheduled_row_pass_errors(torch.ops.dignn, DEV)


def test_anderson_on_the_row_map():
    """anderson on the CUDA backend's row map (csr_fma on a schedule made once per map)
    against anderson on the CPU backend, forward and adjoint; its sweeps launch the
    schedule's counting kernel once per map, not once per sweep."""
    from torch.profiler import ProfilerActivity, profile
    ei = power_law_with_hub(n=2000, m=20000, hub_degree=1500)
    g = dk.build_graph(ei, 2000)
    w, chi, kappa = g.fixed_laplacian("rw", torch.float64)
    x = torch.randn(2000, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    cuda = get_backend("cuda")
    assert cuda.row_map is not None
    cpu_system = solvers.EquilibriumSystem(get_backend("cpu"), g.rowptr, g.col, w, chi, kappa,
                                           2.2)
    gpu_system = solvers.EquilibriumSystem(cuda, *to_dev(g.rowptr, g.col, w, chi, kappa), 2.2)
    for solve in (solvers.solve_forward, solvers.solve_adjoint):
        want = solve(cpu_system, x, "anderson", max_iter=60, tol=1e-10)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            got = solve(gpu_system, x.to(DEV), "anderson", max_iter=60, tol=1e-10)
            torch.cuda.synchronize()
        counts = [e.count for e in prof.key_averages() if "schedule_counts_kernel" in e.key]
        rows = [e.count for e in prof.key_averages() if "row_pass_kernel" in e.key]
        assert int(got.sweeps) > 5 and sum(rows) >= int(got.sweeps), solve
        assert sum(counts) == 1, (solve, counts)
        assert abs(int(got.sweeps) - int(want.sweeps)) <= 1, solve
        assert rel_err(got.solution.cpu(), want.solution) <= 1e-8, solve


@pytest.mark.parametrize("m", [1, 5, 16])
def test_anderson_kernels_compiled(m):
    """Anderson's vector work as compiled Triton kernels against the PyTorch ops on the GPU
    (test_anderson_update.py runs the same kernels in the interpreter)."""
    pytest.importorskip("triton")
    from dignn_kernels.solvers import _triton_anderson as kernels
    from dignn_kernels.solvers.anderson_update import (AndersonVectors, anderson_vectors_for,
                                                       torch_small_spd_solve)
    g = torch.Generator().manual_seed(m)
    f = torch.randn(300, m + 3, m, generator=g, dtype=torch.float64)
    a = (f.transpose(1, 2) @ f + torch.eye(m, dtype=torch.float64)).to(DEV)
    b = torch.randn(300, m, generator=g, dtype=torch.float64).to(DEV)
    assert "gamma" in vars(anderson_vectors_for(b, m))  # the gamma kernel
    torch.testing.assert_close(kernels.small_spd_solve(a, b), torch_small_spd_solve(a, b),
                               rtol=1e-11, atol=1e-12)
    vectors = AndersonVectors(b, m)
    gram, proj = a[:64].contiguous(), b[:64].t().contiguous()
    torch.testing.assert_close(kernels.anderson_gamma(gram, proj, vectors._reg, torch.float32),
                               vectors.gamma(gram, proj, torch.float32), rtol=1e-5, atol=1e-6)
    window = [torch.randn(m, 5000, 64, generator=g).to(DEV) for _ in range(2)]
    torch_window = [t.clone() for t in window]
    gy_new, y_new, f, gy = (torch.randn(5000, 64, generator=g).to(DEV) for _ in range(4))
    gamma = torch.randn(m, 64, generator=g).to(DEV)
    f_new, sums = kernels.window_record(gy_new, y_new, f, gy, *window, m - 1, m)
    want_f, want_sums = AndersonVectors(f, m).record(gy_new, y_new, f, gy, *torch_window, m - 1, m)
    assert torch.equal(f_new, want_f) and torch.equal(window[0], torch_window[0])
    torch.testing.assert_close(sums[0].sum(), want_sums[0].sum(), rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(sums[1:], want_sums[1:], rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(kernels.window_mix(gy, window[1], gamma, m),
                               AndersonVectors.mix(gy, window[1], gamma, m), rtol=1e-5, atol=1e-5)


def test_anderson_never_syncs():
    """anderson on the cuda backend (its row map, the Triton small solves) with the flag never
    read (check_every=0) launches every sweep without a synchronization, and stops where a
    solve that reads the flag stops."""
    case = graph_case("hub", n=400, d=8, dtype=torch.float32)
    w, chi, kappa = case.graph.fixed_laplacian("rw", torch.float32)
    system = solvers.EquilibriumSystem(get_backend("cuda"),
                                       *to_dev(case.rowptr, case.col, w, chi, kappa), 2.2)
    x = case.x.to(DEV)
    solvers.solve_forward(system, x, "anderson", max_iter=8, tol=0.0)  # caches, compiles
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        quiet = solvers.solve_forward(system, x, "anderson", max_iter=40, tol=1e-5,
                                      check_every=0)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    checked = solvers.solve_forward(system, x, "anderson", max_iter=40, tol=1e-5,
                                    check_every=4)
    assert int(quiet.sweeps) == int(checked.sweeps) < 40
    torch.testing.assert_close(quiet.solution, checked.solution)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_cg_on_the_row_product_matches_cpu(dtype):
    """cg on the CUDA backend (its row product) against cg on the CPU backend (the row pass
    and a separate dot product) on a power-law graph with a hub: the same sweeps (or one
    more or fewer: the dots are summed in another order), solutions to that order, forward
    and adjoint."""
    ei = power_law_with_hub(n=2000, m=20000, hub_degree=1500)
    g = dk.build_graph(ei, 2000)
    w, chi, kappa = g.fixed_laplacian("rw", dtype)
    x = torch.randn(2000, 16, dtype=dtype, generator=torch.Generator().manual_seed(0))
    cuda = get_backend("cuda")
    assert cuda.row_product is not None
    cpu_system = solvers.EquilibriumSystem(get_backend("cpu"), g.rowptr, g.col, w, chi, kappa,
                                           2.2)
    gpu_system = solvers.EquilibriumSystem(cuda, *to_dev(g.rowptr, g.col, w, chi, kappa), 2.2)
    assert gpu_system.spd_product() is not None
    tol = 1e-10 if dtype == torch.float64 else 1e-5
    for solve in (solvers.solve_forward, solvers.solve_adjoint):
        want = solve(cpu_system, x, "cg", max_iter=300, tol=tol)
        got = solve(gpu_system, x.to(DEV), "cg", max_iter=300, tol=tol, check_every=4)
        assert abs(int(got.sweeps) - int(want.sweeps)) <= 1, solve
        assert rel_err(got.solution.cpu(), want.solution) <= 100 * tol, solve


# --------------------------------------------------------------------------- the layer --

def cuda_layer(d, laplacian="neural", **kwargs):
    return make_layer(d, laplacian, backend="cuda", **kwargs).to(DEV)


@pytest.mark.parametrize("laplacian", LAPLACIANS)
@pytest.mark.parametrize("kind", GRAPH_KINDS)
def test_layer_matches_dense_solve(kind, laplacian):
    x, ei, w = make_graph(kind)
    layer = cuda_layer(x.size(1), laplacian, **CONVERGED)
    z = layer(*to_dev(x, ei, w))
    assert layer.backend_used == "cuda" and z.is_cuda
    assert layer.iterations < CONVERGED["max_iter"]
    want, _ = reference.dense_equilibrium(x, ei, w, laplacian=laplacian, mu=layer.mu,
                                          eps=layer.eps, **{k: v.cpu() for k, v in
                                                            thetas(layer).items()})
    assert rel_err(z.cpu(), want) < 1e-10


@pytest.mark.parametrize("laplacian", ["neural", "rw", "sym"])
@pytest.mark.parametrize("kind", ["symmetric", "directed", "isolated", "zero_rows", "duplicates"])
def test_layer_gradcheck(kind, laplacian):
    x, ei, w = make_graph(kind, n=14, d=3)
    layer = cuda_layer(3, laplacian, h=3, **CONVERGED)
    x, ei, w = to_dev(x, ei, w)
    x.requires_grad_(not (kind == "zero_rows" and laplacian == "neural"))
    params = list(layer.parameters())
    inputs = [x] + params if x.requires_grad else params

    def f(*args):
        return layer(x if not x.requires_grad else args[0], ei, w)

    assert torch.autograd.gradcheck(f, tuple(inputs), eps=1e-6, atol=1e-6, rtol=1e-5)


def training_step(layer, x, ei, w=None):
    xr = x.detach().clone().requires_grad_()
    z = layer(xr, ei, w)
    grads = torch.autograd.grad(z.square().sum(), [xr] + list(layer.parameters()))
    return [z.detach()] + list(grads)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_layer_matches_cpu_layer_on_a_power_law_graph(dtype):
    """Forward and backward of a training step (10 + 10 iterations) on a graph with a hub of
    3,000 neighbours: the CUDA kernels against the CPU kernels."""
    ei = power_law_with_hub()
    torch.manual_seed(0)
    x = torch.randn(4000, 16, dtype=dtype)
    layer = make_layer(16, h=16, max_iter=10, tol=0.0, dtype=dtype)
    want = training_step(layer, x, ei)
    got = training_step(copy.deepcopy(layer).to(DEV), x.to(DEV), ei.to(DEV))
    tol = 1e-11 if dtype == torch.float64 else 1e-4
    for a, b in zip(got, want):
        assert rel_err(a.cpu(), b) < tol


def test_layer_is_bitwise_deterministic():
    ei = power_law_with_hub().to(DEV)
    torch.manual_seed(0)
    x = torch.randn(4000, 64, device=DEV)
    layer = make_layer(64, h=64, max_iter=10, tol=0.0, dtype=torch.float32).to(DEV)
    runs = [training_step(layer, x, ei) for _ in range(3)]
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            assert torch.equal(a, b)


def test_solves_never_sync_with_the_host():
    """The forward and backward solves (with a tolerance, so the device flag is used) launch
    everything without one synchronization: torch raises on any sync in this mode."""
    case = graph_case("hub_in", n=400, d=8, h=8, dtype=torch.float32)
    c = {k: v.to(DEV) if isinstance(v, torch.Tensor) else v for k, v in vars(case).items()}
    t = to_dev(*case.t)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        z, w, kappa, stats = torch.ops.dignn.implicit_diffusion(
            c["rowptr"], c["col"], c["a"], c["x"], c["chi"], c["p"], c["q"], None, 3.0, 1e-6,
            30, 1e-5, *t)
        back = torch.ops.dignn.implicit_diffusion_backward(
            c["rowptr"], c["col"], c["a"], w, kappa, *t, c["x"], c["chi"], c["p"], c["q"], z,
            c["g"], 3.0, 1e-6, 30, 1e-5)
        fixed = torch.ops.dignn.implicit_diffusion(
            c["rowptr"], c["col"], c["w"], c["x"], c["chi"], None, None, None, 3.0, 1e-6, 30,
            1e-5)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert 1 < stats[0] < 30 and 1 < back[-1][0] < 30 and fixed[-1][0] >= 1


def test_cg_on_the_row_product_never_syncs():
    """cg on the cuda backend's row product (its schedule made once, each sweep one op) and
    the fused vector update: a solve that reads the flag never (check_every=0) launches
    everything without a synchronization, and one that reads it every 4 sweeps stops there."""
    case = graph_case("hub", n=400, d=8, dtype=torch.float32)
    w, chi, kappa = case.graph.fixed_laplacian("rw", torch.float32)
    system = solvers.EquilibriumSystem(get_backend("cuda"),
                                       *to_dev(case.rowptr, case.col, w, chi, kappa), 2.2)
    x = case.x.to(DEV)
    solvers.solve_forward(system, x, "cg", max_iter=3, tol=0.0)  # caches of the system
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        quiet = solvers.solve_forward(system, x, "cg", max_iter=40, tol=1e-5, check_every=0)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    checked = solvers.solve_forward(system, x, "cg", max_iter=40, tol=1e-5, check_every=4)
    assert int(quiet.sweeps) == int(checked.sweeps) < 40
    assert torch.equal(quiet.solution, checked.solution)


def test_cuda_graph_capture_of_a_training_step():
    """Forward and backward captured once, replayed on new features: the same result as eager
    (and the solve's stats are updated by the replay)."""
    ei = power_law_with_hub(n=2000, m=16000, hub_degree=1500).to(DEV)
    layer = make_layer(16, h=16, max_iter=10, tol=1e-5, dtype=torch.float32).to(DEV)
    x = torch.randn(2000, 16, device=DEV, requires_grad=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: graph preprocessing, allocator, cuBLAS
        for _ in range(3):
            x.grad = None
            layer.zero_grad(set_to_none=True)
            layer(x, ei).square().sum().backward()
    torch.cuda.current_stream().wait_stream(side)
    x.grad = None
    layer.zero_grad(set_to_none=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        z_static = layer(x, ei)
        z_static.square().sum().backward()
    for seed in (1, 2):
        torch.manual_seed(seed)
        new_x = torch.randn(2000, 16, device=DEV)
        with torch.no_grad():
            x.copy_(new_x)
        graph.replay()
        torch.cuda.synchronize()
        captured = [z_static.detach().clone(), x.grad.clone()] + [p.grad.clone() for p in
                                                                   layer.parameters()]
        iterations = layer.iterations
        eager_layer = copy.deepcopy(layer)
        want = training_step(eager_layer, new_x, ei)
        assert iterations == eager_layer.iterations
        for a, b in zip(captured, want):
            assert rel_err(a, b) < 1e-5


def test_torch_compile():
    x, ei, w = to_dev(*make_graph("weighted", n=60, d=8, dtype=torch.float32))
    layer = cuda_layer(8, dtype=torch.float32, max_iter=15)
    want = training_step(layer, x, ei, w)
    got = training_step(torch.compile(layer), x, ei, w)
    for a, b in zip(got, want):
        assert rel_err(a, b) < 1e-5


def test_chi_zero_guard():
    """All-zero feature rows (chi = 0) keep z_i = x_i = 0, forward and backward finite, at
    the paper's settings in float32."""
    x, ei, _ = make_graph("zero_rows", n=50, d=8, dtype=torch.float32)
    x[7] = 0.0
    torch.manual_seed(0)
    layer = dk.FusedImplicitDiffusion(8, mu=2.2).to(DEV)
    xd = x.to(DEV).requires_grad_()
    z = layer(xd, ei.to(DEV))
    assert torch.isfinite(z).all()
    zero = (x == 0).all(dim=1).to(DEV)
    assert int(zero.sum()) >= 10 and torch.equal(z[zero], torch.zeros_like(z[zero]))
    z.square().sum().backward()
    assert torch.isfinite(xd.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in layer.parameters())
    cpu_layer = copy.deepcopy(layer).cpu()
    assert rel_err(z.detach().cpu(), cpu_layer(x, ei)) < 1e-5


def test_auto_backend_and_low_precision_inputs():
    x, ei, _ = make_graph("symmetric", n=40, d=8, dtype=torch.float32)
    x, ei = to_dev(x, ei)
    layer = make_layer(8, dtype=torch.float32, max_iter=20).to(DEV)
    z32 = layer(x, ei)
    assert layer.backend == "auto" and layer.backend_used == "cuda"
    for dt in (torch.float16, torch.bfloat16):
        z = layer(x.to(dt), ei)
        assert z.dtype == dt and z.is_cuda
        assert rel_err(z.float(), z32) < 5e-2


def test_stats_match_cpu_layer():
    x, ei, _ = make_graph("symmetric", n=40, d=8)
    layer = make_layer(8, "rw", mu=4.0, max_iter=500, tol=1e-6)
    gpu = copy.deepcopy(layer).to(DEV)
    layer(x.requires_grad_(), ei).sum().backward()
    xd = x.detach().to(DEV).requires_grad_()
    gpu(xd, ei.to(DEV)).sum().backward()
    assert gpu.iterations == layer.iterations and gpu.backward_iterations == \
        layer.backward_iterations
    assert gpu.residual == pytest.approx(layer.residual, rel=1e-6)
