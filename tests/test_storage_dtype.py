"""16-bit storage of the solve (``storage_dtype``): the iterates of the fixed point and of its
adjoint in bfloat16 or float16, every sum in float32.

- the layer's Z and every gradient (x, the three Θ) within 1e-2 (relative, Frobenius) of the
  float32 run, on the plain-PyTorch backend, on the CPU kernels, on the CUDA kernels (a GPU,
  marker ``cuda``; without one tests/test_cuda_emulated.py runs them in the host emulator) and
  on the Triton kernels (in Triton's interpreter on the CPU, tests/conftest.py), on a symmetric
  graph, a directed one and one with guard rows (chi = 0), and yet different from it;
- storage really is 16-bit: the row pass is handed 16-bit iterates, and Z equals a dense
  reference that rounds each iterate to the storage dtype by hand;
- the Triton and CPU results equal the torch one to float32 accumulation order, pass by pass
  (heavy rows included) and for the whole layer; the compiled backends' fused C++ loop equals,
  bit for bit, the solvers' loop over the same passes (forward, adjoint, gradients, iteration
  counts, early stops included); the CPU row pass with 16-bit iterates equals,
  bit for bit, its float32 pass on the widened iterates with the output rounded by torch, in
  every instruction-set build (NaN, infinities, float16 overflow, subnormals, ties);
- bad values, a backend without 16-bit storage and other solvers raise ValueError naming
  storage_dtype; the compiled ops refuse 16-bit compute-dtype arguments naming them;
  storage_dtype=None is unchanged (the solve op still takes its old arguments);
- float16's range (largest 65504, smallest normal 2^-14): features, and incoming gradients,
  far above or below it are solved within float16's accuracy of float32 on the fused CPU
  loop, the solvers' loop and the Triton kernels (the solve scales its right-hand side by a
  power of two); a solve whose iterates still overflow float16 raises ValueError naming
  storage_dtype (before: NaN/Inf with a DivergenceWarning blaming mu, or silent NaN
  gradients).
"""
import dataclasses
import warnings

import pytest
import torch

import dignn_kernels as dk
from dignn_kernels import backends, laplacian, ops, reference
from dignn_kernels.backends import triton as tb
from conftest import make_graph, make_layer, rel_err, run_per_instruction_set, thetas

STORAGE = [pytest.param(torch.bfloat16, id="bf16"), pytest.param(torch.float16, id="fp16")]
KINDS = ["symmetric", "directed", "zero_rows"]  # zero_rows: x_i = 0 gives chi_i = 0, guarded
TOL = 1e-2  # the goal: relative error of Z and of every gradient against float32


_CUDA_ONLY = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.fixture(params=[pytest.param("cpu", id="interpreter"),
                        pytest.param("cuda", id="cuda", marks=_CUDA_ONLY)])
def triton_device(request):
    """Where the Triton kernels run: the CPU in Triton's interpreter (sessions without a GPU,
    tests/conftest.py), or the GPU (marker ``cuda``), as tests/test_triton.py does."""
    if request.param == "cpu" and not tb.available("cpu"):
        pytest.skip("the Triton kernels were compiled for the GPU in this session "
                    "(TRITON_INTERPRET unset); the cuda variant runs them")
    return request.param


def _run(kind, backend, storage_dtype, d=5, h=4, laplacian_name="neural", dtype=torch.float32,
         device="cpu", magnitude=None, grad_magnitude=1.0, **kwargs):
    """Z and the gradients of a fixed loss, for the layer on a small graph of ``kind`` (on
    ``device``; the results come back on the CPU); ``magnitude``: x scaled to that max|x|,
    ``grad_magnitude``: the incoming gradient's max|dl/dZ|."""
    x, ei, w = make_graph(kind, n=24, d=d, dtype=dtype)
    if magnitude is not None:
        x = x * (magnitude / x.abs().max())
    x, ei = x.to(device), ei.to(device)
    w = w.to(device) if w is not None else None
    layer = make_layer(d, laplacian=laplacian_name, h=h, dtype=dtype, backend=backend,
                       storage_dtype=storage_dtype, **kwargs).to(device)
    xr = x.clone().requires_grad_()
    z = layer(xr, ei, w)
    weight = torch.linspace(-1.0, 1.0, z.numel(), dtype=dtype, device=device).view_as(z)
    (z * weight * grad_magnitude).sum().backward()
    out = {"z": z.detach(), "x": xr.grad}
    out.update({name: t.grad for name, t in thetas(layer).items()})
    return {name: t.cpu() for name, t in out.items()}, layer


def _errors(run, ref):
    return {name: rel_err(run[name], ref[name]) for name in ref}


@pytest.mark.parametrize("storage_dtype", STORAGE)
@pytest.mark.parametrize("kind", KINDS)
def test_torch_backend_close_to_float32(kind, storage_dtype, one_thread):
    ref, _ = _run(kind, "torch", None)
    run, layer = _run(kind, "torch", storage_dtype)
    assert layer.backend_used == "torch"
    assert all(t.dtype == torch.float32 for t in run.values())  # the compute dtype comes back
    errors = _errors(run, ref)
    assert max(errors.values()) <= TOL, errors
    assert errors["z"] > 1e-7, errors  # 16-bit storage is not float32 storage


