"""GPU speed and memory of one training step of the implicit layer; skipped without
a GPU.

Graphs: cornell5 (real, 18,660 nodes, 1,581,554 directed edges; from DIGNN_DATA), the
Penn94-shaped synthetic graph (41,554 nodes, 1,362,229 undirected edges, power-law degrees,
``synthetic.penn94_like_graph``), the same with a heavier tail (exponent 2.1: hubs of ~2,700
neighbours) and a uniform graph of the same size (``synthetic.uniform_graph``), the control of
the degree-skew comparison. h = d = 64, 10 forward + 10 adjoint iterations (tol = 0), forward +
backward of FusedImplicitDiffusion, float32, side by side in one run:

- ``cuda``: the CUDA kernels (backend="cuda");
- ``triton``: the Triton kernels (backend="triton"; skipped where they are not available);
- ``torch``: the plain-PyTorch composition (backend="torch": edge weights once from m x h
  gathers, torch.sparse CSR (cuSPARSE) products, adjoint iterations);
- ``reference``: the paper's algorithm as written (dignn_kernels.reference), measured on the
  two goal graphs (cornell5, Penn94-shaped) only.

test_storage_dtype_step times the same step on a random graph of ogbn-products' size (2,449,029
nodes, 123,718,280 CSR entries, ids in random order) on the CUDA and the Triton backends,
float32 against ``storage_dtype=torch.bfloat16`` (16-bit iterates and adjoints, float32 sums)
side by side; the goal is a 1.5x faster step.

Per run: ms per step (median wall time of the rounds, each ending in torch.cuda.synchronize),
edge sweeps per second (20 iterations x m CSR entries per step), achieved GB/s under the byte
model below, and the peak GPU memory of one step (torch.cuda.max_memory_allocated after a reset;
"growth" is that peak minus what was allocated before the step: graph, features, parameters).
test_cached_iteration measures the device's device-to-device copy bandwidth, the cached-
weight iteration alone and the gather floor on the same graph and features (a kernel that only
gathers the neighbour rows, bench/layer/gather_floor.py; goal: the iteration within 1.3x of it);
test_cached_sweep_storage times one cached row pass per backend with float32 and bfloat16
iterates, each beside the gather floor in its dtype (goal: cuda at most triton's time);
test_triton_row_step times the triton step with the backend's row step (the solvers' fixed
point takes its norms from the sweep) against the same loop on its row pass alone;
test_captured_step times the step replayed from a CUDA graph beside the eager step (what the
host's launches cost); test_kernel_times profiles the training step above (cornell5 and the Penn94-shaped graph, cuda
and triton backends) with torch.profiler and sums the device time and the launches per kernel
role (bench/layer/kernel_times.py: cached row pass, neural row pass, gradient pass, heavy-row combine,
step bookkeeping, dense aten work, other); the goal: the CUDA backend at least as fast as the
Triton one on the three passes. Goals of the step: the Penn94-shaped step in at most 3.0 ms
(the faster backend), each backend at least 10x faster than the plain composition; against the
authors' layer (120x) and torchdeq's DEQ (10x), the ratios of the peers phase's one run
(bench/peers/peers.py, its record in $DIGNN_PEERS_JSON; see PEER_GOALS).
test_summary states every goal and by how much it is met or missed, prints it and writes it to $DIGNN_BENCH_SUMMARY (if set).

Byte model (float32 values, int32 columns, int64 row pointers; n nodes, m CSR entries,
d = h = 64 channels), what the fused passes must move between memory and the SMs:
- cached iteration: rowptr 8n + per entry (col 4 + weight 4 + neighbour row 4d) + per row
  (b_i, y_i read, out_i written: 12d, cy_i and rs_i: 8);
- neural fused iteration: per entry (col 4 + a 4 + w written 4 + p_j, q_j 8h + z_j 4d) + per row
  (p_i, q_i 8h, x_i, z_i, out_i 12d, chi_i, kappa_i 8) + rowptr 8n;
- gradient pass (symmetric graph; directed ones add a pass on the transposed CSR): per entry
  (col 4 + a 4 + p_j, q_j 8h + v_j, z_j 8d) + per row (p_i, q_i, grad_p_i, grad_q_i 16h, v_i,
  z_i 8d) + rowptr 8n;
- a step: 1 neural + 8 cached forward iterations, 9 cached adjoint iterations, 1 gradient pass.
The "unique bytes" model of the cached iteration counts every array once (8n + 8m + 12nd + 8n):
the neighbour rows are gathered m times but mostly from the L2 cache (y is 10.6 MB on Penn94),
so the gather model can exceed the HBM copy bandwidth and the unique model stays far below it.

    DIGNN_DATA=<datasets> pytest bench/layer/test_gpu_speed.py --benchmark-json bench/results/gpu.json
"""
import json
import os
import statistics

import pytest
import torch

import dignn_kernels as dk
from dignn_kernels import synthetic
from conftest import (load_facebook100, reference_step, solvers_loop, state_goals, summary,
                      without)
from kernel_times import GOAL_ROLES, ROLES, profile_step

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

