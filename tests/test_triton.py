"""The Triton backend: every kernel against the CPU ops, dense formulas and the paper reference;
the layer with backend="triton" against backend="cpu"; the device-side solve loop; opcheck.

Each test runs on the devices the kernels can use in this session: on the CPU in Triton's
interpreter (tests/conftest.py sets TRITON_INTERPRET=1 when no GPU is present) and on CUDA
(marker ``cuda``, skipped without a GPU). The interpreter runs a kernel in NumPy, program by
program, so the graphs here are small; SEGMENT_EDGES is lowered in some cases so that small
graphs have rows split into several segments (the heavy-row path), and the shapes include
odd widths and widths over one tile (the masking and tiling paths).
"""
import dataclasses
import math
import os
import subprocess
import sys

import pytest
import torch

import dignn_kernels as dk
from dignn_kernels import laplacian, ops, reference
from dignn_kernels.backends import interface as iface, triton as tb
from dignn_kernels.solvers import anderson_solver, cg_solver, loops
from backend_faces import face, graph_inputs as shared_graph_inputs
from conftest import (HostReads, make_graph, make_layer, rel_err, thetas,
                      wide_range_projections)

tk = face("triton")  # the triton passes and solve through the public face
compiled = face("cpu")

HAS_CUDA = torch.cuda.is_available()
cuda_only = [pytest.mark.cuda, pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")]


@pytest.fixture(params=[pytest.param("cpu", id="interpreter"),
                        pytest.param("cuda", id="cuda", marks=cuda_only)])
def device(request):
    if request.param == "cpu" and not tb.available("cpu"):
        pytest.skip("the Triton kernels were compiled for the GPU in this session "
                    "(TRITON_INTERPRET unset); these checks run on CUDA (marker cuda)")
    return torch.device(request.param)


@pytest.fixture
def chunk(request, monkeypatch):
    """SEGMENT_EDGES for the test (indirect parametrization; default: the module's)."""
    value = getattr(request, "param", tb.SEGMENT_EDGES)
    monkeypatch.setattr(tb, "SEGMENT_EDGES", value)
    return value


def graph_inputs(kind, n=20, d=5, h=3, dtype=torch.float64, seed=0):
    """backend_faces.graph_inputs with h = 3 metric channels by default."""
    return shared_graph_inputs(kind, n=n, d=d, h=h, dtype=dtype, seed=seed)


def to(device, *tensors):
    return [t.to(device) if isinstance(t, torch.Tensor) else t for t in tensors]


def on_device(t, device):
    """Whether tensor `t` lives on `device`. Compares the device type, and for CUDA the index
    too: a tensor's .device always carries an index (cuda:0), so `t.device == device` is False
    for the fixture's torch.device("cuda"); no index there means the current CUDA device."""
    if t.device.type != device.type:
        return False
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return t.device.index == index
    return True


def transposed_or_none(g):
    t = g.transposed()
    return t if t is not None else (None, None, None)


def dense_w(g, w):
    n = g.num_nodes
    return torch.zeros(n, n, dtype=w.dtype).index_put_((g.rows(), g.col.long()), w.cpu(),
                                                       accumulate=True)


def tol_for(dtype):
    return 1e-13 if dtype == torch.float64 else 2e-6


# ------------------------------------------------------------------------ schedule --

@pytest.mark.parametrize("chunk_size", [1, 3, 64])
def test_schedule_covers_every_edge_once(chunk_size):
    """Work items: every edge in exactly one item of at most `chunk` edges, one item per empty
    row, items sorted longest first, heavy rows' slots contiguous and disjoint."""
    g, *_ = graph_inputs("hub", n=80)
    rowptr = g.rowptr
    n, m = g.num_nodes, g.num_edges
    s = tb.build_schedule(rowptr, m, chunk_size)
    row, start, length, slot = s.segment_row, s.segment_start, s.segment_len.long(), s.segment_slot
    real = row >= 0
    assert bool((length <= chunk_size).all()) and bool((length[:-1] >= length[1:]).all())
    covered = torch.zeros(m, dtype=torch.long)
    for r, st, ln in zip(row[real].tolist(), start[real].tolist(), length[real].tolist()):
        assert rowptr[r] <= st and st + ln <= rowptr[r + 1]
        covered[st:st + ln] += 1
    assert bool((covered == 1).all())
    deg = rowptr[1:] - rowptr[:-1]
    items_per_row = torch.bincount(row[real], minlength=n)
    assert torch.equal(items_per_row, torch.clamp_min(-(-deg // chunk_size), 1))
    assert bool((slot[real & (items_per_row[row.clamp_min(0)] == 1)] == -1).all())
    heavy_rows = s.heavy_row[s.heavy_row >= 0]
    assert heavy_rows.numel() >= 1  # the hub (degree 76) is split even at chunk 64
    assert sorted(heavy_rows.tolist()) == torch.nonzero(items_per_row > 1).flatten().tolist()
    used = []
    for r, f, c in zip(s.heavy_row.tolist(), s.heavy_first.tolist(), s.heavy_count.tolist()):
        if r < 0:
            continue
        assert sorted(slot[row == r].tolist()) == list(range(f, f + c))
        used += list(range(f, f + c))
    assert len(used) == len(set(used)) and all(0 <= u < s.num_slots for u in used)


def test_schedule_of_a_graph_without_edges():
    rowptr = torch.zeros(5, dtype=torch.int64)
    s = tb.build_schedule(rowptr, 0, 64)
    assert s.num_segments == 4 and s.num_heavy == 0
    assert sorted(s.segment_row.tolist()) == [0, 1, 2, 3] and bool((s.segment_len == 0).all())


# -------------------------------------------------------------------------- kernels --

PASS_CASES = [  # kind, n, d, h, dtype, chunk
    ("symmetric", 20, 5, 3, torch.float64, 64),
    ("directed", 20, 5, 3, torch.float64, 3),
    ("zero_rows", 20, 7, 5, torch.float32, 3),
    ("isolated", 20, 1, 1, torch.float64, 2),
    ("self_loops", 20, 4, 2, torch.float32, 64),
    ("hub", 80, 3, 2, torch.float32, 64),  # a row of 76 edges: two items at the default
    ("directed", 12, 131, 67, torch.float64, 4),  # two channel tiles, two metric blocks
]


@pytest.mark.parametrize("kind,n,d,h,dtype,chunk", PASS_CASES, indirect=["chunk"],
                         ids=[f"{c[0]}-d{c[2]}-h{c[3]}-{str(c[4])[6:]}-c{c[5]}"
                              for c in PASS_CASES])
def test_passes_match_cpu_ops_and_dense(device, kind, n, d, h, dtype, chunk):
    """Every pass against the compiled CPU op and against the dense formulas."""
    g, x, p, q, a, chi = graph_inputs(kind, n=n, d=d, h=h, dtype=dtype)
    mu, tol = 2.2, tol_for(dtype)
    gen = torch.Generator().manual_seed(5)
    z, v, y = (torch.randn(x.shape, generator=gen, dtype=dtype) for _ in range(3))
    cy, rs = (torch.randn(g.num_nodes, generator=gen, dtype=dtype) for _ in range(2))
    t = g.transposed() or dk.graph.transpose_csr(g.rowptr, g.col, g.num_nodes)
    dev = lambda *ts: to(device, *ts)  # noqa: E731
    rp, cl, ad, pd, qd, chid, xd, zd, vd = dev(g.rowptr, g.col, a, p, q, chi, x, z, v)

    w, kappa = ops.neural_edge_weights(g.rowptr, g.col, a, p, q, 1e-6)
    tw, tkappa = tk.neural_edge_weights(rp, cl, ad, pd, qd, 1e-6)
    assert rel_err(tw.cpu(), w) < tol and rel_err(tkappa.cpu(), kappa) < tol

    # the forward step with cached weights vs x - Delta z / mu (eq. iter)
    wd = dense_w(g, w)
    guard = chi > reference.CHI_FLOOR
    inv_chi = torch.where(guard, 1 / torch.where(guard, chi, torch.ones_like(chi)),
                          torch.zeros_like(chi))
    delta = inv_chi[:, None] * (torch.diag(kappa) - wd)
    want = x - delta @ z / mu
    cached = tk.diffusion_step(rp, cl, *dev(w, chi, kappa), xd, zd, mu)
    assert rel_err(cached.cpu(), want) < 10 * tol
    assert rel_err(cached.cpu(), ops.diffusion_step(g.rowptr, g.col, w, chi, kappa, x, z,
                                                    mu)) < tol

    # the generic row pass
    fma = tk.csr_fma(rp, cl, *dev(w, y, x, cy, rs))
    assert rel_err(fma.cpu(), x + cy[:, None] * y + rs[:, None] * (wd @ y)) < 10 * tol
    assert rel_err(fma.cpu(), ops.csr_fma(g.rowptr, g.col, w, y, x, cy, rs)) < tol

    # the gradient pass: in-row on symmetric graphs, and with the transposed CSR
    for tr in ([transposed_or_none(g)] + ([t] if g.symmetric else [])):
        got = tk.neural_weight_grad(rp, cl, ad, pd, qd, zd, vd, 1e-6, *dev(*tr))
        want_g = ops.neural_weight_grad(g.rowptr, g.col, a, p, q, z, v, 1e-6, *tr)
        for a_, b_ in zip(got, want_g):
            assert rel_err(a_.cpu(), b_) < 10 * tol


@pytest.mark.parametrize("kind", ["symmetric", "directed", "self_loops"])
def test_weight_grad_matches_autograd(device, kind):
    """The fused gradient pass equals autograd through the edge weights (composed from the
    paper's formulas) with dl/dW_ij = v_i . (z_j - z_i)."""
    g, x, p, q, a, chi = graph_inputs(kind)
    z, v = torch.randn_like(x), torch.randn_like(x)
    pr, qr = p.clone().requires_grad_(), q.clone().requires_grad_()
    rows, cols = g.rows(), g.col.long()
    pi, _, rho = laplacian.edge_terms(rows, cols, pr, qr)
    w = laplacian.neural_edge_weight(a, pi, rho, 1e-6)
    gp, gq = torch.autograd.grad((w * (v[rows] * (z[cols] - z[rows])).sum(1)).sum(), [pr, qr])
    got_p, got_q = tk.neural_weight_grad(*to(device, g.rowptr, g.col, a, p, q, z, v), 1e-6,
                                         *to(device, *transposed_or_none(g)))
    assert rel_err(got_p.cpu(), gp) < 1e-12 and rel_err(got_q.cpu(), gq) < 1e-12


@pytest.mark.parametrize("kind", ["symmetric", "directed"])
def test_edge_weights_gradcheck(device, kind):
    g, x, p, q, a, chi = graph_inputs(kind, n=10, h=2)
    rp, cl, ad = to(device, g.rowptr, g.col, a)
    p, q = (t.to(device).requires_grad_() for t in (p, q))
    assert torch.autograd.gradcheck(
        lambda p, q: tk.neural_edge_weights(rp, cl, ad, p, q, 1e-6), (p, q), fast_mode=True)


def test_float32_edge_math_is_accurate(device):
    """tanh and 1 - tanh^2 in float32 (odd series below 0.625, exp form above) within a few
    ulp of float64, for arguments from 1e-6 to 1e4 (h = 1: the dot products are exact). On
    CUDA Triton's float32 exp is ex2.approx of x log2(e) (about 2 ulp more), hence the
    looser bound there."""
    bound = 6e-7 if device.type == "cpu" else 2e-6
    n = 1000
    g = dk.build_graph(torch.stack([torch.arange(n), torch.arange(n).roll(1)]), n)
    a, p, q = wide_range_projections(n)
    gen = torch.Generator().manual_seed(1)
    rp, cl = to(device, g.rowptr, g.col)
    w32, _ = tk.neural_edge_weights(rp, cl, *to(device, a, p, q), 1e-6)
    w64, _ = ops.neural_edge_weights(g.rowptr, g.col, a.double(), p.double(), q.double(), 1e-6)
    assert float(((w32.cpu().double() - w64).abs() / w64.abs()).max()) < bound
    z, v = torch.randn(n, 3, generator=gen), torch.randn(n, 3, generator=gen)
    gp32, gq32 = tk.neural_weight_grad(rp, cl, *to(device, a, p, q, z, v), 1e-6)
    gp64, gq64 = ops.neural_weight_grad(g.rowptr, g.col, a.double(), p.double(), q.double(),
                                        z.double(), v.double(), 1e-6)
    assert rel_err(gp32.cpu(), gp64) < 2 * bound and rel_err(gq32.cpu(), gq64) < 2 * bound


# ---------------------------------------------------------------------- the solves --

@pytest.mark.parametrize("kind,neural,chunk", [("symmetric", True, 64), ("directed", True, 3),
                                               ("zero_rows", True, 3), ("weighted", False, 3),
                                               ("directed", False, 64)],
                         indirect=["chunk"])
def test_implicit_diffusion_matches_cpu_op(device, kind, neural, chunk):
    """Forward solve and implicit backward of the op against the compiled CPU op: same
    iterates, same stats (forward and adjoint), same gradients."""
    g, x, p, q, a, chi = graph_inputs(kind, n=24, d=6, h=4)
    t = transposed_or_none(g)
    if neural:
        value, extra = a, (p, q, None)
    else:
        value, _, kappa = g.fixed_laplacian("rw", torch.float64)
        value, chi, extra = value, g.degree.double(), (None, None, kappa)
    leaves = [x, chi] + ([p, q] if neural else [])
    grad_out = torch.randn_like(x)
    results = []
    for dev, impl in ((torch.device("cpu"), compiled), (device, tk)):
        inputs = [u.to(dev).requires_grad_() for u in leaves]
        xr, chir = inputs[:2]
        pq = inputs[2:] if neural else [None, None]
        z, stats = impl.implicit_diffusion(
            *to(dev, g.rowptr, g.col, value), xr, chir, *pq, *to(dev, extra[2]), mu=3.0,
            max_iter=9, tol=1e-10, t_rowptr=to(dev, t[0])[0], t_col=to(dev, t[1])[0],
            t_perm=to(dev, t[2])[0])
        grads = torch.autograd.grad(z, inputs, grad_out.to(dev))
        results.append((z, stats, impl.backward_stats(stats), grads))
    (z0, s0, b0, g0), (z1, s1, b1, g1) = results
    assert on_device(s1, device)
    assert rel_err(z1.cpu(), z0) < 1e-13
    assert s1.cpu()[0] == s0[0] == 9 and torch.allclose(s1.cpu(), s0, rtol=1e-10)
    assert b1 is not None and b1.cpu()[0] == b0[0] == 9
    assert torch.allclose(b1.cpu(), b0, rtol=1e-10)
    for a_, b_ in zip(g1, g0):
        assert rel_err(a_.cpu(), b_) < 1e-12


def test_solve_stops_where_the_compiled_loop_stops(device):
    """The solvers' fixed point on the Triton passes against the compiled backend's fused
    loop: with a loose tol it stops at the same iteration, max_iter = 1 returns x, tol = 0
    runs every iteration."""
    g, x, p, q, a, chi = graph_inputs("symmetric", n=24, d=6, h=4)
    args_cpu = (g.rowptr, g.col, a, x, chi, p, q)
    args_dev = to(device, *args_cpu)
    iterations = []
    for max_iter, tol in ((40, 1e-3), (40, 1e-7), (1, 1e-6), (6, 0.0)):
        z0, s0 = compiled.implicit_diffusion(*args_cpu, mu=3.0, max_iter=max_iter, tol=tol)
        z1, s1 = tk.implicit_diffusion(*args_dev, mu=3.0, max_iter=max_iter, tol=tol)
        assert s1.cpu()[0] == s0[0], (max_iter, tol)
        assert rel_err(z1.cpu(), z0) < 1e-13 and torch.allclose(s1.cpu(), s0, rtol=1e-9)
        iterations.append(int(s1[0]))
    assert 2 < iterations[0] < iterations[1] < 17 and iterations[2:] == [1, 6]
    z1, s1 = tk.implicit_diffusion(*args_dev, mu=3.0, max_iter=1)
    assert torch.equal(z1.cpu(), x) and float(s1[0]) == 1
    # no edges: Z_2 = X exactly, so even tol = 0 stops at iteration 2
    empty = torch.zeros(2, 0, dtype=torch.long)
    ge = dk.build_graph(empty, x.size(0))
    args_cpu = (ge.rowptr, ge.col, ge.value.double(), x, chi, p, q)
    z0, s0 = compiled.implicit_diffusion(*args_cpu, mu=3.0, max_iter=10, tol=0.0)
    z1, s1 = tk.implicit_diffusion(*to(device, *args_cpu), mu=3.0, max_iter=10, tol=0.0)
    assert float(s1[0]) == float(s0[0]) == 2 and torch.equal(z1.cpu(), x)
    zero = torch.zeros_like(x)  # X = 0 converges at iteration 1: Z = 0
    z1, s1 = tk.implicit_diffusion(*to(device, g.rowptr, g.col, a, zero, chi, p, q), mu=3.0,
                                   max_iter=10, tol=0.0)
    assert float(s1[0]) == 1 and not bool(z1.any())


ROW_STEP_CASES = [("hub", 80, 5, torch.float32, None, 3), ("directed", 12, 131, torch.float64,
                                                            None, 64),
                  ("hub", 80, 6, torch.float32, torch.bfloat16, 3),
                  ("symmetric", 20, 7, torch.float32, torch.float16, 64)]


def solve_state(device, tol, bound):
    """A fixed point's state (interface.FIXED_POINT_STATE) before its first sweep."""
    state = torch.zeros(iface.FIXED_POINT_STATE, dtype=torch.float64)
    state[[iface.FP_RESIDUAL, iface.FP_RELATIVE]] = torch.tensor([2.5, 1.0], dtype=torch.float64)
    state[[iface.FP_TOL, iface.FP_BOUND]] = torch.tensor([tol, bound], dtype=torch.float64)
    state[iface.FP_TINY] = torch.finfo(torch.float64).tiny
    return state.to(device)


@pytest.mark.parametrize("kind,n,d,dtype,storage,chunk", ROW_STEP_CASES, indirect=["chunk"])
def test_row_step_is_the_row_pass_with_its_bookkeeping(device, kind, n, d, dtype, storage,
                                                       chunk):
    """The row step writes what csr_fma returns, bit for bit (heavy rows, channel tiles and
    16-bit iterates included), and updates the fixed point's state and history as
    loops.fixed_point_update does with the norms of its stored output (||out - y||, ||out||,
    sum_i c_i ||out_i||^2), converging, running on and diverging; once done it loads and
    writes nothing and the state stays as it was."""
    g, x, p, q, a, chi = graph_inputs(kind, n=n, d=d, dtype=dtype)
    gen = torch.Generator().manual_seed(3)
    y = torch.randn(x.shape, generator=gen, dtype=dtype).to(storage or dtype)
    w, cy, rs = (torch.rand(m, generator=gen, dtype=dtype) for m in (g.num_edges,) + 2 * (n,))
    c = chi.abs() + 0.5
    rp, cl, wd, yd, xd, cyd, rsd, cd = to(device, g.rowptr, g.col, w, y, x, cy, rs, c)
    want = tk.csr_fma(rp, cl, wd, yd, xd, cyd, rsd)
    wide, before = want.cpu().double(), y.double()
    res, size = (wide - before).norm(), wide.norm()
    weighted = (c.double() * wide.square().sum(dim=1)).sum()
    step = tb.TRITON.row_step(rp, cl, wd, xd, cyd, rsd, cd)
    rtol = 1e-12 if dtype == torch.float64 else 1e-5
    # tol and bound: converges; runs on; diverges (the certificate's bound broken)
    for tol, bound in ((2 * float(res / size), math.inf), (0.0, math.inf),
                       (0.0, 0.5 * float(weighted))):
        state, history = solve_state(device, tol, bound), torch.zeros(5, dtype=torch.float64,
                                                                      device=device)
        out = torch.full_like(yd, 7.0)
        step(yd, out, state, history, 3)
        assert out.dtype == yd.dtype and torch.equal(out, want)
        expected, expected_history = solve_state("cpu", tol, bound), torch.zeros(5).double()
        loops.fixed_point_update(expected, expected_history, 3, res, size, weighted)
        assert torch.allclose(state.cpu(), expected, rtol=rtol)
        assert torch.allclose(history.cpu(), expected_history, rtol=rtol)
        assert float(state[iface.FP_DONE]) == float(tol > 0 or bound < math.inf)
        assert float(state[iface.FP_DIVERGED]) == float(bound < math.inf)
        assert float(state[iface.FP_SWEEPS]) == 1
    done = state.clone()
    kept = torch.full_like(yd, 7.0)
    step(yd, kept, state, history, 4)
    assert bool((kept == 7.0).all()) and torch.equal(state, done)
    assert float(history[3]) == 0.0  # the norms of a done sweep are 0


ROW_PRODUCT_CASES = [("hub", 80, 5, torch.float32, 3), ("directed", 12, 131, torch.float64, 64),
                     ("isolated", 20, 7, torch.float32, 2)]


@pytest.mark.parametrize("kind,n,d,dtype,chunk", ROW_PRODUCT_CASES, indirect=["chunk"])
def test_row_product_is_the_row_pass_with_its_dots(device, kind, n, d, dtype, chunk):
    """cg's row product writes what csr_fma returns with b = 0 (heavy rows, two channel
    tiles, isolated rows): bit for bit in the interpreter, to an ulp on a GPU (where the
    compiler may fuse either product of cy y + rs (W y) into an FMA, and fuses b + cy y
    when b is read); it returns the per-channel dots out.y of what it wrote; once done it
    writes nothing and its dots are 0."""
    g, x, p, q, a, chi = graph_inputs(kind, n=n, d=d, dtype=dtype)
    gen = torch.Generator().manual_seed(4)
    y = torch.randn(x.shape, generator=gen, dtype=dtype)
    w, cy, rs = (torch.randn(m, generator=gen, dtype=dtype) for m in (g.num_edges,) + 2 * (n,))
    rp, cl, wd, yd, cyd, rsd = to(device, g.rowptr, g.col, w, y, cy, rs)
    want = tk.csr_fma(rp, cl, wd, yd, torch.zeros_like(yd), cyd, rsd)
    product = tb.TRITON.row_product(rp, cl, wd, cyd, rsd)
    flags = torch.zeros(3, dtype=torch.float64, device=device)
    out = torch.full_like(yd, 7.0)
    dots = product(yd, out, flags)
    if device.type == "cpu":
        assert torch.equal(out, want)
    else:
        eps = torch.finfo(dtype).eps
        assert torch.allclose(out, want, rtol=4 * eps, atol=4 * eps * float(want.abs().max()))
    assert dots.dtype == dtype and dots.shape == (d,)
    exact = (out.double() * yd.double()).sum(dim=0).cpu()
    scale = (out.double() * yd.double()).abs().sum(dim=0).cpu()
    assert bool(((dots.double().cpu() - exact).abs() <=
                 (1e-13 if dtype == torch.float64 else 1e-6) * scale).all())
    flags[0] = 1.0  # done: cg's flags, CG_DONE first
    kept = torch.full_like(yd, 7.0)
    assert not product(yd, kept, flags).any() and bool((kept == 7.0).all())


@pytest.mark.parametrize("kind,n,d,dtype,storage,chunk", ROW_STEP_CASES, indirect=["chunk"])
def test_row_map_is_the_row_pass(device, kind, n, d, dtype, storage, chunk):
    """The row map (the row pass of one graph and coefficients, prepared once) returns what
    the csr_fma op returns, bit for bit, call after call (heavy rows, two channel tiles,
    16-bit iterates and right-hand sides), reading a non-contiguous y or b as its
    contiguous copy."""
    g, x, p, q, a, chi = graph_inputs(kind, n=n, d=d, dtype=dtype)
    gen = torch.Generator().manual_seed(5)
    w, cy, rs = (torch.randn(m, generator=gen, dtype=dtype) for m in (g.num_edges,) + 2 * (n,))
    rp, cl, wd, cyd, rsd = to(device, g.rowptr, g.col, w, cy, rs)
    row_map = tb.TRITON.row_map(rp, cl, wd, cyd, rsd)
    for seed in (6, 7):
        gen.manual_seed(seed)
        y, b = (torch.randn(x.shape, generator=gen, dtype=dtype).to(storage or dtype)
                .to(device) for _ in range(2))
        want = tk.csr_fma(rp, cl, wd, y, b, cyd, rsd)
        got = row_map(y, b)
        assert got.dtype == y.dtype and torch.equal(got, want)
        assert not torch.equal(got, tk.csr_fma(rp, cl, wd, y, 2 * b, cyd, rsd))
    strided_y, strided_b = (t.t().contiguous().t() for t in (y, b))
    assert not strided_y.is_contiguous()
    assert torch.equal(row_map(strided_y, strided_b), want)


def system_on(backends, device, kind, laplacian, mu):
    """(x, one EquilibriumSystem per backend) of a 30-node float32 graph of `kind` with the
    `laplacian`'s weights (the neural one's from a fresh layer's projections), on `device`
    (W^T's CSR given on a directed graph)."""
    x, ei, w = make_graph(kind, n=30, d=6, dtype=torch.float32)
    g = dk.build_graph(ei, x.size(0), w)
    if laplacian == "neural":
        layer = make_layer(6, "neural", dtype=torch.float32)
        a, degree = g.values(x.dtype)
        chi, p, q = layer._projections(x, degree)
        wf, kappa = ops.neural_edge_weights(g.rowptr, g.col, a, p.detach(), q.detach())
        chi = chi.detach()
    else:
        wf, chi, kappa = g.fixed_laplacian(laplacian, x.dtype)
    t = g.transposed() or (None, None, None)
    args = to(device, g.rowptr, g.col, wf, chi, kappa)
    transposed = dict(zip(("t_rowptr", "t_col", "t_perm"), to(device, *t)))
    return x, [dk.solvers.EquilibriumSystem(backend, *args, mu, **transposed)
               for backend in backends]


@pytest.mark.parametrize("solver", ["cg", "anderson"])
def test_a_solve_runs_its_backends_vector_kernels(monkeypatch, solver):
    """The vector work of a solve (cg's update, Anderson's window) runs on the kernels its
    backend names (Backend.vector_kernels): backend="torch" and "cuda" never Triton's, even
    where Triton runs; "cpu" leaves the choice to the device (its compiled record)."""
    from dignn_kernels.solvers import anderson_update, cg_update
    chosen, real = [], cg_update.resolve_vector_kernels

    def spy(rhs, vector_kernels=None):
        chosen.append(vector_kernels)
        return real(rhs, vector_kernels)

    for module in (cg_update, anderson_update):  # where cg's and anderson's updates read it
        monkeypatch.setattr(module, "resolve_vector_kernels", spy)
    registry = dk.backends._REGISTRY
    names = ["cpu", "torch", "cuda"] + (["triton"] if tb.available("cpu") else [])
    x, systems = system_on([registry[name] for name in names], "cpu", "symmetric", "rw", 2.2)
    for name, system in zip(names, systems):
        chosen.clear()
        dk.solvers.solve_forward(system, x, solver, max_iter=3, tol=0.0, check_every=0)
        want = {"cpu": None, "torch": "torch", "cuda": "torch", "triton": "triton"}[name]
        assert registry[name].vector_kernels == want and chosen == [want], (name, chosen)


def test_the_plain_pass_reduces_nothing(device):
    """The row pass outside a solve's step or product (the csr_fma op, the row map) compiles
    its partial sums and done flag out (SUMS_NONE): no buffer comes back, and the output is
    the step's, bit for bit."""
    jit = tb._jit()
    g, x, p, q, a, chi = graph_inputs("hub", n=80, d=5, dtype=torch.float32)
    rp, cl, w, y, b = to(device, g.rowptr, g.col, a, x.flip(0).contiguous(), x)
    cy, rs = to(device, -chi, 0.1 * chi)
    sched = tb.schedule_for(rp, cl.numel())
    plain, step = torch.empty_like(y), torch.empty_like(y)
    assert jit.csr_fma(sched, cl, w, y, b, cy, rs, plain) is None
    done = torch.zeros(1, dtype=torch.float64, device=y.device)
    sums = jit.csr_fma(sched, cl, w, y, b, cy, rs, step, done=done, sums=jit.SUMS_NORMS)
    assert sums is not None and sched.num_heavy and torch.equal(plain, step)


# (solver, the sweep it would take instead of the row map: off in both variants)
ROW_MAP_SOLVERS = [("anderson", ()), ("fixed_point", ("row_step",)), ("cg", ("row_product",))]
ROW_MAP_GRAPHS = [("symmetric", "rw"), ("directed", "neural"), ("zero_rows", "sym")]
ROW_MAP_SOLVES = [(solver, off, kind, laplacian) for solver, off in ROW_MAP_SOLVERS
                  for kind, laplacian in ROW_MAP_GRAPHS
                  if not (solver == "cg" and kind == "directed")]  # cg: symmetric W only


@pytest.mark.parametrize("solver,without_sweep,kind,laplacian", ROW_MAP_SOLVES)
def test_solvers_on_the_row_map_equal_them_on_the_row_pass(device, solver, without_sweep, kind,
                                                           laplacian):
    """The solvers' sweeps on the Triton row map (anderson's; the fixed point's without a row
    step; cg's without a row product) against the same solves on the csr_fma op: the same
    solution bit for bit, sweeps, flags and stats, forward and adjoint (over W^T on the
    directed graph), the flag read every sweep and never."""
    off = dict.fromkeys(without_sweep)
    mapped = dataclasses.replace(tb.TRITON, **off)
    plain = dataclasses.replace(tb.TRITON, row_map=None, **off)
    assert mapped.row_map is not None
    x, systems = system_on((mapped, plain), device, kind, laplacian, 2.2)
    xd = x.to(device)
    for solve in (dk.solvers.solve_forward, dk.solvers.solve_adjoint):
        for check_every in (1, 0):
            on_map, on_op = (solve(system, xd, solver, max_iter=25, tol=1e-6,
                                   check_every=check_every) for system in systems)
            assert torch.equal(on_map.solution, on_op.solution)
            assert int(on_map.sweeps) == int(on_op.sweeps) > 2
            assert bool(on_map.diverged) == bool(on_op.diverged)
            assert torch.equal(on_map.stats(), on_op.stats())


@pytest.mark.parametrize("vector_kernels", ["torch", "triton"])
@pytest.mark.parametrize("kind,laplacian,mu,max_iter,tol",
                         [("symmetric", "rw", 2.2, 80, 1e-6), ("zero_rows", "sym", 0.4, 12, 0.0),
                          ("isolated", "rw", 1.0, 80, 1e-6)])
def test_cg_on_the_row_product_equals_cg_on_the_row_pass(device, vector_kernels, kind,
                                                         laplacian, mu, max_iter, tol):
    """cg with the Triton row product (the sweep and its dots w.u in one kernel) against cg on
    the Triton row pass and a separate dot product, with either vector update: the same
    sweeps (in the interpreter; within one on a GPU) and flags, the solutions and residuals
    to rounding (the dots are summed in another order), forward and adjoint, the flag read
    every sweep, every 4 or never."""
    x, ei, w = make_graph(kind, n=30, d=6, dtype=torch.float32)
    g = dk.build_graph(ei, x.size(0), w)
    wf, chi, kappa = g.fixed_laplacian(laplacian, x.dtype)
    args = to(device, g.rowptr, g.col, wf, chi, kappa)
    systems = [dk.solvers.EquilibriumSystem(backend, *args[:3], *args[3:], mu)
               for backend in (tb.TRITON, dataclasses.replace(tb.TRITON, row_product=None))]
    assert systems[1].spd_product() is None
    xd = x.to(device)
    for adjoint in (False, True):
        rhs = xd if adjoint else systems[0].mass.unsqueeze(1) * xd
        scale = None if adjoint else 1.0 / systems[0].mass
        for check_every in (1, 4, 0):
            on_product, plain = (
                dk.solvers.conjugate_gradient(system.spd_apply, rhs, system.inv_diagonal,
                                              max_iter=max_iter, tol=tol,
                                              check_every=check_every, residual_scale=scale,
                                              decoupled=system.decoupled,
                                              vector_kernels=vector_kernels,
                                              product=system.spd_product())
                for system in systems)
            # on a GPU the dots' other order may move a stop at tol by one sweep
            slack = 0 if device.type == "cpu" else 1
            assert abs(int(on_product.sweeps) - int(plain.sweeps)) <= slack
            assert int(plain.sweeps) > 3
            assert bool(on_product.diverged) == bool(plain.diverged) is False
            assert rel_err(on_product.solution.cpu(), plain.solution.cpu()) < 1e-5
            if int(on_product.sweeps) == int(plain.sweeps):
                assert torch.allclose(on_product.stats(), plain.stats(), rtol=1e-3)
            else:  # both stopped at tol, a sweep apart
                assert max(float(on_product.relative), float(plain.relative)) <= tol


def test_zero_width_solves_on_the_prepared_sweeps(device):
    """A signal with no channels through the row step and the row product (their buffers
    are empty tensors, which may share an address): every solver returns an empty solution,
    forward and adjoint."""
    x, ei, w = make_graph("symmetric", n=10, d=3, dtype=torch.float32)
    g = dk.build_graph(ei, x.size(0), w)
    wf, chi, kappa = g.fixed_laplacian("rw", x.dtype)
    system = dk.solvers.EquilibriumSystem(tb.TRITON, *to(device, g.rowptr, g.col, wf, chi,
                                                         kappa), 2.2)
    empty = torch.zeros(10, 0, device=device)
    for solver in ("fixed_point", "cg", "anderson"):
        for solve in (dk.solvers.solve_forward, dk.solvers.solve_adjoint):
            out = solve(system, empty, solver, max_iter=5, tol=1e-6, check_every=4)
            assert out.solution.shape == (10, 0) and not bool(out.diverged)


class _NoLaunch:
    """A Triton kernel whose launches do nothing (``kernel[grid](...)``)."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def test_solves_on_the_triton_sweeps_read_nothing_on_the_host(monkeypatch):
    """The host side of a Triton solve (the schedule, the prepared row step, row product and
    row map, their checks, the loops, cg's and anderson's Triton vector work) reads no value
    back to the host between flag checks: each read would be a device sync on a GPU. The
    Triton launches are stubbed (under the interpreter a launch itself copies its tensors to
    NumPy); the stubs leave the state as it is and anderson's map never converges, so every
    solve runs its max_iter sweeps and reads its flag exactly where check_every says."""
    pytest.importorskip("triton")
    from dignn_kernels.solvers import _triton_anderson, _triton_cg, cg_update
    from dignn_kernels.solvers.anderson_update import TritonAndersonVectors
    jit = tb._jit()
    monkeypatch.setattr(tb, "_require_device", lambda t: None)  # CPU tensors, nothing runs

    def csr_fma(sched, col, w, y, b, cy, rs, out, done=None, c=None, sums=jit.SUMS_NONE):
        torch.add(y, 0 if b is None else b, out=out)  # anderson's y -> y + x never converges
        return {jit.SUMS_NONE: None, jit.SUMS_DOTS: y.new_ones(4, y.shape[1]),
                jit.SUMS_NORMS: y.new_zeros(12, dtype=torch.float64)}[sums]

    monkeypatch.setattr(jit, "csr_fma", csr_fma)
    monkeypatch.setattr(jit, "fixed_point_update", lambda sums, state, history, k: None)
    monkeypatch.setattr(_triton_cg, "column_dots", lambda a, b: a.new_ones(a.shape[1]))
    monkeypatch.setattr(_triton_cg, "cg_step", lambda state, w, delta, done: (
        state.alpha_prev, state.r.new_ones(2, state.r.shape[1])))
    monkeypatch.setattr(_triton_cg, "cg_finish", lambda sums, flags, history, k: None)
    monkeypatch.setattr(cg_solver, "cg_update_for",
                        lambda rhs, kernels: cg_update.TritonCGUpdate)
    for name in [name for name in dir(_triton_anderson) if name.endswith("_kernel")]:
        monkeypatch.setattr(_triton_anderson, name, _NoLaunch())
    monkeypatch.setattr(anderson_solver, "anderson_vectors_for",
                        lambda rhs, window, kernels: TritonAndersonVectors(rhs, window))
    x, ei, w = make_graph("weighted", n=30, d=4, dtype=torch.float32)
    g = dk.build_graph(ei, x.size(0), w)
    wf, chi, kappa = g.fixed_laplacian("rw", x.dtype)
    for backend in (tb.TRITON, dataclasses.replace(tb.TRITON, row_product=None)):
        system = dk.solvers.EquilibriumSystem(backend, g.rowptr, g.col, wf, chi, kappa, 2.2)
        for solver in ("fixed_point", "cg", "anderson"):
            for solve in (dk.solvers.solve_forward, dk.solvers.solve_adjoint):
                for check_every, max_iter, reads in ((16, 15, 0), (0, 15, 0), (4, 9, 2)):
                    with HostReads() as counted:
                        solve(system, x, solver, max_iter=max_iter, tol=1e-6,
                              check_every=check_every)
                    assert counted.count == reads, (backend.row_product, solver, solve,
                                                    check_every)


STEP_SOLVES = [("symmetric", "rw", 2.2, 60, 1e-6, None), ("directed", "neural", 2.2, 8, 0.0,
                                                          None),
               ("symmetric", "rw", 0.5, 200, 0.0, None),
               ("directed", "rw", 2.2, 30, 1e-3, torch.bfloat16)]


@pytest.mark.parametrize("kind,laplacian,mu,max_iter,tol,storage", STEP_SOLVES)
def test_fixed_point_on_the_row_step_equals_the_row_pass_loop(device, kind, laplacian, mu,
                                                              max_iter, tol, storage):
    """The solvers' fixed point on the Triton row step (the norms from the sweep, done
    sweeps that write nothing) against the same loop on the Triton row pass: the same
    iterate bit for bit, sweeps, divergence flag and residuals, forward and adjoint, with
    the flag read every sweep, every 4 sweeps or never."""
    x, systems = system_on((tb.TRITON, dataclasses.replace(tb.TRITON, row_step=None)), device,
                           kind, laplacian, mu)
    assert systems[1].row_step_of(False, x, systems[1].mass) is None
    xd = x.to(device)
    for solve in (dk.solvers.solve_forward, dk.solvers.solve_adjoint):
        for check_every in (1, 4, 0):
            on_step, plain = (solve(system, xd, "fixed_point", max_iter=max_iter, tol=tol,
                                    check_every=check_every, storage_dtype=storage)
                              for system in systems)
            assert torch.equal(on_step.solution, plain.solution)
            assert int(on_step.sweeps) == int(plain.sweeps)
            assert bool(on_step.diverged) == bool(plain.diverged) == (mu < 1.0)
            rtol = 1e-5 if storage is None else 1e-3  # see tests/test_solvers.py
            assert torch.allclose(on_step.stats(), plain.stats(), rtol=rtol)


def test_opcheck_every_op(device):
    g, x, p, q, a, chi = graph_inputs("directed", n=10, d=3, h=2)
    t = dk.graph.transpose_csr(g.rowptr, g.col, g.num_nodes)
    w, kappa = ops.neural_edge_weights(g.rowptr, g.col, a, p, q)
    z, v = torch.randn_like(x), torch.randn_like(x)
    rp, cl, a, p, q, chi, x, z, v, w, kappa = to(device, g.rowptr, g.col, a, p, q, chi, x, z,
                                                  v, w, kappa)
    t = to(device, *t)
    req = lambda *ts: [u.clone().requires_grad_() for u in ts]  # noqa: E731
    cases = {
        "neural_edge_weights": [(rp, cl, a, p, q, 1e-6), (rp, cl, a, *req(p, q), 1e-6)],
        "neural_edge_weights_backward": [(rp, cl, a, p, q, 1e-6, torch.randn_like(w), *t)],
        "csr_fma": [(rp, cl, w, z, x, torch.randn_like(chi), torch.randn_like(chi))],
        "neural_weight_grad": [(rp, cl, a, p, q, z, v, 1e-6, *t), (rp, cl, a, p, q, z, v, 1e-6)],
    }
    assert set(cases) == {name for name in dir(torch.ops.dignn_triton)
                          if isinstance(getattr(torch.ops.dignn_triton, name),
                                        torch._ops.OpOverloadPacket)}
    for op_name, samples in cases.items():
        for args in samples:
            torch.library.opcheck(getattr(torch.ops.dignn_triton, op_name).default, args)


# ------------------------------------------------------------------------ the layer --

LAYER_CASES = [("symmetric", "neural"), ("directed", "neural"), ("symmetric", "rw"),
               ("directed", "rw"), ("isolated", "neural"), ("weighted", "sym"),
               ("duplicates", "unnormalized"), ("batch", "neural"), ("empty", "neural")]


@pytest.mark.parametrize("kind,laplacian", LAYER_CASES)
def test_layer_matches_cpu_backend(device, kind, laplacian):
    x, ei, w = make_graph(kind, n=24, d=5)
    cpu = make_layer(5, laplacian, max_iter=12, tol=1e-9, backend="cpu")
    tri = make_layer(5, laplacian, max_iter=12, tol=1e-9, backend="triton").to(device)
    tri.load_state_dict(cpu.state_dict())
    xa, xb = x.clone().requires_grad_(), x.to(device).requires_grad_()
    za, zb = cpu(xa, ei, w), tri(xb, *to(device, ei, w))
    assert tri.backend_used == "triton" and on_device(zb, device)
    assert rel_err(zb.cpu(), za) < 1e-12
    assert tri.iterations == cpu.iterations and tri.residual == pytest.approx(cpu.residual)
    g = torch.randn_like(za)
    ga = torch.autograd.grad(za, [xa] + list(cpu.parameters()), g)
    gb = torch.autograd.grad(zb, [xb] + list(tri.parameters()), g.to(device))
    for a_, b_ in zip(gb, ga):
        assert rel_err(a_.cpu(), b_) < 1e-11
    assert tri.backward_iterations == cpu.backward_iterations


def test_layer_matches_dense_solve_and_paper_reference(device):
    x, ei, w = make_graph("directed", n=24, d=5)
    layer = make_layer(5, "neural", max_iter=300, tol=1e-14, backend="triton").to(device)
    z = layer(x.to(device), ei.to(device))
    want, _ = reference.dense_equilibrium(x, ei, None, laplacian="neural", mu=layer.mu,
                                          eps=layer.eps, **{k: t.cpu() for k, t in
                                                            thetas(layer).items()})
    assert layer.iterations < 300 and rel_err(z.cpu(), want) < 1e-10
    layer.max_iter, layer.tol = 10, 0.0
    z = layer(x.to(device), ei.to(device))
    z_ref = reference.reference_implicit_diffusion(
        x, ei, None, laplacian="neural", mu=layer.mu, max_iter=10, tol=0.0,
        **{k: t.cpu() for k, t in thetas(layer).items()})
    assert rel_err(z.cpu(), z_ref) < 1e-12


def test_guard_zero_feature_rows(device):
    """chi = 0 rows (all-zero features) keep z_i = x_i with finite gradients, in float32 at
    the paper's settings with the default initialization."""
    x, ei, _ = make_graph("zero_rows", n=30, d=8, dtype=torch.float32)
    layer = dk.FusedImplicitDiffusion(8, mu=2.2, backend="triton").to(device)
    xr = x.to(device).requires_grad_()
    z = layer(xr, ei.to(device))
    zero = (x == 0).all(dim=1)
    assert zero.sum() >= 5 and torch.isfinite(z).all()
    assert torch.equal(z.detach().cpu()[zero], torch.zeros_like(x[zero]))
    z.square().sum().backward()
    assert torch.isfinite(xr.grad).all()
    assert all(torch.isfinite(t.grad).all() for t in layer.parameters())


@pytest.mark.parametrize("chunk", [3], indirect=True)
def test_deterministic_bitwise(device, chunk):
    """No atomics: the same inputs give the same bits, heavy rows included."""
    x, ei, w = make_graph("directed", n=40, d=6, dtype=torch.float32)
    layer = make_layer(6, dtype=torch.float32, backend="triton").to(device)
    outs = []
    for _ in range(2):
        xr = x.to(device).requires_grad_()
        z = layer(xr, *to(device, ei, w))
        outs.append([z.detach()] + list(torch.autograd.grad(z.square().sum(),
                                                            [xr] + list(layer.parameters()))))
    for a_, b_ in zip(*outs):
        assert torch.equal(a_, b_)


def test_low_precision_features(device):
    x, ei, _ = make_graph("symmetric", n=24, d=8, dtype=torch.float32)
    layer = make_layer(8, dtype=torch.float32, max_iter=12, backend="triton").to(device)
    x, ei = x.to(device), ei.to(device)
    z32 = layer(x, ei)
    for dt in (torch.float16, torch.bfloat16):
        z = layer(x.to(dt), ei)
        assert z.dtype == dt and rel_err(z.float(), z32) < 5e-2


def test_torch_compile(device):
    """Through torch.compile (AOTAutograd: the fake kernels and the registered autograd)."""
    x, ei, w = make_graph("directed", n=20, d=4, dtype=torch.float32)
    layer = make_layer(4, dtype=torch.float32, max_iter=8, backend="triton").to(device)
    x, ei = x.to(device), ei.to(device)
    compiled = torch.compile(layer, backend="aot_eager", fullgraph=False)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    za, zb = layer(xa, ei), compiled(xb, ei)
    assert rel_err(zb, za) < 1e-6
    za.square().sum().backward()
    zb.square().sum().backward()
    assert rel_err(xb.grad, xa.grad) < 1e-5


# ---------------------------------------------------------------------- bad input --

def test_bad_input_is_named(device):
    g, x, p, q, a, chi = to(device, *graph_inputs("symmetric"))
    rp, cl = g.rowptr.to(device), g.col.to(device)
    with pytest.raises(ValueError, match="mu must be a finite number > 0"):
        tk.implicit_diffusion(rp, cl, a, x, chi, p, q, mu=0.0)
    with pytest.raises(RuntimeError, match="x has 19 rows but the graph has 20 nodes"):
        tk.implicit_diffusion(rp, cl, a, x[:19], chi, p, q, mu=2.0)
    with pytest.raises(RuntimeError, match="p and q go together"):
        tk.implicit_diffusion(rp, cl, a, x, chi, p, None, mu=2.0)
    with pytest.raises(ValueError, match="max_iter must be an integer >= 1"):
        tk.implicit_diffusion(rp, cl, a, x, chi, p, q, mu=2.0, max_iter=0)
    with pytest.raises(RuntimeError, match="rowptr must be int64"):
        tk.neural_edge_weights(rp.int(), cl, a, p, q)
    with pytest.raises(RuntimeError, match="q must have dtype"):
        tk.neural_edge_weights(rp, cl, a, p, q.float())
    with pytest.raises(RuntimeError, match="x must be float32 or float64"):
        tk.diffusion_step(rp, cl, a, chi.half(), chi.half(), x.half(), x.half(), 2.0)
    with pytest.raises(RuntimeError, match="t_rowptr, t_col and t_perm go together"):
        tk.neural_weight_grad(rp, cl, a, p, q, x, x, 1e-6, rp)
    with pytest.raises(RuntimeError, match=r"c must have shape \[20\]"):
        tb.TRITON.row_step(rp, cl, a, x, chi, chi, chi[:3])
    with pytest.raises(RuntimeError, match="b must be float32 or float64"):
        tb.TRITON.row_step(rp, cl, a, x.half(), chi, chi, chi)
    step = tb.TRITON.row_step(rp, cl, a, x, chi, chi, chi)
    state, history = solve_state(device, 0.0, math.inf), x.new_zeros(8)
    with pytest.raises(RuntimeError, match="out must not be y"):
        step(x, x, state, history, 1)
    with pytest.raises(RuntimeError, match=r"out must be a contiguous buffer like y"):
        step(x, x[:, :4].clone(), state, history, 1)
    with pytest.raises(RuntimeError, match="out must be a contiguous buffer like y"):
        step(x, x.new_empty(5, 20).t(), state, history, 1)
    with pytest.raises(RuntimeError, match=r"y must have b's shape \[20, 5\]"):
        step(x[:3], torch.empty_like(x[:3]), state, history, 1)
    with pytest.raises(RuntimeError, match="state must be a contiguous 1-D float64 tensor"):
        step(x, torch.empty_like(x), state.float(), history, 1)
    with pytest.raises(RuntimeError, match="history must be a contiguous 1-D float64 tensor "
                                           "of at least 9 entries"):
        step(x, torch.empty_like(x), state, history, 9)
    with pytest.raises(RuntimeError, match=r"cy must have shape \[20\]"):
        tb.TRITON.row_map(rp, cl, a, chi[:3], chi)
    with pytest.raises(RuntimeError, match="w must be float32 or float64"):
        tb.TRITON.row_map(rp, cl, a.half(), chi.half(), chi.half())
    row_map = tb.TRITON.row_map(rp, cl, a, chi, chi)
    with pytest.raises(RuntimeError, match="y must have dtype torch.float64"):
        row_map(x.float(), x)
    with pytest.raises(RuntimeError, match="y has 3 rows but the graph has 20 nodes"):
        row_map(x[:3], x[:3])
    with pytest.raises(RuntimeError, match=r"b must have shape \[20, 5\]"):
        row_map(x, x[:, :2])
    with pytest.raises(RuntimeError, match="y must be 2-D"):
        row_map(x[:, 0], x[:, 0])
    with pytest.raises(RuntimeError, match=r"rs must have shape \[20\]"):
        tb.TRITON.row_product(rp, cl, a, chi, chi[:4])
    product = tb.TRITON.row_product(rp, cl, a, chi, chi)
    with pytest.raises(RuntimeError, match=r"y must be a \[20, d\] tensor of w's dtype"):
        product(x.float(), torch.empty_like(x.float()), state)
    with pytest.raises(RuntimeError, match="out must not be y"):
        product(x, x, state)
    with pytest.raises(RuntimeError, match="out must be a contiguous buffer like y"):
        product(x, x.new_empty(5, 20).t(), state)
    with pytest.raises(RuntimeError, match="done must be a flag tensor"):
        product(x, torch.empty_like(x), state[:0])


def test_availability_is_reported(monkeypatch):
    assert tb.available("cpu") == tb.interpreted()
    assert not tb.available("meta")
    assert tb.available("cuda") == (HAS_CUDA and tb._triton_installed())
    assert dk.backends.get_backend("triton") is tb.TRITON
    backends = dk.available_backends(torch.device("cpu"))
    assert backends[:2] == ("cpu", "torch") and ("triton" in backends) == tb.interpreted()
    monkeypatch.setitem(dk.backends._REGISTRY, "triton",
                        dataclasses.replace(tb.TRITON, available=lambda device: False))
    assert "triton" not in dk.available_backends(torch.device("cpu"))
    layer = dk.FusedImplicitDiffusion(3, backend="triton")
    with pytest.raises(RuntimeError, match="backend='triton' cannot run on cpu.*TRITON_INTERPRET"):
        layer(torch.randn(4, 3), torch.tensor([[0, 1], [1, 0]]))


def test_graph_without_nodes(device):
    rowptr = torch.zeros(1, dtype=torch.int64, device=device)
    col = torch.zeros(0, dtype=torch.int32, device=device)
    x = torch.zeros(0, 3, dtype=torch.float64, device=device, requires_grad=True)
    p = torch.zeros(0, 2, dtype=torch.float64, device=device, requires_grad=True)
    empty = torch.zeros(0, dtype=torch.float64, device=device)
    z, stats = tk.implicit_diffusion(rowptr, col, empty, x, empty, p, p, mu=2.0)
    assert z.shape == (0, 3) and float(stats[0]) == 1
    gx, gp = torch.autograd.grad(z.sum(), [x, p], allow_unused=True)
    assert gx.shape == (0, 3) and gp.shape == (0, 2)


# ------------------------------------------------------------------------- GPU only --

@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_cuda_solve_never_syncs_with_the_host():
    """Once the graph's schedule exists, a forward + backward of the op (10 iterations each,
    fewer than CHECK_EVERY) makes no host sync (CUDA sync debug mode turns any into an
    error) when the caller vouches for the graph and reads no stats (the data check and the
    divergence warning each read a value back by design)."""
    g, x, p, q, a, chi = to("cuda", *graph_inputs("directed", n=200, d=16, h=8,
                                                  dtype=torch.float32))
    t = to("cuda", *g.transposed())
    rp, cl = g.rowptr.to("cuda"), g.col.to("cuda")
    x.requires_grad_()

    def run():
        z, stats = tk.implicit_diffusion(rp, cl, a, x, chi, p, q, mu=3.0, max_iter=10,
                                         tol=1e-6, t_rowptr=t[0], t_col=t[1], t_perm=t[2],
                                         trusted=True, host_checks=False)
        (gx,) = torch.autograd.grad(z, [x], torch.ones_like(z))
        return z, gx

    want = run()  # builds and caches the schedules
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = run()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for a_, b_ in zip(got, want):
        assert torch.equal(a_, b_)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_cuda_graph_capture_and_replay():
    """The whole forward solve (device-side convergence included) captured in a CUDA graph:
    a replay on new features gives what an eager solve gives."""
    g, x, p, q, a, chi = to("cuda", *graph_inputs("symmetric", n=300, d=16, h=8,
                                                  dtype=torch.float32))
    rp, cl = g.rowptr.to("cuda"), g.col.to("cuda")
    static_x = x.clone()

    def solve():
        return tk.implicit_diffusion(rp, cl, a, static_x, chi, p, q, mu=3.0, max_iter=30,
                                     tol=1e-5)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        solve()  # warm-up: compiles the kernels, caches schedules and constants
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        z_static, stats_static = solve()
    new_x = torch.randn_like(x)
    static_x.copy_(new_x)
    graph.replay()
    z_eager, stats_eager = tk.implicit_diffusion(rp, cl, a, new_x, chi, p, q, mu=3.0,
                                                 max_iter=30, tol=1e-5)
    assert torch.equal(z_static, z_eager) and torch.equal(stats_static, stats_eager)
    assert 2 < float(stats_eager[0]) < 30


# ------------------------------------------------------------- compiled for the GPU --

COMPILE_SCRIPT = r"""
import os, re, subprocess
import torch, triton
import triton.backends.nvidia
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import dignn_kernels as dk
from dignn_kernels import ops
from dignn_kernels.backends import _triton_jit as jit, triton as tb

assert not jit.INTERPRETED
tb._require_device = lambda t: None  # launches on CPU tensors are recorded, never run
object.__setattr__(tb.TRITON, "available", lambda device=None: True)  # (the entry's check)
tb.available = lambda device=None: True  # (its solves' Triton vector kernels: cg_update)
TYPES = {torch.float32: "fp32", torch.float64: "fp64", torch.int32: "i32", torch.int64: "i64",
         torch.uint8: "u8", torch.bfloat16: "bf16", torch.float16: "fp16", torch.bool: "i1"}
variants = {}


class Recorder:
    def __init__(self, fn):
        self.fn = fn

    def __getitem__(self, grid):
        def record(*args, **kwargs):
            sig, consts, attrs = {}, {}, {}
            for i, name in enumerate(self.fn.arg_names):
                value = args[i] if i < len(args) else kwargs[name]
                if self.fn.params[i].is_constexpr:
                    sig[name], consts[name] = "constexpr", value
                elif isinstance(value, torch.Tensor):  # fresh allocations: 16-byte aligned
                    sig[name], attrs[(i,)] = "*" + TYPES[value.dtype], [["tt.divisibility", 16]]
                elif isinstance(value, int) and value == 1 and \
                        not self.fn.params[i].do_not_specialize:
                    sig[name], consts[name] = "constexpr", 1  # the JIT makes a 1 a constant
                else:  # as the JIT specializes an int: divisible by 16 or not
                    sig[name] = "i32"
                    if isinstance(value, int) and value % 16 == 0 and value and \
                            not self.fn.params[i].do_not_specialize:
                        attrs[(i,)] = [["tt.divisibility", 16]]
            key = (self.fn.__name__, repr(sorted(sig.items())), repr(sorted(consts.items())),
                   repr(sorted(attrs)))
            variants[key] = (self.fn, sig, consts, attrs, kwargs.get("num_warps", 4))
        return record


from dignn_kernels.solvers import _triton_anderson as anderson_jit, _triton_cg as cg_jit, \
    anderson_update, cg_update
for module in (jit, cg_jit, anderson_jit):
    for name in dir(module):
        if name.endswith("_kernel"):
            setattr(module, name, Recorder(getattr(module, name)))

for d, h in ((64, 64), (131, 67)):  # one tile; several channel tiles and metric blocks
    for kind in ("symmetric", "directed"):
        gen = torch.Generator().manual_seed(0)
        ei = torch.randint(0, 300, (2, 3000), generator=gen)  # rows of more than 64 edges
        ei = torch.cat([ei, ei.flip(0)], 1) if kind == "symmetric" else ei
        g = dk.build_graph(ei, 300)
        x = torch.randn(300, d, requires_grad=True)
        p, q = (torch.randn(300, h, requires_grad=True) for _ in range(2))
        a, deg = g.values(torch.float32)
        chi = deg.clone().requires_grad_()
        t = g.transposed() or (None, None, None)
        solver = dict(mu=2.0, max_iter=3, tol=1e-6, t_rowptr=t[0], t_col=t[1], t_perm=t[2],
                      backend="triton", host_checks=False)  # (no kernel runs: no stats)
        z, _ = dk.implicit_diffusion(g.rowptr, g.col, a, x, chi, p, q, **solver)
        z.sum().backward()
        w, kappa, _ = g.fixed_laplacian("rw", torch.float32)
        z, _ = dk.implicit_diffusion(g.rowptr, g.col, w, x, chi, None, None, None, **solver)
        z.sum().backward()
        if kind == "symmetric":  # cg's sweep: the row product (no b, the dots w.u)
            dk.implicit_diffusion(g.rowptr, g.col, w, x.detach(), chi.detach(), None, None,
                                  None, **dict(solver, solver="cg"))
        dk.implicit_diffusion(g.rowptr, g.col, a, x, chi, p, q, **dict(solver, max_iter=1))
        for storage in (torch.bfloat16, torch.float16):  # 16-bit iterates
            z, _ = dk.implicit_diffusion(g.rowptr, g.col, a, x, chi, p, q,
                                         storage_dtype=storage, **solver)
            z.sum().backward()
        w, kappa = ops.neural_edge_weights(g.rowptr, g.col, a, p, q, backend="triton")
        (w.sum() + kappa.sum()).backward()
# the cg vector update and its bookkeeping (what a cg solve launches on a GPU)
for dtype in (torch.float32, torch.float64):
    rhs = torch.randn(300, 64, dtype=dtype)
    st = cg_update.CGState.start(rhs, torch.rand(300, dtype=dtype) + 0.5, None, None)
    delta = cg_jit.column_dots(rhs, st.u)
    flags = cg_update.cg_flags(*torch.ones(3, dtype=torch.float64))
    cg_jit.cg_step(st, rhs, delta, flags)
    cg_jit.cg_finish(torch.rand(2, 64, dtype=dtype), flags, torch.zeros(9).double(), 3)
    for m in (1, 5, 16):  # anderson's small SPD solves (windows of 1, the default, the most)
        anderson_jit.small_spd_solve(torch.eye(m, dtype=dtype).repeat(64, 1, 1),
                                     torch.ones(64, m, dtype=dtype))
    window = [torch.zeros(5, 300, 64, dtype=dtype) for _ in range(2)]  # anderson's dF, dG
    for slot, count in ((2, 3), (1, 1)):  # (a 1 is a constant unless not specialized)
        anderson_jit.window_record(rhs, rhs, rhs, rhs, *window, slot, count)
    anderson_jit.window_mix(rhs, window[1], torch.ones(5, 64, dtype=dtype), 3)
    for m in (1, 5, 16):  # anderson's gamma (windows of 1, the default, the most)
        anderson_jit.anderson_gamma(torch.eye(m, dtype=torch.float64).repeat(64, 1, 1),
                                    torch.ones(m, 64, dtype=torch.float64), 1e-6, dtype)
state = anderson_update.anderson_state(*torch.ones(3, dtype=torch.float64))
anderson_jit.anderson_finish(torch.ones(7, 64, dtype=torch.float64), 3, 2,
                             torch.zeros(64, 5, 5, dtype=torch.float64),
                             torch.zeros(5, 64, dtype=torch.float64), state,
                             torch.zeros(9, dtype=torch.float64), 3)

target = GPUTarget("cuda", 90, 32)
cuobjdump = getattr(getattr(triton, "knobs", None), "nvidia", None)
cuobjdump = cuobjdump.cuobjdump.path if cuobjdump is not None else os.path.join(
    os.path.dirname(triton.backends.nvidia.__file__), "bin", "cuobjdump")
spilled = []
for (name, _, _, _), (fn, sig, consts, attrs, warps) in sorted(variants.items()):
    try:
        kernel = triton.compile(ASTSource(fn, sig, consts, attrs), target=target,
                                options={"num_warps": warps})
    except Exception as err:
        raise SystemExit(f"{name} {consts} does not compile for sm_90: {err}")
    # registers spilled to local memory show as a stack frame in ptxas's resource usage
    with open("kernel.cubin", "wb") as cubin:
        cubin.write(kernel.asm["cubin"])
    usage = subprocess.run([cuobjdump, "-res-usage", "kernel.cubin"], capture_output=True,
                           text=True, check=True).stdout
    regs, stack = map(int, re.search(r"REG:(\d+) STACK:(\d+)", usage).groups())
    print(f"{name} {consts} num_warps={warps}: {regs} registers, stack {stack} bytes")
    if stack:
        spilled.append(f"{name} {consts}: {stack} bytes")
if spilled:
    raise SystemExit("kernels that spill registers for sm_90: " + "; ".join(spilled))
launched = {name for name, _, _, _ in variants}
every = {name for module in (jit, cg_jit, anderson_jit) for name in dir(module)
         if name.endswith("_kernel")}
if every - launched:
    raise SystemExit(f"kernels this script never launched: {sorted(every - launched)}")
print("compiled", len(variants), "kernel variants")
"""


@pytest.mark.slow  # a subprocess or a compile: seconds; `-m "not slow"` leaves it out
def test_kernels_compile_for_the_gpu(tmp_path):
    """Without a GPU the kernels otherwise only ever run in the interpreter, which accepts
    code the compiler rejects (a Python global read inside a kernel, a float64 operand a
    float32-only instruction gets): compile every variant that a forward and backward
    launch (neural and fixed weights, symmetric and directed graphs, one tile and several)
    and the solvers' vector kernels to sm_90 machine code, with Triton's compiler and
    ptxas, no GPU needed, specialized as the JIT specializes them (integers divisible by
    16); every kernel of the three modules is among them, and none spills registers to
    local memory (a stack frame in the cubin's resource usage: the cg step's 64-row tile
    of ten float64 vectors spilled 1 KB per thread, the Anderson record's 224 bytes, four
    16 x 16 Cholesky factorizations 500 bytes). On a GPU machine it checks the spills with
    that machine's Triton (the kernels phase of `bash bench/gpu_session.sh` runs it with
    ``-s``, which prints every variant's registers)."""
    pytest.importorskip("triton.backends.compiler")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")
    proc = subprocess.run([sys.executable, "-c", COMPILE_SCRIPT], env=env, cwd=tmp_path,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    print(proc.stdout)  # every variant's registers and stack (shown with -s)
    assert int(proc.stdout.split("compiled ")[1].split()[0]) >= 20
