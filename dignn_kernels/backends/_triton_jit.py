"""The Triton kernels of the ``triton`` backend and their launchers (needs ``triton``).

Every kernel implements a formula of ``csrc/dignn/laplacian_math.h``; the docstring of each says
which. :mod:`dignn_kernels.backends.triton` wraps the launchers into ``torch.library`` custom
ops; this module only knows CSR rows and tiles.

Work decomposition (the same for every pass; the vocabulary and constants of
:mod:`dignn_kernels.backends.schedule`, shared with the CUDA kernels). A CSR row's edges are
cut into *segments* of at most ``segment_edges`` edges: a row of degree 1 is one segment, a
row of degree 5,000 is ceil(5000 / segment_edges) segments. The segments are sorted by
length, longest first, and a program takes ``ROWS`` consecutive segments as the rows of a 2-D
tile (segments x channels): each step of its edge loop gathers one neighbour row per segment,
so the loop runs for the longest segment of the tile, at most ``segment_edges`` steps, and
neighbouring programs have segments of about the same length (little masked work). A segment
that covers a whole row finishes it in the kernel (the row's epilogue). The segments of a
*heavy row* (more than ``segment_edges`` edges) write their partial sums to a scratch slot,
and a second kernel adds a row's slots in slot order and runs the epilogue. So the heaviest
row of a power-law graph costs a few full segments spread over the grid instead of one
program looping over thousands of edges, nothing is accumulated with atomics, and every sum
is taken in an order fixed by the graph alone: results are the same bit for bit from run to
run. (Bucketing rows by degree alone would still leave one program per heavy row; merge-path
splitting would need a segmented scan; fixed-length segments keep both the kernel and its
order simple.) The schedule is built on the device without a host sync (its sizes are bounds
computed from n and m), so it can be built inside a captured CUDA graph.

Channels are the second tile axis (``BLOCK_D`` <= 128 wide, a second grid axis beyond that);
the per-edge scalars pi = p_i . p_j, rho = ||q_i - q_j|| and G_ij are reduced over full rows
in ``BLOCK_H``/``BLOCK_D`` pieces. Accumulation is in the compute dtype, that of the edge
values, the row coefficients and the gradients: float32 (the layer computes float16/bfloat16
inputs in float32) or float64.

16-bit storage (the solve's ``storage_dtype``): the iterates y, z, v and the projections p, q
may be bfloat16 or float16. Every load of them is converted to the compute dtype at once
(``.to(ACC)``, ACC the dtype of a compute-dtype argument), every sum runs there, and the row
pass's output is rounded to nearest on its store (:func:`_storage_value`); scratch partial
sums, w, kappa and the gradients stay in the compute dtype.

The row-pass kernels also take a ``done`` flag and write per-program partial sums of the
step as stored: ||out - y||^2, ||out||^2 and sum_i c_i ||out_i||^2 for per-row weights c (the
fixed point's stopping test and divergence certificate, :func:`dignn_kernels.solvers.fixed_point`).
Once the flag is set a kernel loads and stores nothing and its partial sums are 0: a converged
solve's later sweeps leave their output buffer as it was (the backend's ``row_step``, whose
flag is the first element of the solve's state, and whose bookkeeping is
:func:`_fixed_point_update_kernel`).
"""
import torch
import triton
import triton.language as tl

from ..laplacian import CHI_FLOOR  # rows with chi <= CHI_FLOOR are guarded
from ..solver_state import (DIVERGED, DONE, FP_BOUND, FP_RELATIVE, FP_TINY, FP_TOL, RESIDUAL,
                            SWEEPS)
from .interface import ROW_STEP_SUMS

_CHI_FLOOR = tl.constexpr(CHI_FLOOR)  # the same, readable inside kernels


@triton.jit
def _probe():
    pass


# True when the kernels of this module are defined under TRITON_INTERPRET=1: they then run on
# CPU tensors, in NumPy, slowly (for tests). (What triton.jit returned says it in every version.)
INTERPRETED = not isinstance(_probe, triton.runtime.jit.JITFunction)
# The interpreter converts float32 to bfloat16 by truncation (triton 3.8), the GPU (and
# torch) round to nearest even: under the interpreter the kernels round by hand.
_BF16_BY_BITS = tl.constexpr(INTERPRETED)

# Where tanh switches from its odd Taylor polynomial to (1 - e) / (1 + e), e = exp(-2|x|):
# the polynomial (to x^17) is within half an ulp below these arguments, and the exp form
# loses at most a few ulp above them.
_TANH_SMALL = {torch.float32: 0.625, torch.float64: 0.1}

MAX_BLOCK_D = 128  # widest channel tile of the step kernels
MAX_BLOCK_H = 64  # widest tile of the metric channels (p, q) and of the gradient outputs
MAX_BLOCK_G = 64  # channel piece of the G_ij = v . (z_j - z_i) reductions

# The partial sums a row pass writes besides its output (csr_fma's `sums`, the kernels' SUMS):
# none (the plain pass and the row map), the fixed point's norms (the row step), cg's dots
# out.y (the row product).
SUMS_NONE, SUMS_NORMS, SUMS_DOTS = 0, 1, 2


def _pow2(n: int, cap: int) -> int:
    return max(1, min(triton.next_power_of_2(max(int(n), 1)), cap))


