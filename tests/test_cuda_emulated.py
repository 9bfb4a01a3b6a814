"""The CUDA kernels' logic, tested where there is no GPU.

The kernels and the host code of the CUDA ops (csrc/cuda/) are compiled a second time for the
host emulator of csrc/cuda/simt.cuh: every CUDA thread of a block an OS thread, warp shuffles
through per-group barriers, blocks one after another. That runs the same indexing, sub-warp
groups, channel vectors, heavy rows cut into segments and combined, fixed-order norm
reductions and device-side convergence flag as on a GPU, on CPU tensors, and compares every op
with the CPU kernels. What it cannot show (speed, memory-model subtleties, CUDA graphs) is in test_cuda.py.
"""
import dataclasses
import hashlib
import tempfile
from pathlib import Path

import pytest
import torch

import dignn_kernels as dk
from dignn_kernels import checks, ops, solvers
from dignn_kernels.backends import STORAGE_DTYPES, FusedSolve, compiled, get_backend
from backend_faces import face
from bad_graphs import N, OPS, all_cases, assert_raises_naming, first_line, inputs, strided
from conftest import GRAPH_KINDS, make_graph, make_layer, rel_err, thetas
from gpu_op_cases import (ROW_PRODUCT_CASES, check_against_cpu, check_fused_storage16,
                          check_row_product, check_row_product_errors,
                          check_row_product_of_nothing, check_scheduled_row_pass,
                          check_scheduled_row_pass_errors, check_storage16, graph_case)
from test_storage_dtype import check_fused_loop_equals_solvers_loop

ROOT = Path(__file__).resolve().parents[1]
CSRC = ROOT / "csrc"
EMULATION_SOURCE = ROOT / "tests" / "cuda_emulation" / "emulated_ops.cpp"


def _sources():
    """Every file the emulated build may include: the CUDA sources and the shared headers."""
    files = [f for folder in ("cuda", "dignn", "ops") for f in sorted((CSRC / folder).glob("*"))]
    return [f for f in files + [EMULATION_SOURCE] if f.is_file()]


@pytest.fixture(scope="module")
def emu():
    """The emulated ops, built once per version of the sources and of torch (torch's JIT cache
    only hashes the listed source, not the headers it includes, so the name carries a hash of
    all; and torch 2.11 waits for as long as a file named ``lock`` exists in the build folder,
    which torch 2.14.1 leaves there by design: a test run of torch 2.11 after one of 2.14.1 on
    the same machine hung in this build)."""
    from torch.utils.cpp_extension import load
    digest = hashlib.sha256(b"".join(f.read_bytes() for f in _sources())
                            + torch.__version__.encode()).hexdigest()[:12]
    name = f"dignn_emulated_{digest}"
    build = Path(tempfile.gettempdir()) / name
    build.mkdir(exist_ok=True)
    return load(name, [str(EMULATION_SOURCE)], extra_include_paths=[str(CSRC)],
                extra_cflags=["-O1"], build_directory=str(build))


def runner(emu):
    def run(name, *args):
        out = getattr(emu, name)(*args)
        return out if isinstance(out, tuple) else (out,)
    return run


@pytest.mark.parametrize("kind", GRAPH_KINDS)
def test_every_op_matches_cpu(emu, kind):
    check_against_cpu(runner(emu), graph_case(kind), context=kind)


@pytest.mark.parametrize("kind", ["symmetric", "directed", "zero_rows"])
def test_every_op_matches_cpu_float32(emu, kind):
    """float32 with 16-byte channel vectors (d, h multiples of 4)."""
    check_against_cpu(runner(emu), graph_case(kind, d=8, h=4, dtype=torch.float32),
                      context=kind)


@pytest.mark.parametrize("d,h,dtype", [
    (1, 1, torch.float64),      # groups of 4 lanes, mostly idle
    (64, 64, torch.float32),    # the benchmark's shape: float4, groups of 8
    (16, 128, torch.float32),   # group size set by h
    (300, 8, torch.float32),    # d spans two channel blocks of a 32-lane group
    (8, 300, torch.float32),    # h spans two channel blocks: edge scalars via scratch
    (70, 66, torch.float64),    # double: both wider than a block
    (6, 10, torch.float32),     # float32 that is not a multiple of 4: scalar channels
])
def test_channel_layouts(emu, d, h, dtype):
    check_against_cpu(runner(emu), graph_case("directed", n=30, d=d, h=h, dtype=dtype),
                      max_iter=4, context=f"d={d} h={h} {dtype}")