CHANNELS = 64
ITERS = 10
VARIANTS = ("cuda", "triton", "torch", "reference")
GRAPHS = ("cornell5", "penn94_like", "penn94_heavy", "uniform")
GOAL_GRAPHS = ("cornell5", "penn94_like")
ROUNDS = {"cuda": 20, "triton": 20, "torch": 5, "reference": 2}
SKEW_LIMIT = 1.5  # a power-law graph may cost at most this much more than a uniform one
PROFILED_STEPS = 5  # steps under the profiler per backend; times are per step

# ogbn-products' size: the 16-bit storage comparison (test_storage_dtype_step)
PRODUCTS_NODES, PRODUCTS_EDGES = synthetic.PRODUCTS_NODES, synthetic.PRODUCTS_EDGES
STORAGE_VARIANTS = ("float32", "bfloat16")
STORAGE_GOAL = 1.5  # the bfloat16-storage step at least this much faster than float32

RESULTS = {}  # (graph, variant) -> dict of measurements
STORAGE = {}  # (backend, storage variant) -> measurements on the products-sized graph
CACHED = {}  # graph -> cached-iteration measurements
KERNEL_TIMES = {}  # (graph, backend) -> kernel_times.profile_step's roles
_GRAPHS = {}


def device():
    return torch.device("cuda")


def load_graph(name):
    """(edge_index on the GPU, n, degree statistics), built once per run."""
    if name not in _GRAPHS:
        if name == "cornell5":
            ei, n = load_facebook100("cornell5")
        elif name == "penn94_like":
            ei, n = synthetic.penn94_like_graph(), synthetic.PENN94_NODES
        elif name == "penn94_heavy":
            ei, n = synthetic.penn94_like_graph(exponent=2.1), synthetic.PENN94_NODES
        else:
            ei, n = synthetic.uniform_graph(), synthetic.PENN94_NODES
        _GRAPHS[name] = (ei.to(device()), n, synthetic.degree_skew(ei, n))
    return _GRAPHS[name]


def step_bytes(n, m, d=CHANNELS, h=CHANNELS, directed=False):
    cached = 8 * n + m * (8 + 4 * d) + n * (12 * d + 8)
    neural = 8 * n + m * (12 + 8 * h + 4 * d) + n * (8 * h + 12 * d + 8)
    grad = 8 * n + m * (8 + 8 * h + 8 * d) + n * (16 * h + 8 * d)
    return neural + 17 * cached + (2 if directed else 1) * grad


def cached_bytes(n, m, d=CHANNELS):
    gather = 8 * n + m * (8 + 4 * d) + n * (12 * d + 8)
    unique = 8 * n + 8 * m + 12 * n * d + 8 * n
    return gather, unique


def make_layer():
    torch.manual_seed(0)
    return dk.FusedImplicitDiffusion(CHANNELS, mu=2.2, max_iter=ITERS, tol=0.0).to(device())


def make_step(variant, ei, x, layer):
    xr = x.clone().requires_grad_()
    if variant == "reference":
        return reference_step(layer, xr, ei, ITERS)
    layer.backend = variant

    def step():
        z = layer(xr, ei)
        z.square().sum().backward()
        xr.grad = None
        layer.zero_grad(set_to_none=True)
    return step


def peak_memory(step):
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    return peak - before, peak


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("graph_name", GRAPHS)
def test_training_step(benchmark, graph_name, variant):
    if variant == "triton" and "triton" not in dk.available_backends(device()):
        pytest.skip("the Triton backend is not available in this build")
    if variant == "reference" and graph_name not in GOAL_GRAPHS:
        pytest.skip("the reference algorithm is measured on the goal graphs only")
    ei, n, skew = load_graph(graph_name)
    torch.manual_seed(1)
    x = torch.randn(n, CHANNELS, device=device())
    layer = make_layer()
    step = make_step(variant, ei, x, layer)
    step()  # warm-up: graph preprocessing (cached), JIT compilation, allocator
    growth, peak = peak_memory(step)
    if variant != "reference":
        assert layer.backend_used == variant
    graph = dk.cached_graph(ei, n)
    m = graph.num_edges

    def timed():
        step()
        torch.cuda.synchronize()

    benchmark.pedantic(timed, rounds=ROUNDS[variant], iterations=1)
    seconds = benchmark.stats.stats.median
    gbytes = step_bytes(n, m, directed=not graph.symmetric) / 1e9
    info = dict(ms_per_step=seconds * 1e3, edge_sweeps_per_s=2 * ITERS * m / seconds,
                gb_per_s=gbytes / seconds, model_gb=gbytes, peak_growth_mb=growth / 2**20,
                peak_mb=peak / 2**20, nodes=n, csr_entries=m, degrees=skew,
                device=torch.cuda.get_device_name(), torch=torch.__version__)
    benchmark.extra_info.update(info)
    RESULTS[(graph_name, variant)] = info


