"""Triton kernels of Anderson's vector work (:mod:`.anderson_update`, whose docstring has
the formulas; :class:`~.anderson_update.AndersonVectors` is the same in PyTorch, their test
oracle).

- ``_window_record_kernel`` and ``_window_mix_kernel`` tile the n x d vectors in blocks of
  ``ROWS`` rows by ``BLOCK_D`` channels, walked in chunks of rows, as cg's kernels do
  (:mod:`._triton_cg`), and loop over the window's filled slots; the record keeps its column
  sums of every slot in registers (an MP x BLOCK_D tile, MP the window rounded up to a power
  of two) and writes one row block of float64 partial sums per program, which a
  ``torch.sum`` over the blocks adds in a fixed order (deterministic, no atomics).
- ``_anderson_gamma_kernel`` and ``_small_spd_solve_kernel`` (the plain batched solve of the
  same tile, :func:`small_spd_solve`, which the tests compare with the PyTorch and dense
  solves on its own): each program holds ``BLOCK_B`` systems as a BLOCK_B x MP x MP
  tile (MP: m rounded up to a power of two) and runs the factorization and both
  substitutions in registers, unrolled over m (``_spd_solve_tile``). An entry is read out of
  a tile as a masked sum, and every sum runs over exactly the terms of the PyTorch solve's
  (k < j, k < i, k > i), so a non-finite entry reaches what it reaches there. The gamma
  kernel takes each channel's Gram matrix and right-hand side as the loop keeps them,
  regularizes, solves, zeroes what is not finite and writes gamma in the iterate's dtype.
- ``_anderson_finish_kernel``: the iteration's bookkeeping in one program.
"""
import torch
import triton
import triton.language as tl
from torch import Tensor

from ..backends.triton import _consts
from ..solver_state import ACCEPT, DIVERGED, DONE, REF_SAFE, RESIDUAL, SWEEPS, TARGET
from ._triton_cg import ROWS, _block_d, _chunk, _columns, _grid, chunk_rows

__all__ = ["window_mix", "window_record", "anderson_finish", "anderson_gamma",
           "small_spd_solve"]

# The slots of its state (solver_state.ANDERSON_STATE), as kernel constants
_DONE, _DIVERGED, _SWEEPS, _RESIDUAL, _TARGET, _REF_SAFE, _ACCEPT = (
    tl.constexpr(i) for i in (DONE, DIVERGED, SWEEPS, RESIDUAL, TARGET, REF_SAFE, ACCEPT))


@triton.jit
def _window_mix_kernel(gy, d_g, gamma, out, filled, n, D, slot_stride, ROWS: tl.constexpr,
                       CHUNK: tl.constexpr, BLOCK_D: tl.constexpr):
    pid_r, cols, cmask = _columns(D, BLOCK_D)
    for start in range(0, ROWS, CHUNK):
        rows, rmask, mask, offsets = _chunk(pid_r * ROWS + start, n, D, cols, cmask, CHUNK)
        acc = tl.load(gy + offsets, mask=mask, other=0.0)
        slot = d_g + offsets
        for j in range(0, filled):  # in slot order, as the PyTorch chain of addcmul
            g = tl.load(gamma + j * D + cols, mask=cmask, other=0.0)
            acc = acc - tl.load(slot, mask=mask, other=0.0) * g[None, :]
            slot += slot_stride
        tl.store(out + offsets, acc, mask=mask)