def _assert_close_to_float32_and_equal_to_torch(kind, backend, storage_dtype, device="cpu"):
    """The layer on ``backend`` with 16-bit iterates: within TOL of float32 (and not equal to
    it) and equal to the torch backend's 16-bit run up to float32 accumulation order."""
    ref, _ = _run(kind, "torch", None, device=device)
    torch16, _ = _run(kind, "torch", storage_dtype, device=device)
    run, layer = _run(kind, backend, storage_dtype, device=device)
    assert layer.backend_used == backend
    errors = _errors(run, ref)
    assert max(errors.values()) <= TOL, errors
    assert errors["z"] > 1e-7, errors
    same = _errors(run, torch16)
    assert max(same.values()) <= 1e-5, same


@pytest.mark.parametrize("storage_dtype", STORAGE)
@pytest.mark.parametrize("kind", KINDS)
def test_triton_close_to_float32_and_equal_to_torch(kind, storage_dtype, triton_device,
                                                     one_thread):
    """The Triton kernels with 16-bit iterates."""
    _assert_close_to_float32_and_equal_to_torch(kind, "triton", storage_dtype, triton_device)


@pytest.mark.parametrize("backend", ["cpu", pytest.param("cuda", marks=_CUDA_ONLY)])
@pytest.mark.parametrize("storage_dtype", STORAGE)
@pytest.mark.parametrize("kind", KINDS)
def test_compiled_kernels_close_to_float32_and_equal_to_torch(kind, storage_dtype, backend,
                                                              one_thread):
    """The compiled backends with 16-bit iterates (their fused loop, float32 x)."""
    _assert_close_to_float32_and_equal_to_torch(kind, backend, storage_dtype, device=backend)


@pytest.mark.parametrize("backend", ["torch", "cpu"])
@pytest.mark.parametrize("storage_dtype", STORAGE)
def test_fixed_laplacian_and_float64_compute(storage_dtype, backend, one_thread):
    """A fixed Laplacian (rw) in float32, and a float64 layer (the sums then run in float64)."""
    for dtype, lap in ((torch.float32, "rw"), (torch.float64, "neural")):
        ref, _ = _run("symmetric", "torch", None, laplacian_name=lap, dtype=dtype)
        run, _ = _run("symmetric", backend, storage_dtype, laplacian_name=lap, dtype=dtype)
        assert all(t.dtype == dtype for t in run.values())
        errors = _errors(run, ref)
        assert max(errors.values()) <= TOL and errors["z"] > 1e-9, (dtype, lap, errors)


def _spy_backend(monkeypatch, name):
    """Records the dtypes (y, b, output) of every row pass of backend ``name``, run by the
    solvers' loop (its fused loop, if any, is taken away: its passes are in C++)."""
    seen = []
    backend = backends.get_backend(name)

    def row_pass(rowptr, col, w, y, b, cy, rs):
        out = backend.csr_fma(rowptr, col, w, y, b, cy, rs)
        seen.append((y.dtype, b.dtype, w.dtype, out.dtype))
        return out

    monkeypatch.setitem(backends._REGISTRY, name,
                        dataclasses.replace(backend, csr_fma=row_pass, fused_solve=None))
    return seen


@pytest.mark.parametrize("backend", ["torch", "cpu"])
@pytest.mark.parametrize("storage_dtype", STORAGE)
def test_row_pass_sees_16bit_iterates(storage_dtype, backend, monkeypatch, one_thread):
    """Forward and adjoint in the solvers' loop: every sweep but the last reads and writes a
    16-bit iterate (the right-hand side x or g and the weights stay float32); the last one is
    taken wide. The compiled backends' fused loop runs the same sweeps
    (test_fused_loop_equals_solvers_loop)."""
    seen = _spy_backend(monkeypatch, backend)
    layer = make_layer(5, dtype=torch.float32, backend=backend, storage_dtype=storage_dtype,
                       max_iter=6, tol=0.0)
    x, ei, w = make_graph("directed", dtype=torch.float32)
    layer(x.requires_grad_(), ei, w).sum().backward()
    stored = (storage_dtype, torch.float32, torch.float32, storage_dtype)
    wide = (torch.float32,) * 4
    # 6 iterations: Z_1 = round(X), 4 stored sweeps, the wide last one; the same adjoint
    assert seen == ([stored] * 4 + [wide]) * 2, seen
    assert layer.iterations == 6 and layer.backward_iterations == 6


def _without_fused_loop(monkeypatch, name):
    """Backend ``name`` with its fused loop taken away: the solvers' loop over its passes."""
    monkeypatch.setitem(backends._REGISTRY, name, dataclasses.replace(
        backends.get_backend(name), fused_solve=None))


@pytest.mark.parametrize("backend", ["cpu", pytest.param("cuda", marks=_CUDA_ONLY)])
@pytest.mark.parametrize("storage_dtype", STORAGE)
@pytest.mark.parametrize("kind,laplacian_name", [("symmetric", "neural"), ("directed", "neural"),
                                                 ("zero_rows", "neural"), ("directed", "rw")])
def test_fused_loop_equals_solvers_loop(kind, laplacian_name, storage_dtype, backend,
                                        monkeypatch, one_thread):
    """The compiled backend's fused C++ loop with 16-bit iterates (csrc/ops/solve.h) runs the
    solvers' loop's iteration over the same passes: Z and every gradient equal bit for bit, the
    same iteration counts and residuals up to summation order, with a fixed number of
    iterations (tol = 0), with at most 2 (no stored sweep: Z_1 = round(X), then the wide
    last), and stopping early (the last iteration then follows the one that converged).
    The wide last iteration reads the stored iterate in 16 bits, the solvers' loop a widened
    copy of it: the same sums. tests/test_cuda_emulated.py runs this on the emulated CUDA
    passes."""
    check_fused_loop_equals_solvers_loop(monkeypatch, backend, kind, laplacian_name,
                                         storage_dtype)