def _event_ms(fn, repeat):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(repeat):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def copy_bandwidth():
    """Device-to-device copy of 1 GiB: bytes read + written per second."""
    src = torch.empty(2**28, device=device())
    dst = torch.empty_like(src)
    dst.copy_(src)
    ms = _event_ms(lambda: dst.copy_(src), 20)
    return 2 * src.numel() * 4 / (ms * 1e-3)


def gather_floor_ms(col, y):
    """ms of bench/layer/gather_floor.py's gather-only kernel on these columns and rows (None
    without Triton)."""
    try:
        from gather_floor import gather_neighbour_rows
    except ImportError:
        return None
    out = gather_neighbour_rows(col, y)
    return _event_ms(lambda: gather_neighbour_rows(col, y, out), 20)


@pytest.mark.parametrize("graph_name", ["penn94_like", "uniform", "cornell5"])
def test_cached_iteration(benchmark, graph_name):
    """One cached-weight iteration of the CUDA solve (row pass, heavy-row combine, device-side
    norm reduction), from the difference of solves of 1 + K and 1 iterations."""
    ei, n, _ = load_graph(graph_name)
    graph = dk.cached_graph(ei, n)
    w, chi, kappa = graph.fixed_laplacian("rw", torch.float32)
    torch.manual_seed(1)
    x = torch.randn(n, CHANNELS, device=device())
    k = 40

    def solve(iters):
        return torch.ops.dignn.implicit_diffusion(graph.rowptr, graph.col, w, x, chi, None, None,
                                                  kappa, 2.2, 1e-6, iters, 0.0)

    solve(1 + k)
    per_iter_ms = (_event_ms(lambda: solve(1 + k), 10) - _event_ms(lambda: solve(1), 10)) / k
    benchmark.pedantic(lambda: (solve(1 + k), torch.cuda.synchronize()), rounds=5, iterations=1)
    gather, unique = cached_bytes(n, graph.num_edges)
    bw = copy_bandwidth()
    floor_ms = gather_floor_ms(graph.col, x)
    info = dict(per_iteration_ms=per_iter_ms, gather_floor_ms=floor_ms,
                over_gather_floor=per_iter_ms / floor_ms if floor_ms else None, gather_gb_per_s=gather / (per_iter_ms * 1e-3) / 1e9,
                unique_gb_per_s=unique / (per_iter_ms * 1e-3) / 1e9, copy_gb_per_s=bw / 1e9,
                gather_fraction_of_copy=gather / (per_iter_ms * 1e-3) / bw,
                unique_fraction_of_copy=unique / (per_iter_ms * 1e-3) / bw)
    benchmark.extra_info.update(info)
    CACHED[graph_name] = info


SWEEPS = {}  # (graph, backend, storage variant) -> one cached sweep and its gather floor


@pytest.mark.parametrize("storage", STORAGE_VARIANTS)
@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("graph_name", GOAL_GRAPHS)
def test_cached_sweep_storage(benchmark, graph_name, backend, storage):
    """One cached row pass (dignn_kernels.ops.csr_fma: the sweep a solve with 16-bit storage
    repeats) with y in float32 or bfloat16, per backend, and the gather floor of the same rows
    in the same dtype (bench/layer/gather_floor.py): how much of 16-bit storage's gain each
    backend's kernel keeps, kernel by kernel."""
    if backend not in dk.available_backends(device()):
        pytest.skip(f"backend {backend!r} not available")
    from dignn_kernels import ops
    ei, n, _ = load_graph(graph_name)
    graph = dk.cached_graph(ei, n)
    w = graph.fixed_laplacian("rw", torch.float32)[0]
    torch.manual_seed(1)
    x = torch.randn(n, CHANNELS, device=device())
    y = x if storage == "float32" else x.to(getattr(torch, storage))
    cy, rs = torch.full((n,), -0.5, device=device()), torch.full((n,), 0.5, device=device())

    def sweep():
        return ops.csr_fma(graph.rowptr, graph.col, w, y, x, cy, rs, backend=backend,
                           trusted=True)

    assert sweep().dtype == y.dtype
    sweep_ms = _event_ms(sweep, 20)
    benchmark.pedantic(lambda: (sweep(), torch.cuda.synchronize()), rounds=5, iterations=1)
    floor_ms = gather_floor_ms(graph.col, y)
    info = dict(sweep_ms=sweep_ms, gather_floor_ms=floor_ms,
                over_gather_floor=sweep_ms / floor_ms if floor_ms else None)
    benchmark.extra_info.update(info)
    SWEEPS[(graph_name, backend, storage)] = info


CG_SWEEPS = {}  # (graph, backend) -> per-sweep ms of the fixed point and of cg