@triton.jit
def _spd_solve_tile(A, rhs, floor, M: tl.constexpr, MP: tl.constexpr):
    """x with A x = rhs for each of the BLOCK_B systems of the tile A (BLOCK_B x MP x MP,
    zero beyond M) and rhs (BLOCK_B x MP), by the module's Cholesky with pivots clamped to
    ``floor``, in registers."""
    idx = tl.arange(0, MP)
    row3 = idx[None, :, None]
    col3 = idx[None, None, :]
    L = tl.zeros(A.shape, dtype=A.dtype)
    for j in tl.static_range(M):
        row_j = tl.sum(tl.where(row3 == j, L, 0.0), axis=1)  # L[:, j, :]
        a_col = tl.sum(tl.where(col3 == j, A, 0.0), axis=2)  # A[:, :, j]
        a_jj = tl.sum(tl.where(idx[None, :] == j, a_col, 0.0), axis=1)
        square = tl.sum(tl.where(idx[None, :] < j, row_j * row_j, 0.0), axis=1)
        pivot = tl.sqrt(tl.maximum(a_jj - square, floor, propagate_nan=tl.PropagateNan.ALL))
        # sum_{k<j} L_ik L_jk for every row i
        below = tl.sum(tl.where(col3 < j, L * row_j[:, None, :], 0.0), axis=2)
        column = tl.where(idx[None, :] == j, pivot[:, None], (a_col - below) / pivot[:, None])
        L = tl.where((col3 == j) & (row3 >= j) & (row3 < M), column[:, :, None], L)
    y = tl.zeros(rhs.shape, dtype=A.dtype)
    for i in tl.static_range(M):  # L y = b
        row_i = tl.sum(tl.where(row3 == i, L, 0.0), axis=1)  # L[:, i, :]
        l_ii = tl.sum(tl.where(idx[None, :] == i, row_i, 0.0), axis=1)
        b_i = tl.sum(tl.where(idx[None, :] == i, rhs, 0.0), axis=1)
        known = tl.sum(tl.where(idx[None, :] < i, row_i * y, 0.0), axis=1)
        y = tl.where(idx[None, :] == i, ((b_i - known) / l_ii)[:, None], y)
    out = tl.zeros(rhs.shape, dtype=A.dtype)
    for step in tl.static_range(M):  # L^T x = y, last row first
        i = M - 1 - step
        col_i = tl.sum(tl.where(col3 == i, L, 0.0), axis=2)  # L[:, :, i]
        l_ii = tl.sum(tl.where(idx[None, :] == i, col_i, 0.0), axis=1)
        y_i = tl.sum(tl.where(idx[None, :] == i, y, 0.0), axis=1)
        known = tl.sum(tl.where(idx[None, :] > i, col_i * out, 0.0), axis=1)
        out = tl.where(idx[None, :] == i, ((y_i - known) / l_ii)[:, None], out)
    return out


@triton.jit
def _load_systems(a, B, M: tl.constexpr, MP: tl.constexpr, BLOCK_B: tl.constexpr):
    """This program's systems: (their indices, which are real, the BLOCK_B x MP x MP tile of
    the row-major M x M matrices of ``a``)."""
    batch = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    live = batch < B
    idx = tl.arange(0, MP)
    row3 = idx[None, :, None]
    col3 = idx[None, None, :]
    inside = live[:, None, None] & (row3 < M) & (col3 < M)
    A = tl.load(a + batch.to(tl.int64)[:, None, None] * (M * M) + row3 * M + col3, mask=inside,
                other=0.0)
    return batch, live, A


@triton.jit
def _small_spd_solve_kernel(a, b, x, tiny, B, M: tl.constexpr, MP: tl.constexpr,
                            BLOCK_B: tl.constexpr):
    batch, live, A = _load_systems(a, B, M, MP, BLOCK_B)
    idx = tl.arange(0, MP)
    vec = live[:, None] & (idx[None, :] < M)
    rhs = tl.load(b + batch.to(tl.int64)[:, None] * M + idx[None, :], mask=vec, other=0.0)
    out = _spd_solve_tile(A, rhs, tl.load(tiny), M, MP)
    tl.store(x + batch.to(tl.int64)[:, None] * M + idx[None, :], out, mask=vec)


@triton.jit
def _anderson_gamma_kernel(gram, proj, gamma, consts, D, M: tl.constexpr, MP: tl.constexpr,
                           BLOCK_B: tl.constexpr):
    """anderson_update.AndersonVectors.gamma for BLOCK_B channels: gram (D x M x M), proj
    and gamma (M x D); consts = [reg, tiny] in float64."""
    channel, live, A = _load_systems(gram, D, M, MP, BLOCK_B)
    idx = tl.arange(0, MP)
    row3 = idx[None, :, None]
    col3 = idx[None, None, :]
    vec = live[:, None] & (idx[None, :] < M)
    rhs = tl.load(proj + idx[None, :].to(tl.int64) * D + channel[:, None], mask=vec, other=0.0)
    reg = tl.load(consts)
    tiny = tl.load(consts + 1)
    diagonal = tl.sum(tl.sum(tl.where(row3 == col3, A, 0.0), axis=2), axis=1)
    lam = reg * (diagonal / M) + tiny
    A = tl.where((row3 == col3) & (row3 < M), A + lam[:, None, None], A)
    out = _spd_solve_tile(A, rhs, tiny, M, MP)
    out = tl.where(out * 0.0 == 0.0, out, 0.0)  # NaN and infinities zeroed
    tl.store(gamma + idx[None, :].to(tl.int64) * D + channel[:, None], out, mask=vec)