def check_fused_loop_equals_solvers_loop(monkeypatch, backend, kind, laplacian_name,
                                         storage_dtype, device=None):
    """The check of :func:`test_fused_loop_equals_solvers_loop` for the registered backend
    ``backend`` (run on ``device``, default: the backend's name)."""
    device = backend if device is None else device
    for max_iter, tol in ((8, 0.0), (2, 0.0), (30, 2e-2)):
        runs = {}
        for loop in ("fused", "solvers"):
            with monkeypatch.context() as m:
                if loop == "solvers":
                    _without_fused_loop(m, backend)
                runs[loop] = _run(kind, backend, storage_dtype, laplacian_name=laplacian_name,
                                  device=device, max_iter=max_iter, tol=tol)
        (fused, f_layer), (solvers, s_layer) = runs["fused"], runs["solvers"]
        where = (max_iter, tol)
        for name in fused:
            assert torch.equal(fused[name], solvers[name]), (where, name)
        for attr in ("iterations", "backward_iterations"):
            assert getattr(f_layer, attr) == getattr(s_layer, attr), (where, attr)
        stopped_early = f_layer.iterations < max_iter and f_layer.backward_iterations < max_iter
        assert stopped_early == (tol > 0), (where, f_layer.iterations)
        if tol == 0:  # the last, wide iteration's residuals: one computation, two orders
            assert f_layer.iterations == max_iter
            for attr in ("residual", "relative_residual", "backward_residual",
                         "backward_relative_residual"):
                got, want = getattr(f_layer, attr), getattr(s_layer, attr)
                assert abs(got - want) <= 1e-5 * want, (where, attr, got, want)


def _dense_rounded_solve(x, ei, w, layer, storage_dtype, max_iter):
    """The fixed point written out densely from the paper's edge weights: Z_1 = round(X),
    Z_{k+1} = round(X + cy.Z_k + rs.(W Z_k)) up to iteration max_iter - 1, the last
    iteration unrounded (storage_dtype None: no rounding at all)."""
    i, j, wij, chi = reference.graph_neural_laplacian(x, ei, w, **thetas(layer))
    n = x.size(0)
    dense = torch.zeros(n, n, dtype=x.dtype).index_put_((i, j), wij, accumulate=True)
    cy, rs = laplacian.row_coefficients(chi, dense.sum(dim=1), layer.mu)

    def rounded(t):
        return t if storage_dtype is None else t.to(storage_dtype).to(x.dtype)

    z = rounded(x)
    for k in range(2, max_iter + 1):
        z = x + cy[:, None] * z + rs[:, None] * (dense @ z)
        if k < max_iter:
            z = rounded(z)
    return z


@pytest.mark.parametrize("backend", ["torch", "cpu"])
@pytest.mark.parametrize("storage_dtype", STORAGE)
def test_equals_dense_reference_with_explicit_rounding(storage_dtype, backend, one_thread):
    x, ei, w = make_graph("directed", dtype=torch.float32)
    layer = make_layer(5, dtype=torch.float32, backend=backend, storage_dtype=storage_dtype,
                       max_iter=10, tol=0.0)
    with torch.no_grad():
        z = layer(x, ei, w)
        rounded = _dense_rounded_solve(x, ei, w, layer, storage_dtype, 10)
        wide = _dense_rounded_solve(x, ei, w, layer, None, 10)
    assert rel_err(z, rounded) <= 1e-6
    assert rel_err(z, wide) >= 20 * max(rel_err(z, rounded), 1e-7)


# ------------------------------------------------------------------- the passes --

def _pass_inputs(storage_dtype, n=40, d=6, h=3, seed=0, device="cpu"):
    """A symmetric graph with a hub (its row is split into several segments when
    SEGMENT_EDGES is small) and 16-bit iterates y, z, v and projections p, q, on ``device``."""
    g = torch.Generator().manual_seed(seed)
    e = torch.randint(0, n, (2, 3 * n), generator=g)
    hub = torch.stack([torch.zeros(n - 1, dtype=torch.long), torch.arange(1, n)])
    e = torch.cat([e[:, e[0] != e[1]], hub], dim=1)
    graph = dk.build_graph(torch.cat([e, e.flip(0)], dim=1).to(device), n)
    a, _ = graph.values(torch.float32)
    m = graph.num_edges

    def r(*shape):
        return torch.randn(*shape, generator=g).to(device)

    return dict(graph=graph, a=a, w=r(m).abs(), y=r(n, d).to(storage_dtype), b=r(n, d),
                cy=r(n), rs=r(n), p=(0.5 * r(n, h)).to(storage_dtype),
                q=(0.5 * r(n, h)).to(storage_dtype), z=r(n, d).to(storage_dtype),
                v=r(n, d).to(storage_dtype))