@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("graph_name", ["cornell5", "penn94_like"])
def test_cg_sweep_cost(benchmark, graph_name, backend):
    """The cost of one cg sweep (its row pass and its vector update, fused on a GPU:
    dignn_kernels.solvers.cg_update) against one fixed-point sweep, on the same backend and
    graph (rw weights, forward solve, tol = 0): each from the difference of solves of 50 and
    10 sweeps. Goal: cg at most 1.3x the fixed point. Where the backend has a row product
    (cg's sweep with its dots w.u), cg is also timed without it."""
    if backend not in dk.available_backends(device()):
        pytest.skip(f"backend {backend!r} not available")
    ei, n, _ = load_graph(graph_name)
    graph = dk.cached_graph(ei, n)
    w, chi, kappa = graph.fixed_laplacian("rw", torch.float32)
    torch.manual_seed(1)
    x = torch.randn(n, CHANNELS, device=device())

    def solve(solver, sweeps):
        # the fixed point counts Z_1 = X as an iteration (no sweep), cg counts sweeps
        iters = sweeps + 1 if solver == "fixed_point" else sweeps
        return dk.solvers.implicit_diffusion(
            graph.rowptr, graph.col, w, x, chi, kappa=kappa, mu=2.2, max_iter=iters, tol=0.0,
            solver=solver, backend=backend, check_every=0, host_checks=False,
            diag_index=graph.diagonal_index(), trusted=True)

    def sweep_ms(solver):
        solve(solver, 50)
        return (_event_ms(lambda: solve(solver, 50), 10)
                - _event_ms(lambda: solve(solver, 10), 10)) / 40

    per_sweep = {solver: sweep_ms(solver) for solver in ("fixed_point", "cg")}
    benchmark.pedantic(lambda: (solve("cg", 50), torch.cuda.synchronize()), rounds=3,
                       iterations=1)
    info = dict(fixed_point_sweep_ms=per_sweep["fixed_point"], cg_sweep_ms=per_sweep["cg"],
                cg_over_fixed_point=per_sweep["cg"] / per_sweep["fixed_point"])
    if dk.backends.get_backend(backend).row_product is not None:
        # the same cg on the row pass op and a separate dot product (what the product fuses)
        with without(backend, "row_product"):
            info["cg_row_pass_sweep_ms"] = sweep_ms("cg")
    benchmark.extra_info.update(info)
    CG_SWEEPS[(graph_name, backend)] = info


def products_sized_graph():
    """(edge_index, n): a uniform random symmetric graph of ogbn-products' size, ids in random
    order, drawn on the GPU (seeded, so the same graph on every run of one device type)."""
    if "products" not in _GRAPHS:
        n, num_edges = PRODUCTS_NODES, PRODUCTS_EDGES
        gen = torch.Generator(device=device()).manual_seed(0)
        draws = int(num_edges * 1.02) + 1000
        src = torch.randint(0, n, (draws,), generator=gen, device=device())
        dst = torch.randint(0, n, (draws,), generator=gen, device=device())
        keep = src != dst
        src, dst = src[keep], dst[keep]
        key = torch.unique(torch.minimum(src, dst) * n + torch.maximum(src, dst))
        assert key.numel() >= num_edges, "too few distinct pairs drawn"
        key = key[torch.randperm(key.numel(), generator=gen, device=device())[:num_edges]]
        lo, hi = key // n, key % n
        _GRAPHS["products"] = (torch.stack([torch.cat([lo, hi]), torch.cat([hi, lo])]), n,
                               None)
    return _GRAPHS["products"][:2]


@pytest.mark.cuda
@pytest.mark.parametrize("storage", STORAGE_VARIANTS)
@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_storage_dtype_step(benchmark, backend, storage):
    """One training step (forward + backward, h = d = 64, 10 + 10 iterations) on the
    products-sized graph, float32 storage against bfloat16 storage (cuda: both in its fused
    C++ loop; triton: the solvers' loop over its passes)."""
    if backend not in dk.available_backends(device()):
        pytest.skip(f"backend {backend!r} is not available in this build")
    ei, n = products_sized_graph()
    torch.manual_seed(1)
    x = torch.randn(n, CHANNELS, device=device())
    torch.manual_seed(0)
    storage_dtype = None if storage == "float32" else getattr(torch, storage)
    layer = dk.FusedImplicitDiffusion(CHANNELS, mu=2.2, max_iter=ITERS, tol=0.0,
                                      backend=backend, storage_dtype=storage_dtype
                                      ).to(device())
    step = make_step(backend, ei, x, layer)
    step()  # warm-up: graph preprocessing (cached), JIT compilation, allocator
    growth, peak = peak_memory(step)
    assert layer.backend_used == backend

    def timed():
        step()
        torch.cuda.synchronize()

    benchmark.pedantic(timed, rounds=5, iterations=1)
    info = dict(ms_per_step=benchmark.stats.stats.median * 1e3, peak_growth_mb=growth / 2**20,
                peak_mb=peak / 2**20, nodes=n, csr_entries=dk.cached_graph(ei, n).num_edges,
                storage=storage, backend=backend, device=torch.cuda.get_device_name(),
                torch=torch.__version__)
    benchmark.extra_info.update(info)
    STORAGE[(backend, storage)] = info