@pytest.mark.parametrize("kind", ["hub", "hub_in", "hub_out"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_heavy_rows(emu, kind, dtype):
    """Heavy rows (several segments, combined in order) in the CSR, the transposed
    CSR, or both."""
    n = 40
    assert n - 1 > 4 * emu.segment_edges  # the hub row is cut into 5 segments
    check_against_cpu(runner(emu), graph_case(kind, n=n, d=8, h=8, dtype=dtype),
                      max_iter=4, context=kind)


def test_int64_columns(emu):
    check_against_cpu(runner(emu), graph_case("hub_in", n=30, col_dtype=torch.int64),
                      max_iter=3)


def test_unaligned_rows_use_scalar_channels(emu):
    """A feature view 4 bytes past a 16-byte boundary cannot take float4 loads."""
    case = graph_case("symmetric", n=20, d=8, h=4, dtype=torch.float32)
    n = case.x.size(0)
    base = torch.randn(n * 8 + 1)
    x = base[1:].view(n, 8)
    assert x.data_ptr() % 16 != 0
    x.copy_(case.x)
    args = (case.rowptr, case.col, case.a, x, case.chi, case.p, case.q, None, 3.0, 1e-6, 2, 0.0,
            None, None, None, None)
    got = emu.implicit_diffusion(*args)
    want = torch.ops.dignn.implicit_diffusion(*args)
    for a, b in zip(got[:3], want[:3]):  # z, w, kappa
        assert rel_err(a, b) < 5e-6
    assert got[3][0] == want[3][0] == 2


@pytest.mark.parametrize("tol", [1e-3, 1e-9])
@pytest.mark.parametrize("kind", ["symmetric", "directed"])
def test_convergence_on_device(emu, kind, tol):
    """Steps after the device flag is set carry the result: same iterations, result and stats
    as the CPU solve, which stops there."""
    check_against_cpu(runner(emu), graph_case(kind), max_iter=40, tol=tol, context=kind)


@pytest.mark.parametrize("max_iter", [1, 2])
def test_short_solves(emu, max_iter):
    check_against_cpu(runner(emu), graph_case("hub", n=30, d=3, h=2), max_iter=max_iter)


def test_zero_features_converge_at_once(emu):
    """x = 0: converged after iteration 1 (0 <= tol^2 0), W and kappa still made."""
    case = graph_case("symmetric")
    x = torch.zeros_like(case.x)
    args = (case.rowptr, case.col, case.a, x, case.chi, case.p, case.q, None, 3.0, 1e-6, 6, 0.0)
    z, w, kappa, stats = emu.implicit_diffusion(*args, None, None, None, None)
    zc, wc, kc, sc = torch.ops.dignn.implicit_diffusion(*args)
    assert torch.equal(z, zc) and torch.equal(stats, sc) and stats[0] == 1
    assert rel_err(w, wc) < 1e-14 and rel_err(kappa, kc) < 1e-14


def test_repeatable_bitwise(emu):
    """No output depends on memory the kernels did not write (a second run, with the caching
    allocator handing out other buffers, gives the same bits)."""
    case = graph_case("hub", n=40, d=8, h=8, dtype=torch.float32)
    run = runner(emu)
    for name, args in case.calls(max_iter=4):
        first = run(name, *args)
        torch.randn(10_000)  # disturb the allocator
        second = run(name, *args)
        for a, b in zip(first, second):
            assert torch.equal(a, b), name


def test_argument_errors(emu):
    case = graph_case("symmetric")
    with pytest.raises(RuntimeError, match="mu must be > 0"):
        emu.implicit_diffusion(case.rowptr, case.col, case.a, case.x, case.chi, case.p, case.q,
                               None, 0.0, 1e-6, 5, 0.0, None, None, None, None)
    with pytest.raises(RuntimeError, match="t_rowptr, t_col and t_perm go together"):
        emu.neural_weight_grad(case.rowptr, case.col, case.a, case.p, case.q, case.z, case.v,
                               1e-6, case.rowptr, None, None)
    with pytest.raises(RuntimeError, match="q must have dtype"):
        emu.neural_edge_weights(case.rowptr, case.col, case.a, case.p, case.q.float(), 1e-6)


@pytest.mark.parametrize("kind,d,dtype", ROW_PRODUCT_CASES)
def test_row_product_is_the_row_pass_with_its_dots(emu, kind, d, dtype):
    check_row_product(emu, graph_case(kind, n=40, d=d, dtype=dtype), "cpu", exact=True,
                      context=f"{kind} d={d} {dtype}")


def test_row_product_with_int64_columns(emu):
    case = graph_case("hub", n=40, d=8, col_dtype=torch.int64)
    check_row_product(emu, case, "cpu", exact=True)
    product = compiled.prepared_row_product(emu)(case.rowptr, case.col, case.w, case.cy,
                                                 case.rs)
    assert product.args[1].dtype == torch.int32  # made int32 once, not in every sweep
    out = torch.empty_like(case.z)
    dots = product(case.z, out, torch.zeros(1, dtype=torch.float64))
    assert torch.equal(out, emu.csr_fma(case.rowptr, case.col, case.w, case.z,
                                        torch.zeros_like(case.z), case.cy, case.rs))
    assert torch.allclose(dots, (out * case.z).sum(0), rtol=1e-12)


def test_row_product_of_an_empty_graph_or_signal(emu):
    check_row_product_of_nothing(emu)


def test_row_product_argument_errors(emu):
    check_row_product_errors(emu, "cpu")


# The flag's read intervals (host loop and device flag, the same code at every width) on the
# two narrow cases; the wide one (the slowest in the emulator) reads it every 4 sweeps, with
# device-side no-op sweeps after convergence between reads.
@pytest.mark.parametrize("kind,laplacian,d,dtype,check_everys", [
    ("hub", "rw", 8, torch.float64, (1, 4, 0)),
    ("zero_rows", "sym", 5, torch.float64, (1, 4, 0)),
    ("isolated", "rw", 70, torch.float32, (4,))])
def test_cg_on_the_row_product(emu, kind, laplacian, d, dtype, check_everys):
    """cg on the emulated GPU row product (the compiled backend's, over the emulated ops)
    gives what cg on the CPU row pass and its own dot product gives: the same sweeps and
    flags, solutions and stats to summation order; forward and adjoint, from X = 0 too
    (done from the start: the product writes nothing), the flag read every 1, 4 or 0
    sweeps."""
    case = graph_case(kind, n=40, d=d, dtype=dtype)
    w, chi, kappa = case.graph.fixed_laplacian(laplacian, dtype)
    cpu = get_backend("cpu")
    on_product = dataclasses.replace(cpu, fused_solve=None,
                                     row_product=compiled.prepared_row_product(emu))
    systems = [solvers.EquilibriumSystem(backend, case.rowptr, case.col, w, chi, kappa, 2.2)
               for backend in (cpu, on_product)]
    value_tol = 1e-10 if dtype == torch.float64 else 1e-4
    for solve in (solvers.solve_forward, solvers.solve_adjoint):
        for rhs in (case.x, torch.zeros_like(case.x)):
            for check_every in check_everys:
                plain, got = (solve(system, rhs, "cg", max_iter=60, tol=1e-6,
                                    check_every=check_every) for system in systems)
                where = (solve.__name__, bool(rhs.any()), check_every)
                assert int(got.sweeps) == int(plain.sweeps), where
                assert bool(got.diverged) == bool(plain.diverged), where
                assert rel_err(got.solution, plain.solution) <= value_tol, where
                assert torch.allclose(got.stats(), plain.stats(), rtol=1e-3), where
                if not rhs.any():
                    assert int(got.sweeps) == 0 and not got.solution.any(), where


@pytest.mark.parametrize("kind,d,dtype", ROW_PRODUCT_CASES)
def test_row_pass_on_a_given_schedule(emu, kind, d, dtype):
    check_scheduled_row_pass(emu, graph_case(kind, n=40, d=d, dtype=dtype), "cpu",
                             context=f"{kind} d={d} {dtype}")


def test_row_pass_schedule_errors(emu):
    check_scheduled_row_pass_errors(emu, "cpu")


class _CountingOps:
    """The emulated ops, counting the schedules made and checking that every row pass is
    given one (with int32 columns, made once)."""

    def __init__(self, emu):
        self.emu, self.schedules, self.passes = emu, 0, 0

    def csr_schedule(self, rowptr, col):
        self.schedules += 1
        return self.emu.csr_schedule(rowptr, col)

    def csr_fma(self, rowptr, col, w, y, b, cy, rs, schedule=None):
        assert schedule is not None and col.dtype == torch.int32
        self.passes += 1
        return self.emu.csr_fma(rowptr, col, w, y, b, cy, rs, schedule)


SYMMETRIC_MAPS = [("hub", "neural", 8, torch.float64), ("zero_rows", "sym", 5, torch.float64)]


@pytest.mark.parametrize("solver,kind,laplacian,d,dtype", [
    *((solver, *case) for solver in ("anderson", "fixed_point", "cg") for case in SYMMETRIC_MAPS),
    *((solver, "directed", "rw", 6, torch.float32) for solver in ("anderson", "fixed_point")),
])
def test_solvers_on_the_row_map(emu, solver, kind, laplacian, d, dtype):
    """The solvers' loop on the compiled backend's row map over the emulated GPU ops (each
    sweep csr_fma on a schedule made once per map: one per solve, int64 columns made int32
    once) gives what it gives on the CPU row pass: the same sweeps and flags, solutions and
    stats to summation order; forward and adjoint (over W^T on the directed graph)."""
    case = graph_case(kind, n=40, d=d, dtype=dtype, col_dtype=torch.int64)
    if laplacian == "neural":
        w, chi, kappa = case.w, case.chi, case.kappa
    else:
        w, chi, kappa = case.graph.fixed_laplacian(laplacian, dtype)
    transposed = dict(zip(("t_rowptr", "t_col", "t_perm"), case.t_opt))
    cpu = dataclasses.replace(get_backend("cpu"), fused_solve=None)
    # float32 residuals near 2e-7 of ||X||: about 2 ulp of the iterate, which the sums' order
    # changes by a few percent (4% seen with anderson's compiled CPU record)
    value_tol, stats_tol = (1e-10, 1e-3) if dtype == torch.float64 else (1e-4, 1e-1)
    for solve in (solvers.solve_forward, solvers.solve_adjoint):
        counting = _CountingOps(emu)
        on_map = dataclasses.replace(cpu, row_map=compiled.prepared_row_map(counting))
        plain, got = (solve(solvers.EquilibriumSystem(backend, case.rowptr, case.col, w, chi,
                                                      kappa, 2.2, **transposed),
                            case.x, solver, max_iter=30, tol=1e-6, check_every=1)
                      for backend in (cpu, on_map))
        where = (solver, solve.__name__)
        assert int(got.sweeps) == int(plain.sweeps) > 1, where
        assert bool(got.diverged) == bool(plain.diverged), where
        assert rel_err(got.solution, plain.solution) <= value_tol, where
        assert torch.allclose(got.stats(), plain.stats(), rtol=stats_tol), where
        assert counting.schedules == 1 and counting.passes >= int(got.sweeps), where


STORAGE = [pytest.param(torch.bfloat16, id="bf16"), pytest.param(torch.float16, id="fp16")]


@pytest.mark.parametrize("storage_dtype", STORAGE)
@pytest.mark.parametrize("kind,n,d,h", [
    ("symmetric", 24, 8, 4),   # channel vectors of 4 (8-byte 16-bit loads), groups of 4
    ("directed", 24, 6, 3),    # scalar channels; the gradient pass over the transposed CSR
    ("zero_rows", 24, 4, 4),   # guarded rows
    ("hub", 40, 8, 8),         # heavy rows: partial sums and the combine kernels
    ("hub_out", 40, 300, 8),   # d spans two channel blocks of a 32-lane group
])
def test_16bit_storage(emu, kind, n, d, h, storage_dtype):
    """The CUDA kernels' 16-bit passes (y, out of the row pass; z, v of the gradient pass):
    bit for bit their float32 passes on the widened inputs, rounded like torch, and close to
    the CPU kernels' 16-bit passes (gpu_op_cases.check_storage16)."""
    check_storage16(runner(emu), graph_case(kind, n=n, d=d, h=h, dtype=torch.float32),
                    storage_dtype, context=f"{kind} d={d}")


@pytest.mark.parametrize("storage_dtype", STORAGE)
@pytest.mark.parametrize("kind,n,d,h", [
    ("symmetric", 24, 8, 4),
    ("directed", 24, 6, 3),    # the adjoint over the transposed CSR
    ("zero_rows", 24, 4, 4),
    ("hub", 40, 8, 8),         # heavy rows: the norms of the combine kernel
])
def test_fused_solves_with_16bit_storage(emu, kind, n, d, h, storage_dtype):
    """The fused forward and backward with 16-bit iterates on the emulated CUDA passes: the
    CPU kernels' iteration counts (early stops on the device flag included) and values to a
    16-bit rounding (gpu_op_cases.check_fused_storage16)."""
    check_fused_storage16(runner(emu), graph_case(kind, n=n, d=d, h=h, dtype=torch.float32),
                          storage_dtype, context=kind)


@pytest.mark.parametrize("storage_dtype", STORAGE)
@pytest.mark.parametrize("kind,laplacian_name", [("symmetric", "neural"), ("directed", "rw")])
def test_fused_16bit_loop_equals_solvers_loop(emu, monkeypatch, kind, laplacian_name,
                                              storage_dtype):
    """The emulated CUDA fused loop with 16-bit iterates against the solvers' loop over the
    emulated passes, bit for bit (tests/test_storage_dtype.py's check): its wide last
    iteration reads the stored 16-bit iterate into a float32 output (no widened copy), the
    solvers' loop runs the float32 pass on a widened copy."""
    emulated_cpu_backend(emu, monkeypatch)
    check_fused_loop_equals_solvers_loop(monkeypatch, "cpu", kind, laplacian_name,
                                         storage_dtype)


@pytest.mark.parametrize("storage_dtype", STORAGE)
def test_16bit_rows_not_8_byte_aligned(emu, storage_dtype):
    """16-bit rows 2 bytes past an 8-byte boundary cannot take 8-byte loads: scalar channels,
    the same bits from the row pass (each channel's sum in edge order either way), the
    gradients to the order of the sums over channels (pi_ij, rho_ij, dl/dW_ij)."""
    case = graph_case("hub", n=40, d=8, h=4, dtype=torch.float32)
    y = case.z.to(storage_dtype)
    base = torch.empty(y.numel() + 1, dtype=storage_dtype)
    shifted = base[1:].view_as(y)
    shifted.copy_(y)
    assert shifted.data_ptr() % 8 != 0
    args = (case.w, case.x, case.cy, case.rs)
    assert torch.equal(emu.csr_fma(case.rowptr, case.col, args[0], shifted, *args[1:]),
                       emu.csr_fma(case.rowptr, case.col, args[0], y, *args[1:]))
    grad = (case.rowptr, case.col, case.a, case.p, case.q)
    for got, want in zip(emu.neural_weight_grad(*grad, shifted, y, case.eps, None, None, None),
                         emu.neural_weight_grad(*grad, y, y, case.eps, None, None, None)):
        assert rel_err(got, want) <= 1e-6


@pytest.mark.parametrize("storage_dtype", STORAGE)
@pytest.mark.parametrize("tol", [0.0, 1e-2])
def test_layer_with_16bit_storage(emu, monkeypatch, storage_dtype, tol):
    """The layer with 16-bit iterates on the emulated CUDA host code and passes: the fused
    loop (device flag, wide last iteration) equal bit for bit to the solvers' loop over the
    same passes, with the same iteration counts; equal to its run on the CPU kernels to
    float32 summation order, within 1e-2 of float32 and not equal to it."""
    x, ei, _ = make_graph("directed", n=40, d=8, dtype=torch.float32)

    def run(storage):
        layer = make_layer(8, h=4, dtype=torch.float32, backend="cpu", storage_dtype=storage,
                           max_iter=40, tol=tol)
        xr = x.clone().requires_grad_()
        z = layer(xr, ei)
        (z * torch.linspace(-1.0, 1.0, z.numel()).view_as(z)).sum().backward()
        counts = (layer.iterations, layer.backward_iterations)
        return [z.detach(), xr.grad] + [t.grad for t in thetas(layer).values()], counts

    (cpu16, cpu_counts), (cpu32, _) = run(storage_dtype), run(None)
    emulated_cpu_backend(emu, monkeypatch)
    emulated16, counts = run(storage_dtype)
    monkeypatch.setitem(dk.backends._REGISTRY, "cpu", dataclasses.replace(
        get_backend("cpu"), fused_solve=None))
    loop16, loop_counts = run(storage_dtype)
    assert counts == loop_counts == cpu_counts
    assert (max(counts) < 40) == (tol > 0), counts
    for got, loop, same, wide in zip(emulated16, loop16, cpu16, cpu32):
        assert torch.equal(got, loop)
        assert rel_err(got, same) <= 1e-5
        assert 1e-7 < rel_err(got, wide) <= 1e-2


def emulated_cpu_backend(emu, monkeypatch):
    """The public face with the emulated GPU host code under it: the ops' Python face, the
    graph check and the compiled backend's passes and fused solve."""
    monkeypatch.setattr(ops, "_ops", emu)
    monkeypatch.setattr(checks, "_CHECK_OP", emu.check_graph)
    monkeypatch.setitem(dk.backends._REGISTRY, "cpu", dataclasses.replace(
        get_backend("cpu"), neural_edge_weights=emu.neural_edge_weights, csr_fma=emu.csr_fma,
        neural_weight_grad=emu.neural_weight_grad,
        fused_solve=FusedSolve(emu.implicit_diffusion, emu.implicit_diffusion_backward,
                               storage_dtypes=STORAGE_DTYPES)))
    return face("cpu")


@pytest.mark.parametrize("op,changes,regex", all_cases())
def test_bad_graphs(emu, monkeypatch, op, changes, regex):
    """Every bad graph through the Python face (dignn_kernels.ops) with the GPU host code
    under it: the device version of check_graph (conditions on the device, one flag read
    back) and the ops' shape checks. Each raises naming the argument, as on the CPU."""
    api = emulated_cpu_backend(emu, monkeypatch)
    assert_raises_naming(lambda: OPS[op][0](api, inputs().replace(**changes)), regex)


@pytest.mark.parametrize("op,changes,regex", all_cases())
def test_bad_graphs_direct(emu, op, changes, regex):
    """The emulated ops called directly: a graph whose shapes are wrong is refused by the op
    itself; one whose data are wrong by emu.check_graph, with the CPU op's message."""
    s = inputs().replace(**changes)
    if any(k in regex for k in ("entries for", "entries but")):
        args = {"implicit_diffusion": lambda s: (s.rowptr, s.col, s.a, s.x, s.chi, s.p, s.q, None,
                                                 3.0, 1e-6, 3, 0.0, s.t_rowptr, s.t_col,
                                                 s.t_perm, None)}
        if op in args:
            assert_raises_naming(lambda: emu.implicit_diffusion(*args[op](s)), regex)
            return
        monkey = type("Raw", (), {name: staticmethod(getattr(emu, name)) for name in OPS})
        assert_raises_naming(lambda: OPS[op][0](monkey, s), regex)
        return
    rp, cl = OPS[op][1]
    t = (s.t_rowptr, s.t_col, s.t_perm) if OPS[op][3] else (None, None, None)
    with pytest.raises(RuntimeError) as emulated:
        emu.check_graph(getattr(s, rp), getattr(s, cl), N, *t)
    with pytest.raises(RuntimeError) as cpu:
        torch.ops.dignn.check_graph(getattr(s, rp), getattr(s, cl), N, *t)
    assert first_line(emulated.value) == first_line(cpu.value)


@pytest.mark.parametrize("kind", GRAPH_KINDS + ["hub_in"])
def test_check_graph_accepts_valid_graphs(emu, kind):
    case = graph_case(kind)
    n = case.x.size(0)
    emu.check_graph(case.rowptr, case.col, n)
    emu.check_graph(case.rowptr, case.col.long(), n, *case.t)
    emu.check_graph(case.rowptr, case.col, n, case.t[0], case.t[1], case.t[2].int())


@pytest.mark.parametrize("op", list(OPS))
def test_strided_graph_tensors(emu, monkeypatch, op):
    """A CSR of strided views gives the CPU ops' results through the GPU host code."""
    s = strided(inputs())
    want = OPS[op][0](face("cpu"), s)
    got = OPS[op][0](emulated_cpu_backend(emu, monkeypatch), s)
    for a, b in zip(want if isinstance(want, tuple) else (want,),
                    got if isinstance(got, tuple) else (got,)):
        assert rel_err(b, a) < 1e-9, op