def _assert_passes_match_torch(backend, t, storage_dtype):
    """Each pass of ``backend`` on the 16-bit inputs ``t`` (_pass_inputs) against the torch
    backend's: the row pass rounds its output to nearest like torch (equal up to one 16-bit
    ulp where the float32 sums differ in order, almost always identical), the edge weights and
    the gradients come back in float32, equal to summation order. Returns the row pass's
    output."""
    g = t["graph"]
    args = (g.rowptr, g.col)
    out = ops.csr_fma(*args, t["w"], t["y"], t["b"], t["cy"], t["rs"], backend=backend)
    out_r = ops.csr_fma(*args, t["w"], t["y"], t["b"], t["cy"], t["rs"], backend="torch")
    assert out.dtype == storage_dtype
    ulp = torch.finfo(storage_dtype).eps * out_r.float().abs().clamp_min(1e-3)
    assert bool(((out.float() - out_r.float()).abs() <= ulp).all())
    assert (out == out_r).float().mean() >= 0.95  # most entries round identically
    for pass_name, extra, tol in (("neural_edge_weights", (), 1e-6),
                                  ("neural_weight_grad", (t["z"], t["v"]), 1e-5)):
        run = getattr(ops, pass_name)
        got = run(*args, t["a"], t["p"], t["q"], *extra, backend=backend, trusted=True)
        want = run(*args, t["a"], t["p"], t["q"], *extra, backend="torch", trusted=True)
        for x, y in zip(got, want):
            assert x.dtype == torch.float32 and rel_err(x, y) <= tol, pass_name
    return out


@pytest.mark.parametrize("storage_dtype", STORAGE)
@pytest.mark.parametrize("segment_edges", [4, 64], ids=["heavy_rows", "whole_rows"])
def test_triton_passes_take_16bit(storage_dtype, segment_edges, triton_device, monkeypatch,
                                  one_thread):
    """Each Triton pass with 16-bit inputs against the torch pass (_assert_passes_match_torch),
    and the 16-bit output of the row pass exactly the rounding of its float32 output."""
    monkeypatch.setattr(tb, "SEGMENT_EDGES", segment_edges)
    t = _pass_inputs(storage_dtype, device=triton_device)
    out = _assert_passes_match_torch("triton", t, storage_dtype)
    g = t["graph"]
    wide = ops.csr_fma(g.rowptr, g.col, t["w"], t["y"].float(), t["b"], t["cy"], t["rs"],
                       backend="triton")
    assert wide.dtype == torch.float32 and torch.equal(out, wide.to(storage_dtype))


@pytest.mark.parametrize("storage_dtype", STORAGE)
@pytest.mark.parametrize("segment_edges", [4, 64], ids=["heavy_rows", "whole_rows"])
def test_triton_wide_last_iteration_reads_16bit(storage_dtype, segment_edges, triton_device,
                                                monkeypatch, one_thread):
    """The Triton backend's solves run their sweeps as row steps; the wide last iteration,
    forward and adjoint, is one call of the row map, which reads the stored 16-bit iterate and
    writes float32 (no widened copy of it), equal bit for bit to the map of the widened
    iterate, heavy rows included."""
    monkeypatch.setattr(tb, "SEGMENT_EDGES", segment_edges)
    backend = backends.get_backend("triton")
    seen = []

    def row_map(*graph):
        prepared = backend.row_map(*graph)

        def spied(y, b, out_dtype=None):
            out = prepared(y, b, out_dtype)
            seen.append((y.dtype, out.dtype))
            assert torch.equal(out, prepared(y.float(), b))
            return out
        return spied

    monkeypatch.setitem(backends._REGISTRY, "triton",
                        dataclasses.replace(backend, row_map=row_map))
    layer = make_layer(5, dtype=torch.float32, backend="triton", storage_dtype=storage_dtype,
                       max_iter=6, tol=0.0).to(triton_device)
    x, ei, w = make_graph("directed", dtype=torch.float32)
    x, ei = x.to(triton_device), ei.to(triton_device)
    w = w.to(triton_device) if w is not None else None
    z = layer(x.requires_grad_(), ei, w)
    z.sum().backward()
    assert z.dtype == torch.float32 and layer.iterations == 6
    assert seen == [(storage_dtype, torch.float32)] * 2, seen
    one_node = backend.row_map(*(t.to(triton_device) for t in (
        torch.tensor([0, 0]), torch.zeros(0, dtype=torch.long), torch.zeros(0), torch.zeros(1),
        torch.ones(1))))
    y, b = torch.zeros(1, 2, dtype=storage_dtype), torch.zeros(1, 2)
    with pytest.raises(ValueError, match="out_dtype must be"):
        one_node(y.to(triton_device), b.to(triton_device), torch.float64)


def test_triton_bfloat16_rounds_to_nearest_even(triton_device, one_thread):
    """The row pass's bfloat16 store rounds to nearest even, as torch (and the GPU) do, also
    in the interpreter (whose own conversion truncates)."""
    n = 8
    rowptr = torch.zeros(n + 1, dtype=torch.long)  # no edges: out = b + cy.y
    col = torch.zeros(0, dtype=torch.long)
    # float32 values just above, at and below the midpoints of bfloat16 neighbours
    base = torch.tensor([1.0, 1.0078125, -3.0, 0.15625, 100.0, -0.5, 7.0, 2.0 ** -20])
    step = torch.finfo(torch.bfloat16).eps * base.abs() / 2  # half a bfloat16 ulp
    b = torch.stack([base + step * 1.01, base + step, base + step * 0.99, base - step * 1.01],
                    dim=1)
    y = torch.zeros(n, 4, dtype=torch.bfloat16)
    zeros = torch.zeros(n)
    dev = triton_device
    out = ops.csr_fma(rowptr.to(dev), col.to(dev), torch.zeros(0, device=dev), y.to(dev),
                      b.to(dev), zeros.to(dev), zeros.to(dev), backend="triton")
    assert torch.equal(out.cpu(), b.to(torch.bfloat16))