def _interleaved(benchmark, timed, variants, rounds):
    """Times ``timed(variant)`` for each variant, interleaved round by round (CUDA events,
    one warm-up each), and gives pytest-benchmark the first variant; returns
    {"<variant>_ms_per_step": median}."""
    times = {variant: [] for variant in variants}
    for variant in variants:
        timed(variant)  # warm-up
    for _ in range(rounds):
        for variant in variants:
            times[variant].append(_event_ms(lambda: timed(variant), 1))
    benchmark.pedantic(lambda: (timed(variants[0]), torch.cuda.synchronize()), rounds=3,
                       iterations=1)
    info = {f"{variant}_ms_per_step": statistics.median(t) for variant, t in times.items()}
    benchmark.extra_info.update(info, device=torch.cuda.get_device_name())
    return info


CAPTURED = {}  # (graph, backend) -> the step eager and replayed from a CUDA graph


@pytest.mark.cuda
@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("graph_name", GOAL_GRAPHS)
def test_captured_step(benchmark, graph_name, backend):
    """The training step of test_training_step (forward + backward, 10 + 10 iterations)
    captured once in a CUDA graph and replayed, against the same step run eagerly,
    interleaved: what the step costs without the host's launches and Python between the
    kernels (the solves never sync with the host, so the whole step captures; a user gets
    it with torch.cuda.graphs). Replays equal the eager step (tests/test_cuda.py)."""
    if backend not in dk.available_backends(device()):
        pytest.skip(f"backend {backend!r} is not available in this build")
    ei, n, _ = load_graph(graph_name)
    torch.manual_seed(1)
    x = torch.randn(n, CHANNELS, device=device(), requires_grad=True)
    layer = make_layer()
    layer.backend = backend

    def step():
        layer(x, ei).square().sum().backward()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: graph preprocessing, JIT, allocator
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    x.grad = None  # the gradients are then made in the graph's memory, which replays reuse
    layer.zero_grad(set_to_none=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    assert layer.backend_used == backend

    def timed(variant):
        # (the gradients are never reset: a replay writes to the addresses it captured, and
        # the eager step adds into the same tensors)
        if variant == "captured":
            graph.replay()
        else:
            step()

    CAPTURED[(graph_name, backend)] = _interleaved(benchmark, timed, ("captured", "eager"),
                                                   ROUNDS[backend])


FUSED16 = {}  # graph -> the cuda bf16 step in its fused loop and in the solvers' loop


@pytest.mark.cuda
@pytest.mark.parametrize("graph_name", GOAL_GRAPHS)
def test_storage_fused_loop(benchmark, graph_name):
    """The cuda backend's bfloat16-storage training step (h = d = 64, 10 + 10 iterations) in
    its fused C++ loop against the solvers' Python loop over the same passes (its fused loop
    taken away; the same results), interleaved: what running 16-bit solves in the fused loop
    saves on the GPU (launches, host work, the loop's norms and copies)."""
    if "cuda" not in dk.available_backends(device()):
        pytest.skip("backend 'cuda' is not available in this build")
    ei, n, _ = load_graph(graph_name)
    torch.manual_seed(1)
    x = torch.randn(n, CHANNELS, device=device())
    torch.manual_seed(0)
    layer = dk.FusedImplicitDiffusion(CHANNELS, mu=2.2, max_iter=ITERS, tol=0.0, backend="cuda",
                                      storage_dtype=torch.bfloat16).to(device())
    step = make_step("cuda", ei, x, layer)
    loops = ("fused", "solvers")

    def timed(loop):
        with solvers_loop("cuda", enabled=loop == "solvers"):
            step()

    FUSED16[graph_name] = _interleaved(benchmark, timed, loops, ROUNDS["cuda"])


ROW_STEP = {}  # graph -> the triton step with its row step and on its row pass alone


@pytest.mark.cuda
@pytest.mark.parametrize("graph_name", GOAL_GRAPHS + ("products",))
def test_triton_row_step(benchmark, graph_name):
    """The triton training step (float32, h = d = 64, 10 + 10 iterations; its solves run in
    the solvers' loop) with the backend's row step, whose sweeps take the norms of the
    stopping test and the certificate from their epilogue, their bookkeeping in one small
    kernel, and write nothing once done, against the same loop on the row pass alone, which
    reads each iterate again for those norms, keeps it with a torch.where per sweep (about
    8 n x d element reads and writes a sweep) and runs some twenty small torch ops a sweep;
    interleaved, the same results."""
    if "triton" not in dk.available_backends(device()):
        pytest.skip("backend 'triton' is not available in this build")
    ei, n = products_sized_graph() if graph_name == "products" else load_graph(graph_name)[:2]
    torch.manual_seed(1)
    x = torch.randn(n, CHANNELS, device=device())
    torch.manual_seed(0)
    layer = dk.FusedImplicitDiffusion(CHANNELS, mu=2.2, max_iter=ITERS, tol=0.0,
                                      backend="triton").to(device())
    step = make_step("triton", ei, x, layer)
    loops = ("row_step", "row_pass")

    def timed(loop):
        with without("triton", "row_step", enabled=loop == "row_pass"):
            step()

    ROW_STEP[graph_name] = _interleaved(benchmark, timed, loops,
                                        5 if graph_name == "products" else ROUNDS["triton"])


@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("graph_name", GOAL_GRAPHS)
def test_kernel_times(benchmark, graph_name, backend):
    """Device time and launches per kernel role of the training step of test_training_step,
    from torch.profiler (bench/layer/kernel_times.py), per step; the goal: CUDA at least as fast as
    Triton on every kernel (test_summary compares the roles)."""
    if backend not in dk.available_backends(device()):
        pytest.skip(f"backend {backend!r} not available")
    ei, n, _ = load_graph(graph_name)
    torch.manual_seed(1)
    x = torch.randn(n, CHANNELS, device=device())
    layer = make_layer()
    step = make_step(backend, ei, x, layer)
    roles = profile_step(step, PROFILED_STEPS)
    assert layer.backend_used == backend
    for role in GOAL_ROLES:  # the names of the backend's passes are known to kernel_role
        assert roles[role]["launches"] > 0, f"no {role} kernel of {backend} recognised"

    def timed():
        step()
        torch.cuda.synchronize()

    benchmark.pedantic(timed, rounds=1, iterations=1)
    benchmark.extra_info.update(
        roles=roles, busy_us_per_step=sum(r["us"] for r in roles.values()),
        launches_per_step=sum(r["launches"] for r in roles.values()),
        profiled_steps=PROFILED_STEPS, device=torch.cuda.get_device_name(),
        torch=torch.__version__)
    KERNEL_TIMES[(graph_name, backend)] = roles


def _ratio_line(goal, value, target, higher_is_better=True, unit="x"):
    ok = value >= target if higher_is_better else value <= target
    if higher_is_better:
        by = value / target
        verdict = f"met ({by:.2f}x the goal)" if ok else f"MISSED (reaches {by:.2f} of the goal)"
    else:
        by = target / value if value > 0 else float("inf")
        verdict = f"met ({by:.2f}x inside)" if ok else f"MISSED ({value / target:.2f}x over)"
    return ok, f"{goal}: {value:.2f}{unit} (goal {'>=' if higher_is_better else '<='} " \
               f"{target}{unit}) {verdict}"


# The step's goals on the two goal graphs, for the faster GPU backend (what "auto" should
# pick): its step at most STEP_GOAL_MS on the Penn94-shaped graph, at least COMPOSITION_GOAL x
# faster than the plain composition (cuSPARSE), and PEER_GOALS against the peers that
# bench/peers/peers.py measures side by side in one process (the authors' implicit layer, torchdeq's
# DEQ): those ratios are read from the peers phase's record of the same session
# ($DIGNN_PEERS_JSON, written by `bench/gpu/gpu_session.sh`'s peers phase before this one), each
# ratio between two steps of that one run, never between numbers of different runs.
# torchdeq's goal is the composition's: its DEQ runs on the same sparse product (cuSPARSE).
STEP_GOAL_MS = {"penn94_like": 3.0}
COMPOSITION_GOAL = 10
PEER_GOALS = {"authors": 120, "torchdeq": COMPOSITION_GOAL}


def peer_ratios(record, graph):
    """From a bench/peers/peers.py record: (best dignn peer, its ms, {peer family: (peer, ms)}) on
    ``graph``, each time the median of that run's rounds; None when this layer was not timed
    there. A family is ``authors`` or ``torchdeq`` (the faster of its solvers)."""
    timed = {r["peer"]: r["time"]["median_ms"] for r in record.get("results", [])
             if r.get("graph") == graph and r.get("status") == "ok"
             and (r.get("time") or {}).get("median_ms")}
    ours = {p: ms for p, ms in timed.items() if p.startswith("dignn-")}
    if not ours:
        return None
    best = min(ours, key=ours.get)
    families = {}
    for peer, ms in timed.items():
        family = "torchdeq" if peer.startswith("torchdeq-") else peer
        if family in PEER_GOALS and (family not in families or ms < families[family][1]):
            families[family] = (peer, ms)
    return best, ours[best], families


def _peer_lines(lines):
    """Goal checks against the peers measured in this session's peers phase; lines say which
    peer was absent and why, or that the phase did not run."""
    path = os.environ.get("DIGNN_PEERS_JSON")
    if not path or not os.path.exists(path):
        lines.append("peers (the authors' layer, torchdeq): not measured in this session (no "
                     "record of the peers phase); no ratio to them is stated")
        return []
    with open(path) as f:
        record = json.load(f)
    checks = []
    for g in GOAL_GRAPHS:
        found = peer_ratios(record, g)
        if found is None:
            lines.append(f"peers on {g}: this layer was not timed in the peers phase")
            continue
        best, ms, families = found
        for family, goal in PEER_GOALS.items():
            if family not in families:
                why = sorted({r["status"] for r in record["results"] if r.get("graph") == g
                              and (r["peer"] == family or r["peer"].startswith(family + "-"))})
                lines.append(f"peers on {g}: {family} not timed ({'; '.join(why) or 'not run'})")
                continue
            peer, peer_ms = families[family]
            checks.append(_ratio_line(
                f"{g} {best} ({ms:.2f} ms) vs {peer} ({peer_ms:.1f} ms), one peers run, speed",
                peer_ms / ms, goal))
    return checks


def _step_goal_lines(lines):
    """Goal checks of the step (see STEP_GOAL_MS); appends information lines to ``lines``:
    each backend's ratio to the composition and its step replayed from a CUDA graph."""
    checks = []
    for g in GOAL_GRAPHS:
        steps = {v: RESULTS[(g, v)]["ms_per_step"] for v in ("cuda", "triton")
                 if (g, v) in RESULTS}
        if not steps:
            continue
        composition = RESULTS.get((g, "torch"), {}).get("ms_per_step")
        for v, ms in steps.items():
            told = f": {composition / ms:.1f}x the composition" if composition else ""
            captured = CAPTURED.get((g, v))
            replay = (f"; replayed from a CUDA graph {captured['captured_ms_per_step']:.2f} ms "
                      f"(eager {captured['eager_ms_per_step']:.2f} ms in the same rounds)"
                      if captured else "")
            lines.append(f"{g} {v} step {ms:.2f} ms{told}{replay}")
        best = min(steps, key=steps.get)
        if g in STEP_GOAL_MS:
            checks.append(_ratio_line(f"{g} step, faster backend ({best})", steps[best],
                                      STEP_GOAL_MS[g], higher_is_better=False, unit=" ms"))
        if composition:
            checks.append(_ratio_line(f"{g} {best} (faster backend) vs plain composition "
                                      f"(cuSPARSE), speed", composition / steps[best],
                                      COMPOSITION_GOAL))
    return checks + _peer_lines(lines)


def _kernel_time_lines(graph_name):
    """The per-role table of test_kernel_times on one graph (cuda against triton, per step),
    and the goal checks: cuda <= triton on each pass of GOAL_ROLES."""
    cuda = KERNEL_TIMES[(graph_name, "cuda")]
    triton = KERNEL_TIMES.get((graph_name, "triton"))

    def us_and_launches(roles):
        """(us, launches) per role of ROLES, then their totals; None without the backend."""
        if roles is None:
            return [(None, None)] * (len(ROLES) + 1)
        pairs = [(roles[role]["us"], roles[role]["launches"]) for role in ROLES]
        return pairs + [tuple(map(sum, zip(*pairs)))]

    def cell(value):
        return "-" if value is None else f"{value:.0f}"

    lines = [f"kernel time per step on {graph_name} (torch.profiler, device us; launches):",
             f"  {'role':<22}{'cuda us':>10}{'triton us':>11}{'cuda/triton':>13}"
             f"{'cuda launches':>15}{'triton launches':>17}"]
    for name, (cuda_us, cuda_n), (triton_us, triton_n) in zip(
            ROLES + ("total kernel-busy",), us_and_launches(cuda), us_and_launches(triton)):
        ratio = f"{cuda_us / triton_us:.2f}" if triton_us else "-"
        lines.append(f"  {name:<22}{cell(cuda_us):>10}{cell(triton_us):>11}{ratio:>13}"
                     f"{cell(cuda_n):>15}{cell(triton_n):>17}")
    checks = [_ratio_line(f"{graph_name} {role}, cuda / triton device time per step "
                          f"(cuda <= triton)", cuda[role]["us"] / triton[role]["us"], 1.0,
                          higher_is_better=False)
              for role in GOAL_ROLES if triton and triton[role]["us"] > 0]
    return lines, checks


def test_summary():
    """Every goal, met or missed and by how much; fails if one is missed."""
    if ("penn94_like", "cuda") not in RESULTS:
        pytest.skip("run the whole file to compare the variants")
    state_goals(*_summary(), "DIGNN_BENCH_SUMMARY")


@summary("DIGNN_BENCH_SUMMARY")
def _summary():
    """(lines, checks) of every measurement so far (None before the first)."""
    if not any((RESULTS, CACHED, SWEEPS, CG_SWEEPS, STORAGE, CAPTURED, FUSED16, ROW_STEP,
                KERNEL_TIMES)):
        return None
    lines = [f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
             f"CUDA {torch.version.cuda}", ""]
    lines.append(f"{'graph':<13}{'variant':<10}{'ms/step':>10}{'Gsweeps/s':>11}{'GB/s':>9}"
                 f"{'peak MB':>10}{'growth MB':>11}")
    for (g, v), r in RESULTS.items():
        lines.append(f"{g:<13}{v:<10}{r['ms_per_step']:>10.2f}"
                     f"{r['edge_sweeps_per_s'] / 1e9:>11.2f}{r['gb_per_s']:>9.0f}"
                     f"{r['peak_mb']:>10.0f}{r['peak_growth_mb']:>11.0f}")
    lines.append("")
    checks = []
    for g in GOAL_GRAPHS:
        for v in ("cuda", "triton"):
            if (g, v) not in RESULTS:
                continue
            fast = RESULTS[(g, v)]
            if (g, "reference") in RESULTS:
                ref = RESULTS[(g, "reference")]
                checks.append(_ratio_line(f"{g} {v} vs reference, speed",
                                          ref["ms_per_step"] / fast["ms_per_step"], 40))
                checks.append(_ratio_line(
                    f"{g} {v} vs reference, peak memory growth (reference / {v})",
                    ref["peak_growth_mb"] / max(fast["peak_growth_mb"], 1e-9), 20))
            if (g, "torch") in RESULTS:
                checks.append(_ratio_line(f"{g} {v} vs composition, speed",
                                          RESULTS[(g, "torch")]["ms_per_step"]
                                          / fast["ms_per_step"], 5))
    checks += _step_goal_lines(lines)
    for heavy in ("penn94_like", "penn94_heavy"):
        for v in ("cuda", "triton"):
            if (heavy, v) in RESULTS and ("uniform", v) in RESULTS:
                ratio = RESULTS[(heavy, v)]["ms_per_step"] / RESULTS[("uniform", v)]["ms_per_step"]
                checks.append(_ratio_line(f"{heavy} vs uniform graph of the same size, {v} "
                                          f"(time ratio; no cliff)", ratio, SKEW_LIMIT,
                                          higher_is_better=False))
    for g, c in CACHED.items():
        lines.append(f"cached iteration on {g}: {c['per_iteration_ms'] * 1e3:.0f} us, "
                     f"{c['gather_gb_per_s']:.0f} GB/s gather model, {c['unique_gb_per_s']:.0f} "
                     f"GB/s unique model, copy bandwidth {c['copy_gb_per_s']:.0f} GB/s")
        checks.append(_ratio_line(f"{g} cached iteration, gather model, fraction of copy "
                                  f"bandwidth", c["gather_fraction_of_copy"], 0.5, unit=""))
        lines.append(f"  (unique-bytes model: {c['unique_fraction_of_copy']:.2f} of copy "
                     f"bandwidth; not a goal, see the module docstring)")
        if c["gather_floor_ms"]:
            lines.append(f"  gather floor (gather-only kernel): {c['gather_floor_ms'] * 1e3:.0f} us")
            checks.append(_ratio_line(f"{g} cached iteration over the gather floor",
                                      c["over_gather_floor"], 1.3, higher_is_better=False))
    for (g, b), c in CG_SWEEPS.items():
        on_pass = (f" (on the row pass and a dot kernel: {c['cg_row_pass_sweep_ms'] * 1e3:.0f} "
                   "us)" if "cg_row_pass_sweep_ms" in c else "")
        lines.append(f"{g} {b}: fixed-point sweep {c['fixed_point_sweep_ms'] * 1e3:.0f} us, "
                     f"cg sweep {c['cg_sweep_ms'] * 1e3:.0f} us{on_pass}")
        checks.append(_ratio_line(f"{g} {b} cg sweep over fixed-point sweep",
                                  c["cg_over_fixed_point"], 1.3, higher_is_better=False))
    for g in GOAL_GRAPHS:
        if (g, "cuda") in KERNEL_TIMES:
            table, kernel_checks = _kernel_time_lines(g)
            lines += table
            checks += kernel_checks
    for (g, b, v), c in SWEEPS.items():
        floor = f", gather floor {c['gather_floor_ms'] * 1e3:.0f} us" \
            if c["gather_floor_ms"] else ""
        lines.append(f"{g} {b} cached sweep, {v} iterates: {c['sweep_ms'] * 1e3:.0f} us{floor}")
    for g in GOAL_GRAPHS:
        for v in STORAGE_VARIANTS:
            if (g, "cuda", v) in SWEEPS and (g, "triton", v) in SWEEPS:
                checks.append(_ratio_line(
                    f"{g} cached sweep, {v} iterates, cuda over triton",
                    SWEEPS[(g, "cuda", v)]["sweep_ms"] / SWEEPS[(g, "triton", v)]["sweep_ms"],
                    1.0, higher_is_better=False))
    for g, c in FUSED16.items():
        lines.append(f"{g} cuda bfloat16 step: fused loop {c['fused_ms_per_step']:.2f} ms, "
                     f"solvers' loop {c['solvers_ms_per_step']:.2f} ms")
    for g, c in ROW_STEP.items():
        lines.append(f"{g} triton step: row step {c['row_step_ms_per_step']:.2f} ms, row pass "
                     f"alone {c['row_pass_ms_per_step']:.2f} ms")
    for b in ("cuda", "triton"):
        if not all((b, v) in STORAGE for v in STORAGE_VARIANTS):
            continue
        wide, narrow = STORAGE[(b, "float32")], STORAGE[(b, "bfloat16")]
        lines.append(f"products-sized graph, {b}: float32 {wide['ms_per_step']:.1f} ms "
                     f"(peak {wide['peak_mb']:.0f} MB), bfloat16 storage "
                     f"{narrow['ms_per_step']:.1f} ms (peak {narrow['peak_mb']:.0f} MB)")
        checks.append(_ratio_line(f"products-sized step, {b}, bfloat16 storage speed-up over "
                                  "float32", wide["ms_per_step"] / narrow["ms_per_step"],
                                  STORAGE_GOAL))
    return lines, checks