@triton.jit(do_not_specialize=["slot", "count"])
def _window_record_kernel(gy_new, y_new, f, gy, f_new, d_f, d_g, partials, slot, count, n, D,
                          slot_stride, ROWS: tl.constexpr, CHUNK: tl.constexpr,
                          BLOCK_D: tl.constexpr, MP: tl.constexpr):
    """anderson_update.AndersonVectors.record for one block, its sums as one row block of
    float64 partial sums [1 + 2 count, D]."""
    pid_r, cols, cmask = _columns(D, BLOCK_D)
    slots = tl.arange(0, MP)
    norm = tl.zeros([BLOCK_D], dtype=tl.float64)
    gram_row = tl.zeros([MP, BLOCK_D], dtype=tl.float64)  # <d_f[j], d_f[slot]>
    rhs = tl.zeros([MP, BLOCK_D], dtype=tl.float64)  # <d_f[j], f_new>
    own_slot = slot.to(tl.int64) * slot_stride
    for start in range(0, ROWS, CHUNK):
        rows, rmask, mask, offsets = _chunk(pid_r * ROWS + start, n, D, cols, cmask, CHUNK)
        g_new = tl.load(gy_new + offsets, mask=mask, other=0.0)
        fn = g_new - tl.load(y_new + offsets, mask=mask, other=0.0)
        tl.store(f_new + offsets, fn, mask=mask)
        df = fn - tl.load(f + offsets, mask=mask, other=0.0)
        tl.store(d_f + own_slot + offsets, df, mask=mask)
        tl.store(d_g + own_slot + offsets, g_new - tl.load(gy + offsets, mask=mask, other=0.0),
                 mask=mask)
        norm += tl.sum((fn * fn).to(tl.float64), axis=0)
        other = d_f + offsets  # slot j's chunk: advanced by a whole slot per iteration
        for j in range(0, count):  # slot `slot` from registers (this program just wrote it)
            x = tl.where(j == slot, df, tl.load(other, mask=mask & (j != slot), other=0.0))
            row_j = slots[:, None] == j
            gram_row = tl.where(row_j, gram_row + tl.sum((x * df).to(tl.float64), axis=0)[None, :],
                                gram_row)
            rhs = tl.where(row_j, rhs + tl.sum((x * fn).to(tl.float64), axis=0)[None, :], rhs)
            other += slot_stride
    row = partials + pid_r.to(tl.int64) * (1 + 2 * count) * D
    tl.store(row + cols, norm, mask=cmask)
    filled = (slots < count)[:, None] & cmask[None, :]
    tl.store(row + (1 + slots)[:, None] * D + cols[None, :], gram_row, mask=filled)
    tl.store(row + (1 + count + slots)[:, None] * D + cols[None, :], rhs, mask=filled)