# The CPU passes with 16-bit inputs against their float32 passes on the widened inputs: the
# kernels widen every load exactly and sum in the same order, so the row pass's output equals
# bit for bit the float32 output after torch's rounding (NaN, infinities, float16 overflow,
# subnormals, ties), the weights are equal and the gradients equal to FMA contraction. Run in
# a process per instruction-set build (DIGNN_CPU_ISA), as tests/test_ops.py does.
CPU_PASSES_SCRIPT = """
import torch
import dignn_kernels as dk
from dignn_kernels import ops
special = torch.tensor([float("nan"), float("inf"), -float("inf"), 3.4e38, 65504.0, 65520.0,
                        70000.0, 1.00390625, 1.01171875, 6e-8, 3e-8, -1.5e-5, 1e-40, 2.9e-39])
g = torch.Generator().manual_seed(0)
n = 50
e = torch.randint(0, n, (2, 8 * n), generator=g)
graph = dk.build_graph(torch.cat([e, e.flip(0)], dim=1), n)
rowptr, col, m = graph.rowptr, graph.col, graph.num_edges
a, _ = graph.values(torch.float32)
directed = dk.build_graph(e, n)  # its gradient pass also walks the transposed CSR


def same_bits(x, y):
    return bool(((x.view(torch.int16) == y.view(torch.int16)) | (x.isnan() & y.isnan())).all())


checked = 0
for sd in (torch.bfloat16, torch.float16):
    for d in (3, 16, 21, 64, 130):  # vector tails, whole blocks, several blocks
        r = lambda *s: torch.randn(*s, generator=g)
        y, z, v = (r(n, d).to(sd) for _ in range(3))
        b = torch.where(torch.rand(n, d, generator=g) < 0.3,
                        special[torch.randint(0, len(special), (n, d), generator=g)], r(n, d))
        w, cy, rs = r(m).abs() * 0.1, r(n), r(n)
        for wb in (w, torch.zeros(m)):  # zero weights: out = b + cy.y, the special values
            out = ops.csr_fma(rowptr, col, wb, y, b, cy, rs)
            ref = ops.csr_fma(rowptr, col, wb, y.float(), b, cy, rs).to(sd)
            assert out.dtype == sd and same_bits(out, ref), (sd, d)
        p, q = (0.5 * r(n, 7)).to(sd), (0.5 * r(n, 7)).to(sd)
        for gr in (graph, directed):
            csr = (gr.rowptr, gr.col, gr.values(torch.float32)[0])
            tr = gr.transposed() or ()
            got = ops.neural_weight_grad(*csr, p, q, z, v, 1e-6, *tr, trusted=True)
            want = ops.neural_weight_grad(*csr, p.float(), q.float(), z.float(), v.float(), 1e-6,
                                          *tr, trusted=True)
            # the same sums; the compiler may contract a product into an FMA differently in
            # the two instantiations (seen in the AVX2 build's channel tail): 1e-6, not bits
            assert all(x.dtype == torch.float32 and
                       float((x - y_).norm()) <= 1e-6 * float(y_.norm())
                       for x, y_ in zip(got, want)), (sd, d)
        got = ops.neural_edge_weights(rowptr, col, a, p, q, trusted=True)
        want = ops.neural_edge_weights(rowptr, col, a, p.float(), q.float(), trusted=True)
        assert all(torch.equal(x, y_) for x, y_ in zip(got, want))
        wide64 = ops.csr_fma(rowptr, col, w.double(), y.double(), b.double(), cy.double(),
                             rs.double()).to(sd)
        out64 = ops.csr_fma(rowptr, col, w.double(), y, b.double(), cy.double(), rs.double())
        assert same_bits(out64, wide64), (sd, d)  # float64 compute: the output rounded once
        checked += 1
print("checked", checked)

# Every 16-bit pattern as an input (NaNs, infinities, the largest finite values, subnormals,
# -0), through the vector loads (d = 64) and the scalar tail (d = 67). On a graph without
# edges out_i = b_i + cy_i y_i + rs_i 0 reads each value alone (no NaN spreads through a
# row's sum): b = -0, cy = 1, rs = -1 give y back (-0 + y + -0 = y, zeros' signs included);
# random b (the special values among them), cy and rs round, as torch's conversions do.
patterns = torch.arange(-2 ** 15, 2 ** 15, dtype=torch.int32).to(torch.int16)
every_pattern = 0
for d in (64, 67):
    n_all = -(-2 ** 16 // d)
    edgeless = dk.build_graph(torch.empty(2, 0, dtype=torch.long), n_all)
    csr = (edgeless.rowptr, edgeless.col, torch.zeros(0))
    for sd in (torch.bfloat16, torch.float16):
        y = torch.cat([patterns, patterns[:n_all * d - 2 ** 16]]).view(sd).reshape(n_all, d)
        out = ops.csr_fma(*csr, y, torch.full((n_all, d), -0.0), torch.ones(n_all),
                          -torch.ones(n_all))
        assert out.dtype == sd and same_bits(out, y), (sd, d)
        b = torch.where(torch.rand(n_all, d, generator=g) < 0.3,
                        special[torch.randint(0, len(special), (n_all, d), generator=g)],
                        torch.randn(n_all, d, generator=g))
        cy, rs = torch.randn(n_all, generator=g), torch.randn(n_all, generator=g)
        out = ops.csr_fma(*csr, y, b, cy, rs)
        assert same_bits(out, ops.csr_fma(*csr, y.float(), b, cy, rs).to(sd)), (sd, d)
        every_pattern += 1
print("every 16-bit pattern", every_pattern)

boundaries = 0
# The float32 values where the store's rounding decides: the midpoints of neighbouring finite
# 16-bit values (ties: to the even one; the last one, above the largest, rounds to inf), a
# float32 step either side of each, both signs, and 2^16 float32 bit patterns at random (every
# exponent, float32 subnormals, NaN payloads). cy = 0: the pass stores b + 0.
for sd, finite in ((torch.float16, 0x7c00), (torch.bfloat16, 0x7f80)):
    pos = patterns[:finite].view(sd).float()  # 0 and the positive finite values, ascending
    step = pos[1:] - pos[:-1]
    mid = pos + torch.cat([step, step[-1:]]) / 2  # exact: one bit more than the 16-bit value
    near = torch.cat([mid, mid.nextafter(torch.tensor(0.0)),
                      mid.nextafter(torch.tensor(float("inf")))])
    values = torch.cat([near, -near, torch.randint(-2 ** 31, 2 ** 31, (2 ** 16,), generator=g,
                                                   dtype=torch.int32).view(torch.float32)])
    d = 64
    n_all = -(-len(values) // d)
    edgeless = dk.build_graph(torch.empty(2, 0, dtype=torch.long), n_all)
    csr = (edgeless.rowptr, edgeless.col, torch.zeros(0))
    b = torch.cat([values, torch.zeros(n_all * d - len(values))]).reshape(n_all, d)
    y, zero, one = torch.zeros(n_all, d, dtype=sd), torch.zeros(n_all), torch.ones(n_all)
    out = ops.csr_fma(*csr, y, b, zero, one)
    assert same_bits(out, ops.csr_fma(*csr, y.float(), b, zero, one).to(sd)), sd
    assert not (out.flatten()[:len(mid)].view(torch.int16) & 1).any(), sd  # ties to even
    boundaries += 1
print("rounding boundaries", boundaries)
"""