def _warps(rows: int, width: int) -> int:
    """Warps for a rows x width tile: 4 to 8 elements of each tile per thread. At h = d = 64
    the sm_90 builds took 48 registers (row pass), 64 (the neural pass, when it also made a
    step) and 77 (gradient pass) per thread, none spilled: enough resident warps to keep the
    gathers in flight."""
    return max(1, min(8, rows * width // 128))


# ------------------------------------------------------------------ device math --

@triton.jit
def _tanh_sech2(x, SMALL: tl.constexpr):
    """tanh(x) and 1 - tanh(x)^2 for x >= 0, both to full relative precision: the odd
    Taylor series below SMALL, (1 - e) / (1 + e) and 4 e / (1 + e)^2 with e = exp(-2x) above
    (laplacian_math.h tanh_sech2; no expm1 in Triton, hence the series)."""
    use_small = x < SMALL
    xs = tl.where(use_small, x, 0.0)  # keeps the unused polynomial from overflowing
    x2 = xs * xs
    poly = x2 * (6404582.0 / 10854718875.0) - 929569.0 / 638512875.0
    poly = poly * x2 + 21844.0 / 6081075.0
    poly = poly * x2 - 1382.0 / 155925.0
    poly = poly * x2 + 62.0 / 2835.0
    poly = poly * x2 - 17.0 / 315.0
    poly = poly * x2 + 2.0 / 15.0
    poly = poly * x2 - 1.0 / 3.0
    small = xs + xs * x2 * poly
    e = tl.exp(-2.0 * x)
    large = (1.0 - e) / (1.0 + e)
    t = tl.where(use_small, small, large)
    s2 = tl.where(use_small, 1.0 - small * small, 4.0 * e / ((1.0 + e) * (1.0 + e)))
    return t, s2


@triton.jit
def _sqrt(x, F64: tl.constexpr):
    """Correctly rounded square root (tl.sqrt_rn is float32 only; float64 sqrt is exact)."""
    if F64:
        return tl.sqrt(x)
    else:
        return tl.sqrt_rn(x)


@triton.jit
def _pair_offsets(row_i, row_j, mask, first, width, BLOCK: tl.constexpr):
    """Channels [first, first + BLOCK) of rows i and j of a row-major [*, width] matrix, for a
    vector of edges: (mask, offsets of row i, offsets of row j)."""
    cols = first + tl.arange(0, BLOCK)
    m2 = mask[:, None] & (cols < width)[None, :]
    return m2, row_i[:, None] * width + cols[None, :], row_j[:, None] * width + cols[None, :]


@triton.jit
def _pi_rho(p, q, row_i, row_j, mask, H, ACC: tl.constexpr, BLOCK_H: tl.constexpr,
            NUM_H_BLOCKS: tl.constexpr, F64: tl.constexpr):
    """pi_ij = p_i . p_j and rho_ij = ||q_i - q_j|| (eq. 13, 14) for a vector of edges, in
    the dtype ACC."""
    pi = tl.zeros(row_i.shape, dtype=ACC)
    rho2 = tl.zeros(row_i.shape, dtype=ACC)
    for hb in tl.static_range(NUM_H_BLOCKS):
        m2, off_i, off_j = _pair_offsets(row_i, row_j, mask, hb * BLOCK_H, H, BLOCK_H)
        pi += tl.sum(tl.load(p + off_i, mask=m2, other=0.0).to(ACC) *
                     tl.load(p + off_j, mask=m2, other=0.0).to(ACC), axis=1)
        dq = tl.load(q + off_i, mask=m2, other=0.0).to(ACC) - \
            tl.load(q + off_j, mask=m2, other=0.0).to(ACC)
        rho2 += tl.sum(dq * dq, axis=1)
    return pi, _sqrt(rho2, F64)


@triton.jit
def _load_tile(ptr, rows, mask, cols, width, ACC: tl.constexpr):
    """Rows `rows` (int64) of a row-major [*, width] matrix, channels `cols` (masked), in
    the dtype ACC (16-bit storage is widened here)."""
    return tl.load(ptr + rows[:, None] * width + cols[None, :],
                   mask=mask[:, None] & (cols < width)[None, :], other=0.0).to(ACC)


@triton.jit
def _storage_value(o, out):
    """o rounded to nearest (even) in the element dtype of `out`, the value to store there.
    bfloat16 under the interpreter by hand on the float32 bits (its own cast truncates);
    elsewhere the cast, which rounds to nearest on the GPU."""
    if _BF16_BY_BITS and out.dtype.element_ty == tl.bfloat16:
        bits = o.to(tl.float32).to(tl.uint32, bitcast=True)
        bits = bits + (0x7FFF + ((bits >> 16) & 1))
        return (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        return o.to(out.dtype.element_ty)


@triton.jit
def _pi_rho_tile(p_i, q_i, p_j, q_j, F64: tl.constexpr):
    """pi_ij and rho_ij (eq. 13, 14) from tiles of whole rows (h <= BLOCK_H)."""
    dq = q_i - q_j
    return tl.sum(p_i * p_j, axis=1), _sqrt(tl.sum(dq * dq, axis=1), F64)


@triton.jit
def _program_entries(entry_row, num_entries, pid, ROWS: tl.constexpr):
    """The ROWS entries (segments, heavy rows) of program `pid`: (entry index, row, valid);
    padding entries (row -1) and those past the end are invalid."""
    entries = pid * ROWS + tl.arange(0, ROWS)
    in_range = entries < num_entries
    row = tl.load(entry_row + entries, mask=in_range, other=-1)
    return entries, row, in_range & (row >= 0)


@triton.jit
def _load_segments(seg_row, seg_start, seg_len, seg_slot, num_segs, pid, done,
                ROWS: tl.constexpr):
    """The ROWS segments of program `pid`: (row, first edge, length, slot, valid). Once the
    solve has converged (`done`) the lengths are 0: the step gathers nothing."""
    segments, row, valid = _program_entries(seg_row, num_segs, pid, ROWS)
    start = tl.load(seg_start + segments, mask=valid, other=0)
    length = tl.load(seg_len + segments, mask=valid, other=0)
    length = tl.where(done != 0, 0, length)
    slot = tl.load(seg_slot + segments, mask=valid, other=-1)
    return row, start, length, slot, valid


@triton.jit
def _load_edge(col, a, start, length, e):
    """Edge e of each segment: (mask, edge index k, neighbour j as int64, a_k); the masked
    segments (shorter than e + 1 edges) read j = 0 and a_k = 0."""
    emask = e < length
    k = start + e
    j = tl.load(col + k, mask=emask, other=0).to(tl.int64)
    a_k = tl.load(a + k, mask=emask, other=0.0)
    return emask, k, j, a_k


@triton.jit
def _load_heavy_rows(heavy_row, heavy_first, heavy_count, num_heavy, pid, ROWS: tl.constexpr):
    """The ROWS heavy rows of program pid: (row, valid, first slot, slot count); padding and
    out-of-range entries are invalid with no slots."""
    rows_here, row, valid = _program_entries(heavy_row, num_heavy, pid, ROWS)
    first = tl.load(heavy_first + rows_here, mask=valid, other=0)
    count = tl.load(heavy_count + rows_here, mask=valid, other=0)
    return row, valid, first, count


@triton.jit
def _store_step(o, y_i, out, off, m2, done, c_i):
    """Stores the step's tile o in out's dtype, unless the solve is done (then nothing), and
    returns the stored tile's partial sums ||o - y||^2, ||o||^2 and sum_i c_i ||o_i||^2
    (0 once done)."""
    m2 = m2 & (done == 0)
    stored = _storage_value(o, out)
    tl.store(out + off, stored, mask=m2)
    o = stored.to(y_i.dtype)
    diff = tl.where(m2, o - y_i, 0.0)
    o = tl.where(m2, o, 0.0)
    diff_sq = tl.sum(tl.sum(diff * diff, axis=1), axis=0)
    row_sq = tl.sum(o * o, axis=1)
    return diff_sq, tl.sum(row_sq, axis=0), tl.sum(c_i * row_sq, axis=0)


@triton.jit
def _store_product(o, y_i, out, off, m2, done):
    """Stores the product's tile o in out's dtype, unless the solve is done (then nothing),
    and returns the tile's per-channel sums of o_i * y_i, the stored output against the
    iterate (cg's delta = w.u for w = A u; 0 once done)."""
    m2 = m2 & (done == 0)
    stored = _storage_value(o, out)
    tl.store(out + off, stored, mask=m2)
    return tl.sum(tl.where(m2, stored.to(y_i.dtype) * y_i, 0.0), axis=0)


@triton.jit
def _step_epilogue(acc, row, rmask, cols, cmask, y, b, cy, rs, c, out, done, D,
                   HAS_C: tl.constexpr, HAS_B: tl.constexpr, SUMS: tl.constexpr):
    """out_i = b_i + cy_i y_i + rs_i (W y)_i for whole rows (eq. iter, row form
    z_i <- x_i + cy_i z_i + rs_i (W Z)_i; b = 0 without HAS_B), nothing once done; returns
    the tile's partial sums as SUMS says: SUMS_DOTS its per-channel sums of out_i * y_i
    (:func:`_store_product`), SUMS_NORMS those of :func:`_store_step` (c: the per-row
    weights, 0 without HAS_C), SUMS_NONE none (the plain pass: nothing reduced)."""
    r64 = row.to(tl.int64)
    off = r64[:, None] * D + cols[None, :]
    live = rmask & (done == 0)
    m2 = live[:, None] & cmask[None, :]
    y_i = tl.load(y + off, mask=m2, other=0.0).to(cy.dtype.element_ty)
    cy_i = tl.load(cy + r64, mask=live, other=0.0)
    o = cy_i[:, None] * y_i
    if HAS_B:
        o = tl.load(b + off, mask=m2, other=0.0).to(cy.dtype.element_ty) + o
    o = o + tl.load(rs + r64, mask=live, other=0.0)[:, None] * acc
    if SUMS == 0:  # SUMS_NONE (the constexpr values of SUMS_*)
        tl.store(out + off, _storage_value(o, out), mask=m2)
        return 0.0
    elif SUMS == 2:
        return _store_product(o, y_i, out, off, m2, done)
    else:
        if HAS_C:
            c_i = tl.load(c + r64, mask=live, other=0.0)
        else:
            c_i = tl.zeros_like(cy_i)
        return _store_step(o, y_i, out, off, m2, done, c_i)


@triton.jit
def _load_done(done_ptr):
    """The done flag as an int32 scalar, 0 or 1, whatever the flag's dtype (a solve's float64
    state, a uint8 or an int32 flag): the interpreter keeps a comparison's operand dtype, and
    a float64 scalar cannot be and-ed with a row mask there."""
    return (tl.load(done_ptr) != 0).to(tl.int32)


@triton.jit
def _store_norms(part, index, diff_sq, out_sq, weighted_sq):
    """Program `index`'s ROW_STEP_SUMS partial sums: ||out - y||^2, ||out||^2 and
    sum_i c_i ||out_i||^2."""
    tl.store(part + 3 * index, diff_sq.to(tl.float64))
    tl.store(part + 3 * index + 1, out_sq.to(tl.float64))
    tl.store(part + 3 * index + 2, weighted_sq.to(tl.float64))


@triton.jit
def _store_sums(part, pid, pid_d, cols, cmask, D, sums, SUMS: tl.constexpr):
    """The row program `pid`'s partial sums (of channel tile pid_d): SUMS_DOTS its
    per-channel sums out.y, row `pid` of a [programs, D] table in the compute dtype;
    SUMS_NORMS its ROW_STEP_SUMS norms (:func:`_store_norms`) at index pid * tiles + pid_d;
    SUMS_NONE nothing."""
    if SUMS == 2:
        tl.store(part + pid.to(tl.int64) * D + cols, sums, mask=cmask)
    elif SUMS == 1:
        diff_sq, out_sq, weighted_sq = sums
        _store_norms(part, pid * tl.num_programs(1) + pid_d, diff_sq, out_sq, weighted_sq)


# ------------------------------------------------------------------ the row step --

@triton.jit
def _csr_fma_kernel(seg_row, seg_start, seg_len, seg_slot, num_segs, col, w, y, b, cy,
                    rs, c, out, scratch, part, done_ptr, D, HAS_C: tl.constexpr,
                    HAS_B: tl.constexpr, HAS_DONE: tl.constexpr, SUMS: tl.constexpr,
                    ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
    """The generic row pass out = b + cy.y + rs.(W y) (laplacian_math.h, forward step with
    b = x, cy = -kappa rs, rs = 1/(mu chi), W; adjoint step u <- g + cy.u + W^T (rs.u) with
    the transposed CSR, weights W_ij rs_i and rs = 1). Whole-row segments finish their rows;
    segments of heavy rows leave (W y) partial sums in `scratch` for
    :func:`_csr_fma_combine_kernel`. Without HAS_DONE the pass always runs (no flag read);
    SUMS picks the partial sums it writes to `part` (:func:`_step_epilogue`)."""
    pid = tl.program_id(0)
    pid_d = tl.program_id(1)
    done = _load_done(done_ptr) if HAS_DONE else 0
    row, start, length, slot, valid = _load_segments(seg_row, seg_start, seg_len, seg_slot,
                                                   num_segs, pid, done, ROWS)
    cols = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    cmask = cols < D
    acc = tl.zeros([ROWS, BLOCK_D], dtype=cy.dtype.element_ty)
    # Two edges per step: both gathers are in flight before either is used (a warp issues
    # in order, so this doubles the bytes it has requested while it waits).
    for e in range(0, tl.max(length, axis=0), 2):
        m0 = e < length
        m1 = e + 1 < length
        k = start + e
        j0 = tl.load(col + k, mask=m0, other=0).to(tl.int64)
        j1 = tl.load(col + k + 1, mask=m1, other=0).to(tl.int64)
        w0 = tl.load(w + k, mask=m0, other=0.0)
        w1 = tl.load(w + k + 1, mask=m1, other=0.0)
        y0 = tl.load(y + j0[:, None] * D + cols[None, :], mask=m0[:, None] & cmask[None, :],
                     other=0.0).to(cy.dtype.element_ty)
        y1 = tl.load(y + j1[:, None] * D + cols[None, :], mask=m1[:, None] & cmask[None, :],
                     other=0.0).to(cy.dtype.element_ty)
        acc += w0[:, None] * y0
        acc += w1[:, None] * y1
    whole = valid & (slot < 0)
    sums = _step_epilogue(acc, row, whole, cols, cmask, y, b, cy, rs, c, out, done, D, HAS_C,
                          HAS_B, SUMS)
    _store_sums(part, pid, pid_d, cols, cmask, D, sums, SUMS)
    partial = valid & (slot >= 0) & (done == 0)
    tl.store(scratch + slot.to(tl.int64)[:, None] * D + cols[None, :], acc,
             mask=partial[:, None] & cmask[None, :])


@triton.jit
def _csr_fma_combine_kernel(heavy_row, heavy_first, heavy_count, num_heavy, y, b, cy, rs, c,
                            out, scratch, part, part_offset, done_ptr, D,
                            HAS_C: tl.constexpr, HAS_B: tl.constexpr, HAS_DONE: tl.constexpr,
                            SUMS: tl.constexpr, ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
    """Rows longer than one segment: (W y)_i = sum of the row's scratch slots in slot order,
    then the same epilogue as :func:`_csr_fma_kernel`."""
    pid = tl.program_id(0)
    pid_d = tl.program_id(1)
    done = _load_done(done_ptr) if HAS_DONE else 0
    row, valid, first, count = _load_heavy_rows(heavy_row, heavy_first, heavy_count,
                                                num_heavy, pid, ROWS)
    count = tl.where(done != 0, 0, count)
    cols = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    cmask = cols < D
    acc = tl.zeros([ROWS, BLOCK_D], dtype=cy.dtype.element_ty)
    for s in range(0, tl.max(count, axis=0)):
        smask = s < count
        acc += tl.load(scratch + (first + s).to(tl.int64)[:, None] * D + cols[None, :],
                       mask=smask[:, None] & cmask[None, :], other=0.0)
    sums = _step_epilogue(acc, row, valid, cols, cmask, y, b, cy, rs, c, out, done, D, HAS_C,
                          HAS_B, SUMS)
    _store_sums(part, part_offset + pid, pid_d, cols, cmask, D, sums, SUMS)


# ------------------------------------------------------------ the neural weights --

@triton.jit
def _neural_edge_weights_kernel(seg_row, seg_start, seg_len, seg_slot, num_segs, col, a, p,
                                q, consts, w_out, kappa_out, scratch_kappa, H,
                                ROWS: tl.constexpr, BLOCK_H: tl.constexpr,
                                NUM_H_BLOCKS: tl.constexpr, TANH_SMALL: tl.constexpr,
                                F64: tl.constexpr):
    """The neural edge weights: per edge W_ij = a_ij tanh(1/(rho_ij + eps)) tanh(|pi_ij|)
    (eq. 13-14, laplacian_math.h neural_edge_weight), with kappa_i = sum_j W_ij; segments of
    heavy rows leave their kappa partial sums in `scratch_kappa` for
    :func:`_neural_edge_weights_combine_kernel`. consts = [eps] in the data dtype."""
    pid = tl.program_id(0)
    eps = tl.load(consts)
    row, start, length, slot, valid = _load_segments(seg_row, seg_start, seg_len, seg_slot,
                                                   num_segs, pid, 0, ROWS)
    row64 = row.to(tl.int64)
    kappa = tl.zeros([ROWS], dtype=a.dtype.element_ty)
    if NUM_H_BLOCKS == 1:  # the segment rows' p_i, q_i stay in registers
        hc = tl.arange(0, BLOCK_H)
        p_i = _load_tile(p, row64, valid, hc, H, a.dtype.element_ty)
        q_i = _load_tile(q, row64, valid, hc, H, a.dtype.element_ty)
    for e in range(0, tl.max(length, axis=0)):
        emask, k, j, a_k = _load_edge(col, a, start, length, e)
        if NUM_H_BLOCKS == 1:
            pi, rho = _pi_rho_tile(p_i, q_i, _load_tile(p, j, emask, hc, H, a.dtype.element_ty),
                                   _load_tile(q, j, emask, hc, H, a.dtype.element_ty), F64)
        else:
            pi, rho = _pi_rho(p, q, row64, j, emask, H, a.dtype.element_ty, BLOCK_H,
                              NUM_H_BLOCKS, F64)
        t, _unused = _tanh_sech2(1.0 / (rho + eps), TANH_SMALL)
        phi, _unused2 = _tanh_sech2(tl.abs(pi), TANH_SMALL)
        w_k = a_k * t * phi
        tl.store(w_out + k, w_k, mask=emask)
        kappa += w_k
    tl.store(kappa_out + row64, kappa, mask=valid & (slot < 0))
    tl.store(scratch_kappa + slot.to(tl.int64), kappa, mask=valid & (slot >= 0))


@triton.jit
def _neural_edge_weights_combine_kernel(heavy_row, heavy_first, heavy_count, num_heavy,
                                        kappa_out, scratch_kappa, ROWS: tl.constexpr):
    """kappa_i of rows longer than one segment: the sum of the row's scratch slots in slot
    order."""
    pid = tl.program_id(0)
    row, valid, first, count = _load_heavy_rows(heavy_row, heavy_first, heavy_count,
                                                num_heavy, pid, ROWS)
    kappa = tl.zeros([ROWS], dtype=scratch_kappa.dtype.element_ty)
    for s in range(0, tl.max(count, axis=0)):
        kappa += tl.load(scratch_kappa + (first + s).to(tl.int64), mask=s < count, other=0.0)
    tl.store(kappa_out + row.to(tl.int64), kappa, mask=valid)


# -------------------------------------------------------------- the gradient pass --

# How a gradient pass gets G for the edge (row i, neighbour j) of the CSR it walks:
GRAD_SYMMETRIC = 0  # symmetric graph, both directions: G_ij + G_ji = (v_i - v_j) . (z_j - z_i)
GRAD_OUT = 1  # CSR row i, edge (i, j): G_ij = v_i . (z_j - z_i)
GRAD_IN = 2  # transposed CSR row i, edge (j, i) of the graph: G_ji = v_j . (z_i - z_j)
GRAD_GIVEN = 3  # per-edge dl/dW given (`gw`, aligned with the CSR walked)


@triton.jit
def _edge_grad(v, z, row_i, row_j, mask, D, MODE: tl.constexpr, ACC: tl.constexpr,
               BLOCK_G: tl.constexpr, NUM_G_BLOCKS: tl.constexpr):
    """G for a vector of edges as the MODE constants say (laplacian_math.h: dl/dW_ij =
    v_i . (z_j - z_i), and G_ij + G_ji on symmetric graphs), in the dtype ACC."""
    g = tl.zeros(row_i.shape, dtype=ACC)
    for cb in tl.static_range(NUM_G_BLOCKS):
        m2, off_i, off_j = _pair_offsets(row_i, row_j, mask, cb * BLOCK_G, D, BLOCK_G)
        dz = tl.load(z + off_j, mask=m2, other=0.0).to(ACC) - \
            tl.load(z + off_i, mask=m2, other=0.0).to(ACC)
        if MODE == 0:
            vv = tl.load(v + off_i, mask=m2, other=0.0).to(ACC) - \
                tl.load(v + off_j, mask=m2, other=0.0).to(ACC)
            g += tl.sum(vv * dz, axis=1)
        elif MODE == 1:
            g += tl.sum(tl.load(v + off_i, mask=m2, other=0.0).to(ACC) * dz, axis=1)
        else:
            g -= tl.sum(tl.load(v + off_j, mask=m2, other=0.0).to(ACC) * dz, axis=1)
    return g


@triton.jit
def _neural_weight_grad_kernel(seg_row, seg_start, seg_len, seg_slot, num_segs, col, a, gw, p,
                               q, z, v, consts, grad_p, grad_q, scratch_p, scratch_q, D, H,
                               MODE: tl.constexpr, ACCUMULATE: tl.constexpr,
                               ROWS: tl.constexpr, BLOCK_H: tl.constexpr,
                               NUM_H_BLOCKS: tl.constexpr, BLOCK_G: tl.constexpr,
                               NUM_G_BLOCKS: tl.constexpr, TANH_SMALL: tl.constexpr,
                               F64: tl.constexpr):
    """The fused gradient pass (laplacian_math.h, backward): per edge of the walked CSR,
    G from the adjoint v and the equilibrium z (or given), the partials of
    neural_edge_weight_partials, cp = G dW/dpi and cq = G dW/drho / rho (0 at rho = 0), and
    dl/dp_i += cp p_j, dl/dq_i += cq (q_i - q_j). Each row's gradient is summed in its own
    segments (ACCUMULATE adds to what an earlier pass wrote: the transposed half of a directed
    graph). The output tile is channels [pid_1 BLOCK_H, +BLOCK_H) of p and q."""
    pid = tl.program_id(0)
    pid_h = tl.program_id(1)
    eps = tl.load(consts)
    row, start, length, slot, valid = _load_segments(seg_row, seg_start, seg_len, seg_slot,
                                                   num_segs, pid, 0, ROWS)
    row64 = row.to(tl.int64)
    hc = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    hmask = hc < H
    acc_p = tl.zeros([ROWS, BLOCK_H], dtype=grad_p.dtype.element_ty)
    acc_q = tl.zeros([ROWS, BLOCK_H], dtype=grad_p.dtype.element_ty)
    cq_sum = tl.zeros([ROWS], dtype=grad_p.dtype.element_ty)
    # Whole rows that fit one tile stay in registers for the edge loop.
    if NUM_H_BLOCKS == 1:
        p_i = _load_tile(p, row64, valid, hc, H, grad_p.dtype.element_ty)
        q_i = _load_tile(q, row64, valid, hc, H, grad_p.dtype.element_ty)
    if NUM_G_BLOCKS == 1:
        gc = tl.arange(0, BLOCK_G)
        if MODE <= 1:
            v_i = _load_tile(v, row64, valid, gc, D, grad_p.dtype.element_ty)
        if MODE <= 2:
            z_i = _load_tile(z, row64, valid, gc, D, grad_p.dtype.element_ty)
    for e in range(0, tl.max(length, axis=0)):
        emask, k, j, a_k = _load_edge(col, a, start, length, e)
        if MODE == 3:
            g = tl.load(gw + k, mask=emask, other=0.0)
        elif NUM_G_BLOCKS == 1:
            dz = _load_tile(z, j, emask, gc, D, grad_p.dtype.element_ty) - z_i
            if MODE == 0:
                g = tl.sum((v_i - _load_tile(v, j, emask, gc, D, grad_p.dtype.element_ty)) * dz,
                           axis=1)
            elif MODE == 1:
                g = tl.sum(v_i * dz, axis=1)
            else:
                g = -tl.sum(_load_tile(v, j, emask, gc, D, grad_p.dtype.element_ty) * dz,
                            axis=1)
            g = tl.where(emask, g, 0.0)
        else:
            g = _edge_grad(v, z, row64, j, emask, D, MODE, grad_p.dtype.element_ty, BLOCK_G,
                           NUM_G_BLOCKS)
        if NUM_H_BLOCKS == 1:
            p_j = _load_tile(p, j, emask, hc, H, grad_p.dtype.element_ty)
            q_j = _load_tile(q, j, emask, hc, H, grad_p.dtype.element_ty)
            pi, rho = _pi_rho_tile(p_i, q_i, p_j, q_j, F64)
        else:
            pi, rho = _pi_rho(p, q, row64, j, emask, H, grad_p.dtype.element_ty, BLOCK_H,
                              NUM_H_BLOCKS, F64)
            m2 = emask[:, None] & hmask[None, :]
            off_j = j[:, None] * H + hc[None, :]
            p_j = tl.load(p + off_j, mask=m2, other=0.0).to(grad_p.dtype.element_ty)
            q_j = tl.load(q + off_j, mask=m2, other=0.0).to(grad_p.dtype.element_ty)
        s = 1.0 / (rho + eps)
        t, t_s2 = _tanh_sech2(s, TANH_SMALL)
        phi, phi_s2 = _tanh_sech2(tl.abs(pi), TANH_SMALL)
        sign = tl.where(pi > 0, 1.0, tl.where(pi < 0, -1.0, 0.0))
        cp = g * (a_k * t * phi_s2 * sign)
        dw_drho = -a_k * phi * t_s2 * s * s
        positive = rho > 0
        cq = tl.where(positive, g * dw_drho / tl.where(positive, rho, 1.0), 0.0)
        acc_p += cp[:, None] * p_j
        acc_q += cq[:, None] * q_j
        cq_sum += cq
    gq = cq_sum[:, None] * _load_tile(q, row64, valid, hc, H, grad_p.dtype.element_ty) - acc_q
    whole = valid & (slot < 0)
    m_whole = whole[:, None] & hmask[None, :]
    off = row64[:, None] * H + hc[None, :]
    if ACCUMULATE:
        acc_p += tl.load(grad_p + off, mask=m_whole, other=0.0)
        gq += tl.load(grad_q + off, mask=m_whole, other=0.0)
    tl.store(grad_p + off, acc_p, mask=m_whole)
    tl.store(grad_q + off, gq, mask=m_whole)
    partial = valid & (slot >= 0)
    m_partial = partial[:, None] & hmask[None, :]
    s_off = slot.to(tl.int64)[:, None] * H + hc[None, :]
    tl.store(scratch_p + s_off, acc_p, mask=m_partial)
    tl.store(scratch_q + s_off, gq, mask=m_partial)


@triton.jit
def _neural_weight_grad_combine_kernel(heavy_row, heavy_first, heavy_count, num_heavy, grad_p,
                                       grad_q, scratch_p, scratch_q, H,
                                       ACCUMULATE: tl.constexpr, ROWS: tl.constexpr,
                                       BLOCK_H: tl.constexpr):
    """Rows longer than one segment of the gradient pass: their slots summed in slot order."""
    pid = tl.program_id(0)
    pid_h = tl.program_id(1)
    row, valid, first, count = _load_heavy_rows(heavy_row, heavy_first, heavy_count,
                                                num_heavy, pid, ROWS)
    hc = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    hmask = hc < H
    acc_p = tl.zeros([ROWS, BLOCK_H], dtype=grad_p.dtype.element_ty)
    acc_q = tl.zeros([ROWS, BLOCK_H], dtype=grad_p.dtype.element_ty)
    for s in range(0, tl.max(count, axis=0)):
        m2 = (s < count)[:, None] & hmask[None, :]
        s_off = (first + s).to(tl.int64)[:, None] * H + hc[None, :]
        acc_p += tl.load(scratch_p + s_off, mask=m2, other=0.0)
        acc_q += tl.load(scratch_q + s_off, mask=m2, other=0.0)
    m_rows = valid[:, None] & hmask[None, :]
    off = row.to(tl.int64)[:, None] * H + hc[None, :]
    if ACCUMULATE:
        acc_p += tl.load(grad_p + off, mask=m_rows, other=0.0)
        acc_q += tl.load(grad_q + off, mask=m_rows, other=0.0)
    tl.store(grad_p + off, acc_p, mask=m_rows)
    tl.store(grad_q + off, acc_q, mask=m_rows)


# ------------------------------------------------------ the solves' bookkeeping --

# The slots of a solve's state (dignn_kernels.solver_state), as kernel constants
_DONE, _DIVERGED, _SWEEPS, _RESIDUAL = (tl.constexpr(i) for i in (DONE, DIVERGED, SWEEPS,
                                                                  RESIDUAL))
_FP_RELATIVE, _FP_TOL, _FP_BOUND, _FP_TINY = (tl.constexpr(i) for i in (FP_RELATIVE, FP_TOL,
                                                                        FP_BOUND, FP_TINY))


@triton.jit
def record_iteration(state, res, bad, stop):
    """One iteration of a solve in its float64 state, the shared slots of every solver's
    layout (dignn_kernels.solver_state.record_iteration, the same in PyTorch): if the solve
    was live, the iteration counted, res kept, divergence flagged where `bad`; done once
    bad or `stop`. Returns whether it was live (a done solve keeps its state)."""
    live = tl.load(state + _DONE) == 0
    tl.store(state + _DONE, tl.where((tl.load(state + _DONE) != 0) | bad | stop, 1.0, 0.0))
    tl.store(state + _DIVERGED,
             tl.where((tl.load(state + _DIVERGED) != 0) | (live & bad), 1.0, 0.0))
    tl.store(state + _SWEEPS, tl.load(state + _SWEEPS) + tl.where(live, 1.0, 0.0))
    tl.store(state + _RESIDUAL, tl.where(live, res, tl.load(state + _RESIDUAL)))
    return live


@triton.jit(do_not_specialize=["k"])
def _fixed_point_update_kernel(sums, state, history, k):
    """dignn_kernels.solvers.fixed_point_solver.fixed_point_update, the float64 operations in
    one program: from the sweep's sums [||out - y||^2, ||out||^2, sum_i c_i ||out_i||^2], the
    relative residual into history[k - 1]; if the solve was live, the sweep counted, the
    residuals kept and divergence (a non-finite residual or the certificate's bound broken)
    flagged; done once diverged or res <= tol size. State: solver_state.FIXED_POINT_STATE."""
    res = tl.sqrt(tl.load(sums))
    size = tl.sqrt(tl.load(sums + 1))
    weighted = tl.load(sums + 2)
    # res * 0 is 0 for a finite res, NaN for inf and NaN (no float literal: they are float32)
    bad = (res * 0.0 != 0.0) | (weighted > tl.load(state + _FP_BOUND))
    tiny = tl.load(state + _FP_TINY)
    rel = res / tl.where(size < tiny, tiny, size)  # a NaN size stays NaN, as torch.maximum
    tl.store(history + k - 1, rel)
    live = record_iteration(state, res, bad, res <= tl.load(state + _FP_TOL) * size)
    tl.store(state + _FP_RELATIVE, tl.where(live, rel, tl.load(state + _FP_RELATIVE)))


# ---------------------------------------------------------------------- launchers --
# All tensors contiguous and on one device; `sched` is a Schedule of the CSR walked.

def csr_fma(sched, col, w, y, b, cy, rs, out, done=None, c=None, sums=SUMS_NONE):
    """out = b + cy.y + rs.(W y) (b None: 0) unless the flag `done` is set (None: never).
    Returns the per-program partial sums of the output as stored that `sums` asks for:
    SUMS_NORMS, ROW_STEP_SUMS float64 each (the weighted one with per-row weights c, 0 for c
    None); SUMS_DOTS, a [programs, d] table of the per-channel sums out.y (in cy's dtype; its
    column sums are cg's delta = w.u for w = A u); SUMS_NONE (the plain pass), None: the
    kernels then reduce nothing and no buffer is made for them."""
    n, d = y.shape
    block_d = _pow2(d, MAX_BLOCK_D)
    rows = max(4, min(64, 2048 // block_d))
    warps = _warps(rows, block_d)
    tiles_d = triton.cdiv(d, block_d)
    grid = (triton.cdiv(sched.num_segments, rows), tiles_d)
    grid_c = (triton.cdiv(sched.num_heavy, rows), tiles_d)
    programs = grid[0] + (grid_c[0] if sched.num_heavy else 0)
    part = None
    if sums == SUMS_DOTS:
        part = cy.new_empty(programs, d)
    elif sums == SUMS_NORMS:
        part = y.new_empty(ROW_STEP_SUMS * programs * tiles_d, dtype=torch.float64)
    # the heavy rows' partial sums, in the compute dtype (no slot is written without them)
    scratch = cy.new_empty(sched.num_slots, d) if sched.num_heavy else cy
    # Arguments a variant does not read are bound to a tensor of the right device (never
    # read: their constexpr flags compile the reads out).
    b_arg = b if b is not None else y
    c_arg = c if c is not None else cy
    done_arg = done if done is not None else cy
    part_arg = part if part is not None else cy
    flags = dict(HAS_C=c is not None, HAS_B=b is not None, HAS_DONE=done is not None,
                 SUMS=sums, ROWS=rows, BLOCK_D=block_d, num_warps=warps)
    _csr_fma_kernel[grid](*sched.segment_args(), col, w, y, b_arg, cy, rs, c_arg, out,
                          scratch, part_arg, done_arg, d, **flags)
    if sched.num_heavy:
        _csr_fma_combine_kernel[grid_c](sched.heavy_row, sched.heavy_first, sched.heavy_count,
                                        sched.num_heavy, y, b_arg, cy, rs, c_arg, out,
                                        scratch, part_arg, grid[0], done_arg, d, **flags)
    return part


def fixed_point_update(sums, state, history, k):
    """The fixed point's bookkeeping of sweep k on the device (see the kernel)."""
    _fixed_point_update_kernel[(1,)](sums, state, history, k)


def neural_edge_weights(sched, col, a, p, q, consts, w_out, kappa_out):
    """Writes the neural edge weights w_out and their row sums kappa_out (consts = [eps]; see
    the kernel)."""
    h = p.shape[1]
    block_h = _pow2(h, MAX_BLOCK_H)
    rows = 16
    scratch_kappa = a.new_empty(max(sched.num_slots, 1))
    _neural_edge_weights_kernel[(triton.cdiv(sched.num_segments, rows),)](
        *sched.segment_args(), col, a, p, q, consts, w_out, kappa_out, scratch_kappa, h,
        ROWS=rows, BLOCK_H=block_h, NUM_H_BLOCKS=triton.cdiv(h, block_h),
        TANH_SMALL=_TANH_SMALL[a.dtype], F64=a.dtype == torch.float64,
        num_warps=_warps(rows, block_h))
    if sched.num_heavy:
        _neural_edge_weights_combine_kernel[(triton.cdiv(sched.num_heavy, rows),)](
            sched.heavy_row, sched.heavy_first, sched.heavy_count, sched.num_heavy, kappa_out,
            scratch_kappa, ROWS=rows, num_warps=_warps(rows, 1))


def neural_weight_grad(sched, col, a, p, q, consts, grad_p, grad_q, mode, accumulate, z=None,
                       v=None, gw=None):
    """One gradient pass over the CSR of `sched` (mode: GRAD_*), writing or (accumulate)
    adding dl/dp, dl/dq."""
    n, h = p.shape
    d = z.shape[1] if z is not None else 1
    block_h = _pow2(h, MAX_BLOCK_H)
    block_g = _pow2(d, MAX_BLOCK_G)
    rows = 16
    warps = _warps(rows, max(block_h, block_g))
    tiles_h = triton.cdiv(h, block_h)
    grid = (triton.cdiv(sched.num_segments, rows), tiles_h)
    scratch_p = grad_p.new_empty(max(sched.num_slots, 1), h)
    scratch_q = grad_p.new_empty(max(sched.num_slots, 1), h)
    z_arg = z if z is not None else p
    v_arg = v if v is not None else p
    gw_arg = gw if gw is not None else a
    _neural_weight_grad_kernel[grid](*sched.segment_args(), col, a, gw_arg, p, q, z_arg, v_arg,
                                     consts, grad_p, grad_q, scratch_p, scratch_q, d, h,
                                     MODE=mode, ACCUMULATE=accumulate, ROWS=rows,
                                     BLOCK_H=block_h, NUM_H_BLOCKS=tiles_h, BLOCK_G=block_g,
                                     NUM_G_BLOCKS=triton.cdiv(d, block_g),
                                     TANH_SMALL=_TANH_SMALL[grad_p.dtype],
                                     F64=grad_p.dtype == torch.float64, num_warps=warps)
    if sched.num_heavy:
        grid_c = (triton.cdiv(sched.num_heavy, rows), tiles_h)
        _neural_weight_grad_combine_kernel[grid_c](
            sched.heavy_row, sched.heavy_first, sched.heavy_count, sched.num_heavy, grad_p,
            grad_q, scratch_p, scratch_q, h, ACCUMULATE=accumulate, ROWS=rows,
            BLOCK_H=block_h, num_warps=_warps(rows, block_h))