@triton.jit(do_not_specialize=["k", "slot", "count"])
def _anderson_finish_kernel(sums, gram, proj, state, history, k, slot, count, D,
                            M: tl.constexpr, BLOCK: tl.constexpr):
    """anderson_update.AndersonVectors.finish in one program, float64. State:
    solver_state.ANDERSON_STATE."""
    total = tl.sum(tl.zeros([BLOCK], dtype=tl.float64), axis=0)
    for start in range(0, D, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        cmask = cols < D
        matrix = gram + cols.to(tl.int64) * (M * M)  # each channel's Gram matrix
        total += tl.sum(tl.load(sums + cols, mask=cmask, other=0.0), axis=0)
        for j in range(0, count):
            column = tl.load(sums + (1 + j) * D + cols, mask=cmask, other=0.0)
            tl.store(matrix + j * M + slot, column, mask=cmask)
            tl.store(matrix + slot * M + j, column, mask=cmask)
            tl.store(proj + j * D + cols, tl.load(sums + (1 + count + j) * D + cols, mask=cmask,
                                                  other=0.0), mask=cmask)
    res = tl.sqrt(tl.where(total < 0, 0.0, total))  # a NaN stays NaN, as clamp_min keeps it
    tl.store(history + k, res / tl.load(state + _REF_SAFE))
    bad = res * 0.0 != 0.0  # NaN or inf (no float literal: they are float32)
    done = tl.load(state + _DONE) != 0
    live = ~done
    accept = live & ~bad
    tl.store(state + _DONE,
             tl.where(done | bad | (res <= tl.load(state + _TARGET)), 1.0, 0.0))
    tl.store(state + _DIVERGED,
             tl.where((tl.load(state + _DIVERGED) != 0) | (live & bad), 1.0, 0.0))
    tl.store(state + _SWEEPS, tl.load(state + _SWEEPS) + tl.where(live, 1.0, 0.0))
    tl.store(state + _RESIDUAL, tl.where(accept, res, tl.load(state + _RESIDUAL)))
    tl.store(state + _ACCEPT, tl.where(accept, 1.0, 0.0))


def window_mix(gy: Tensor, d_g: Tensor, gamma: Tensor, filled: int) -> Tensor:
    """gy - sum_{j < filled} d_g[j] gamma[j] (gamma: [m, d] in gy's dtype), a new tensor."""
    n, d = gy.shape
    out = torch.empty((n, d), dtype=gy.dtype, device=gy.device)
    if n == 0 or d == 0:
        return out
    _window_mix_kernel[_grid(n, d)](gy.contiguous(), d_g, gamma.contiguous(), out, filled, n, d,
                                    d_g.stride(0), ROWS=ROWS, CHUNK=chunk_rows(gy),
                                    BLOCK_D=_block_d(d))
    return out


def _systems_per_program(m: int) -> int:
    """BLOCK_B: 256 matrix entries per program. The factorization is unrolled over m, its
    tile in registers: 1,024 entries (4 systems of 16 x 16) spilled for sm_90, 256 take
    about 90 registers for m = 5 and 16 with 4 warps, 60-73 with SOLVE_WARPS."""
    return max(1, min(32, 256 // (triton.next_power_of_2(m) ** 2)))


# Warps of the small-solve kernels: 8, one tile entry per thread. With 4 warps Triton 3.6 (the
# GPU machine's) gave the gamma kernel of a 16-slot window an 8-byte stack frame for sm_90 (96
# registers); with 8, 72 registers and none, and Triton 3.8 none either way.
SOLVE_WARPS = 8


def window_record(gy_new: Tensor, y_new: Tensor, f: Tensor, gy: Tensor, d_f: Tensor,
                  d_g: Tensor, slot: int, count: int):
    """(f_new, sums) of :meth:`.anderson_update.AndersonVectors.record` (d_f, d_g: m x n x d,
    slot j contiguous), one pass and a sum of its row blocks' partial sums."""
    n, d = gy_new.shape
    f_new = torch.empty((n, d), dtype=gy_new.dtype, device=gy_new.device)
    if n == 0 or d == 0:
        return f_new, torch.zeros(1 + 2 * count, d, dtype=torch.float64, device=f_new.device)
    grid = _grid(n, d)
    partials = torch.empty(grid[0], 1 + 2 * count, d, dtype=torch.float64, device=f_new.device)
    _window_record_kernel[grid](gy_new.contiguous(), y_new.contiguous(), f.contiguous(),
                                gy.contiguous(), f_new, d_f, d_g, partials, slot, count, n, d,
                                d_f.stride(0), ROWS=ROWS, CHUNK=chunk_rows(gy_new),
                                BLOCK_D=_block_d(d),
                                MP=triton.next_power_of_2(d_f.shape[0]))
    return f_new, partials.sum(dim=0)


def anderson_finish(sums: Tensor, count: int, slot: int, gram: Tensor, proj: Tensor,
                    state: Tensor, history: Tensor, k: int) -> None:
    """:meth:`.anderson_update.AndersonVectors.finish` on the device, one launch."""
    d, m = gram.shape[0], gram.shape[1]
    _anderson_finish_kernel[(1,)](sums.contiguous(), gram, proj, state, history, k, slot, count,
                                  d, M=m, BLOCK=min(triton.next_power_of_2(max(d, 1)), 256))


def anderson_gamma(gram: Tensor, proj: Tensor, reg: float, dtype: torch.dtype) -> Tensor:
    """:meth:`.anderson_update.AndersonVectors.gamma` (gram: d x m x m, proj: m x d, both
    float64), one launch: [m, d] in ``dtype``."""
    d, m = gram.shape[0], gram.shape[1]
    gamma = torch.empty((m, d), dtype=dtype, device=gram.device)
    if d == 0:
        return gamma
    block_b = _systems_per_program(m)
    consts = _consts((reg, torch.finfo(torch.float64).tiny), torch.float64, gram.device)
    _anderson_gamma_kernel[(triton.cdiv(d, block_b),)](
        gram.contiguous(), proj.contiguous(), gamma, consts, d, M=m,
        MP=triton.next_power_of_2(m), BLOCK_B=block_b, num_warps=SOLVE_WARPS)
    return gamma


def small_spd_solve(a: Tensor, b: Tensor) -> Tensor:
    """x with a x = b for a batch of small SPD matrices (a: B x m x m, b: B x m), one launch."""
    batch, m = b.shape
    x = torch.empty((batch, m), dtype=b.dtype, device=b.device)
    if batch == 0 or m == 0:
        return x
    mp = triton.next_power_of_2(m)
    block_b = _systems_per_program(m)
    tiny = _consts((torch.finfo(a.dtype).tiny,), a.dtype, a.device)  # exact in float64
    _small_spd_solve_kernel[(triton.cdiv(batch, block_b),)](
        a.contiguous(), b.contiguous(), x, tiny, batch, M=m, MP=mp, BLOCK_B=block_b,
        num_warps=SOLVE_WARPS)
    return x