@pytest.mark.slow  # one process per instruction-set build: a few seconds
def test_cpu_passes_take_16bit_in_every_build(tmp_path):
    import platform
    ran = run_per_instruction_set(CPU_PASSES_SCRIPT, tmp_path)
    for isa, proc in ran.items():
        assert proc.returncode == 0, (isa, proc.stderr[-3000:])
        assert "checked 10" in proc.stdout and "every 16-bit pattern 4" in proc.stdout and \
            "rounding boundaries 2" in proc.stdout, (isa, proc.stdout)
    x86 = platform.machine() in ("x86_64", "AMD64")
    assert "generic" in ran and (len(ran) >= 2 or not x86)


@pytest.mark.parametrize("storage_dtype", STORAGE)
def test_cpu_passes_equal_torch_passes(storage_dtype, one_thread):
    """The CPU kernels' passes with 16-bit inputs (heavy hub row included) against the torch
    backend's (_assert_passes_match_torch)."""
    _assert_passes_match_torch("cpu", _pass_inputs(storage_dtype), storage_dtype)


def test_cpu_ops_check_16bit_arguments():
    """The compiled ops take 16-bit iterates and projections only where they are storage: the
    compute-dtype arguments, and the ops without 16-bit storage, raise naming the argument."""
    t = _pass_inputs(torch.bfloat16)
    g = t["graph"]
    o = torch.ops.dignn
    with pytest.raises(RuntimeError, match=r"w must be float32 or float64 \(the compute dtype"):
        o.csr_fma(g.rowptr, g.col, t["w"].bfloat16(), t["y"], t["b"], t["cy"], t["rs"])
    with pytest.raises(RuntimeError, match=r"cy must have dtype Float"):
        o.csr_fma(g.rowptr, g.col, t["w"], t["y"], t["b"], t["cy"].bfloat16(), t["rs"])
    with pytest.raises(RuntimeError, match=r"a must be float32 or float64 \(the compute dtype"):
        o.neural_weight_grad(g.rowptr, g.col, t["a"].bfloat16(), t["p"], t["q"], t["z"], t["v"],
                             1e-6)
    with pytest.raises(RuntimeError, match=r"q must have dtype BFloat16"):
        o.neural_edge_weights(g.rowptr, g.col, t["a"], t["p"], t["q"].half(), 1e-6)
    with pytest.raises(RuntimeError, match=r"p is BFloat16 but this op takes float32"):
        o.neural_edge_weights_backward(g.rowptr, g.col, t["a"], t["p"], t["q"], 1e-6, t["w"],
                                       g.rowptr, g.col, torch.arange(g.num_edges))
    x = t["b"]
    with pytest.raises(RuntimeError, match=r"z must have dtype Float"):
        o.diffusion_step(g.rowptr, g.col, t["w"], t["cy"].abs(), t["rs"].abs(), x, t["y"], 3.0)


# -------------------------------------------------------------- float16's range --

FP16_TOL = 1e-3  # float16 storage's documented accuracy against float32
# (max|x|, max|dl/dZ|): above float16's largest value 65504 (the issue's 1.8e5), in the
# forward and in the adjoint; below its normal range (x of 1e-6: subnormal in float16)
FP16_RANGE = [pytest.param(7e4, 1.0, id="x7e4"), pytest.param(1.8e5, 1.0, id="x1.8e5"),
              pytest.param(1.8e5, 1e5, id="x1.8e5-grad1e5")]
FP16_UNDER = [pytest.param(1e-6, 1.0, id="x1e-6")]
FIXED = ["rw", "sym", "unnormalized"]


def _fp16_cases(backends_, marks=()):
    return [pytest.param(b, lap, m, g, id=f"{b}-{lap}-{c.id}", marks=marks)
            for b in backends_ for c in FP16_RANGE for lap in ["neural"] + FIXED
            for m, g in [c.values]] + \
        [pytest.param(b, lap, m, g, id=f"{b}-{lap}-{c.id}", marks=marks)
         for b in backends_ for c in FP16_UNDER for lap in FIXED for m, g in [c.values]]


@pytest.mark.parametrize("backend,laplacian_name,magnitude,grad_magnitude",
                         _fp16_cases(["cpu", "torch"]) +
                         _fp16_cases(["triton"], marks=[pytest.mark.slow]))
def test_float16_storage_far_outside_its_range(backend, laplacian_name, magnitude,
                                               grad_magnitude, one_thread):
    """float16 storage with features (and incoming gradients) far outside float16's range:
    Z and every gradient within float16's accuracy of the float32 run, on the fused CPU loop
    (cpu), the solvers' loop (torch) and the Triton kernels, with no warning (before: NaN or
    Inf and a DivergenceWarning blaming mu, or silently inaccurate below the range)."""
    if backend == "triton" and not backends.get_backend("triton").available(
            torch.device("cpu")):
        pytest.skip("the Triton kernels run on the GPU in this session")
    opts = dict(laplacian_name=laplacian_name, magnitude=magnitude,
                grad_magnitude=grad_magnitude)
    ref, _ = _run("symmetric", backend, None, **opts)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run, layer = _run("symmetric", backend, torch.float16, **opts)
    errors = _errors(run, ref)
    assert max(errors.values()) <= FP16_TOL, errors


@pytest.mark.parametrize("laplacian_name", ["neural", "rw"])
def test_float16_storage_of_a_float64_solve_far_outside_its_range(laplacian_name, one_thread):
    """float64 features of 1.8e5 with float16 storage: the solvers' loop over the compiled
    CPU passes (the fused loop takes float32 x only)."""
    opts = dict(laplacian_name=laplacian_name, magnitude=1.8e5, dtype=torch.float64)
    ref, _ = _run("directed", "cpu", None, **opts)
    run, _ = _run("directed", "cpu", torch.float16, **opts)
    errors = _errors(run, ref)
    assert max(errors.values()) <= FP16_TOL, errors


def _star(leaves: int):
    """A star: node 0 joined both ways to ``leaves`` leaves."""
    tips = torch.arange(1, leaves + 1)
    hub = torch.zeros_like(tips)
    return torch.cat([torch.stack([hub, tips]), torch.stack([tips, hub])], dim=1)


@pytest.mark.parametrize("backend", ["cpu", "torch"])
def test_float16_storage_that_cannot_fit_is_refused(backend, one_thread):
    """The adjoint of a star with 2e5 leaves (rw, dl/dZ = 1.99, already in [1, 2)): the hub's
    dl/dx is some 7e4, beyond float16; the backward raises ValueError naming storage_dtype and
    float16 (before: an Inf gradient, silently), and bfloat16 storage (float32's range)
    computes it."""
    ei = _star(200_000)
    n = ei.max().item() + 1
    grads = {}
    for storage_dtype in (torch.float16, torch.bfloat16):
        layer = dk.FusedImplicitDiffusion(1, mu=3.0, laplacian="rw", backend=backend,
                                          storage_dtype=storage_dtype, max_iter=30)
        x = torch.ones(n, 1, requires_grad=True)
        z = layer(x, ei)
        if storage_dtype == torch.float16:
            with pytest.raises(ValueError, match=r"storage_dtype=torch\.float16 overflowed in "
                                                 r"the adjoint solve.*65504.*bfloat16"):
                z.backward(torch.full_like(z, 1.99))
        else:
            z.backward(torch.full_like(z, 1.99))
            grads[storage_dtype] = x.grad
    assert bool(torch.isfinite(grads[torch.bfloat16]).all())
    assert grads[torch.bfloat16].max() > 65504


# ------------------------------------------------------------------- the errors --

@pytest.mark.parametrize("bad", [torch.float64, torch.float32, torch.int32, "bfloat16", 16,
                                 True])
def test_bad_storage_dtype(bad):
    with pytest.raises(ValueError, match=r"storage_dtype must be None.*bfloat16.*float16"):
        dk.FusedImplicitDiffusion(4, storage_dtype=bad)
    x, ei, _ = make_graph("symmetric", dtype=torch.float32)
    g = dk.build_graph(ei, x.size(0))
    w, chi, kappa = g.fixed_laplacian("rw", torch.float32)
    with pytest.raises(ValueError, match=r"storage_dtype must be None.*bfloat16.*float16"):
        dk.implicit_diffusion(g.rowptr, g.col, w, x, chi, None, None, kappa, mu=3.0,
                              backend="torch", storage_dtype=bad)


@pytest.mark.parametrize("storage_dtype", STORAGE)
def test_unsupported_backend_and_solver(storage_dtype, monkeypatch):
    """Every backend of the package stores in 16 bits; one that does not (here the CUDA
    backend's record with its storage_dtypes emptied) is refused by name, as are the other
    solvers."""
    monkeypatch.setitem(backends._REGISTRY, "cuda", dataclasses.replace(
        backends.get_backend("cuda"), storage_dtypes=()))
    support = r"\('cpu', 'triton', 'torch'\)"
    with pytest.raises(ValueError, match=rf"storage_dtype=.*backend='cuda'.*{support}"):
        dk.FusedImplicitDiffusion(4, backend="cuda", storage_dtype=storage_dtype)
    for solver in ("cg", "anderson"):
        with pytest.raises(ValueError, match=r"storage_dtype=.*solver='fixed_point' only"):
            dk.FusedImplicitDiffusion(4, solver=solver, storage_dtype=storage_dtype)
    x, ei, _ = make_graph("symmetric", dtype=torch.float32)
    g = dk.build_graph(ei, x.size(0))
    w, chi, kappa = g.fixed_laplacian("rw", torch.float32)
    call = dict(mu=3.0, storage_dtype=storage_dtype)
    args = (g.rowptr, g.col, w, x, chi, None, None, kappa)
    with pytest.raises(ValueError, match=rf"storage_dtype=.*backend='cuda'.*{support}"):
        dk.implicit_diffusion(*args, backend="cuda", **call)
    with pytest.raises(ValueError, match=r"storage_dtype=.*solver='fixed_point' only"):
        dk.implicit_diffusion(*args, backend="torch", solver="cg", **call)
    # a layer whose backend is switched to the CUDA kernels after construction
    layer = make_layer(5, dtype=torch.float32, storage_dtype=storage_dtype)
    layer.backend = "cuda"
    with pytest.raises(ValueError, match=rf"storage_dtype=.*backend='cuda'.*{support}"):
        layer(x, ei)


@pytest.mark.parametrize("storage_dtype", STORAGE)
def test_auto_and_default_pick_a_supporting_backend(storage_dtype, one_thread):
    assert backends.get_backend("cuda").storage_dtypes == backends.STORAGE_DTYPES
    assert backends.storage_backends(storage_dtype) == backends.BACKENDS
    assert backends.available_backends(torch.device("cpu"), 100, storage_dtype)[0] == "cpu"
    layer = make_layer(5, dtype=torch.float32, storage_dtype=storage_dtype)
    x, ei, _ = make_graph("symmetric", dtype=torch.float32)
    layer(x, ei)
    assert layer.backend_used == "cpu"  # auto on the CPU: the compiled kernels
    assert "storage_dtype" in repr(layer)
    g = dk.build_graph(ei, x.size(0))
    w, chi, kappa = g.fixed_laplacian("rw", torch.float32)
    z16, _ = dk.implicit_diffusion(g.rowptr, g.col, w, x, chi, None, None, kappa, mu=3.0,
                                   storage_dtype=storage_dtype)  # backend None: cpu here
    z, _ = dk.implicit_diffusion(g.rowptr, g.col, w, x, chi, None, None, kappa, mu=3.0,
                                 backend="cpu", storage_dtype=storage_dtype)
    assert torch.equal(z16, z)


def test_compiled_backend_unchanged(one_thread):
    """storage_dtype=None is today's solve: the compiled backend's layer equals the torch one,
    and the solve op still takes its arguments without storage_dtype (forward and backward)."""
    x, ei, w = make_graph("directed", dtype=torch.float32)
    out = {}
    for name in ("cpu", "torch"):
        out[name], _ = _run("directed", name, None)
    assert max(_errors(out["cpu"], out["torch"]).values()) <= 1e-5
    g = dk.build_graph(ei, x.size(0))
    wv, chi, kappa = g.fixed_laplacian("rw", torch.float32)
    xr = x.clone().requires_grad_()
    t = g.transposed()
    z, _, _, _ = torch.ops.dignn.implicit_solve(g.rowptr, g.col, wv, xr, chi, None, None, kappa,
                                                *t, None, 3.0, 1e-6, 10, 1e-6, "fixed_point",
                                                "cpu", -1, 5)
    z.sum().backward()
    z_ref, _ = dk.implicit_diffusion(g.rowptr, g.col, wv, x, chi, None, None, kappa, mu=3.0,
                                     backend="cpu", t_rowptr=t[0], t_col=t[1], t_perm=t[2])
    assert torch.equal(z.detach(), z_ref) and xr.grad is not None


def test_training_config_and_cli_option():
    """``dignn train --storage-dtype bfloat16`` reaches the layer through TrainConfig."""
    from dignn import models
    from dignn.cli import build_parser
    from dignn.presets import TrainConfig
    args = build_parser().parse_args(["train", "--dataset", "cora", "--storage-dtype",
                                      "bfloat16"])
    assert args.storage_dtype == "bfloat16"
    model = models.DIGNNNodeClassifier(5, 8, 3, storage_dtype=TrainConfig(
        storage_dtype="float16").storage_dtype)
    assert model.diffusion.storage_dtype == torch.float16
    graph_model = models.DIGNNGraphClassifier(5, 8, 3, storage_dtype=torch.bfloat16)
    assert graph_model.diffusion.storage_dtype == torch.bfloat16
    with pytest.raises(ValueError, match="storage_dtype must be None, 'bfloat16' or"):
        models.DIGNNNodeClassifier(5, 8, 3, storage_dtype="bf16")
