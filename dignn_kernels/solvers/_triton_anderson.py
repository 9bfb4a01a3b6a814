"""Triton kernels of Anderson's vector work (:mod:`.anderson_update`, whose docstring has
the formulas; :class:`~.anderson_update.AndersonVectors` is the same in PyTorch, their test
oracle).

- ``_window_dots_kernel`` and ``_window_mix_kernel`` tile the n x d vectors in blocks of
  ``ROWS`` rows by ``BLOCK_D`` channels, as cg's kernels do (:mod:`._triton_cg`), and loop over
  the window's filled slots; the dots write one row of float64 partial sums per row block,
  which a ``torch.sum`` over the blocks adds in a fixed order (deterministic, no atomics).
- ``_small_spd_solve_kernel``: each program holds ``BLOCK_B`` systems as a
  BLOCK_B x MP x MP tile (MP: m rounded up to a power of two) and runs the factorization and
  both substitutions in registers, unrolled over m. An entry is read out of a tile as a
  masked sum, and every sum runs over exactly the terms of the PyTorch solve's (k < j,
  k < i, k > i), so a non-finite entry reaches what it reaches there.
"""
import torch
import triton
import triton.language as tl
from torch import Tensor

from ..backends.triton import _consts
from ._triton_cg import ROWS, _block_d, _tile

__all__ = ["window_dots", "window_mix", "small_spd_solve"]


@triton.jit
def _window_dots_kernel(slots, v, partials, filled, n, D, slot_stride, ROWS: tl.constexpr,
                        BLOCK_D: tl.constexpr):
    pid_r, rows, rmask, cols, cmask, mask, offsets = _tile(n, D, ROWS, BLOCK_D)
    y = tl.load(v + offsets, mask=mask, other=0.0)
    slot = slots + offsets  # slot j's tile: advanced by a whole slot per iteration
    for j in range(0, filled):
        x = tl.load(slot, mask=mask, other=0.0)
        total = tl.sum((x * y).to(tl.float64), axis=0)
        tl.store(partials + (pid_r.to(tl.int64) * filled + j) * D + cols, total, mask=cmask)
        slot += slot_stride


@triton.jit
def _window_mix_kernel(gy, d_g, gamma, out, filled, n, D, slot_stride, ROWS: tl.constexpr,
                       BLOCK_D: tl.constexpr):
    pid_r, rows, rmask, cols, cmask, mask, offsets = _tile(n, D, ROWS, BLOCK_D)
    acc = tl.load(gy + offsets, mask=mask, other=0.0)
    slot = d_g + offsets
    for j in range(0, filled):  # in slot order, as the PyTorch chain of addcmul
        g = tl.load(gamma + j * D + cols, mask=cmask, other=0.0)
        acc = acc - tl.load(slot, mask=mask, other=0.0) * g[None, :]
        slot += slot_stride
    tl.store(out + offsets, acc, mask=mask)


@triton.jit
def _small_spd_solve_kernel(a, b, x, tiny, B, M: tl.constexpr, MP: tl.constexpr,
                            BLOCK_B: tl.constexpr):
    pid = tl.program_id(0)
    batch = pid * BLOCK_B + tl.arange(0, BLOCK_B)
    live = batch < B
    idx = tl.arange(0, MP)
    row3 = idx[None, :, None]
    col3 = idx[None, None, :]
    inside = live[:, None, None] & (row3 < M) & (col3 < M)
    A = tl.load(a + batch.to(tl.int64)[:, None, None] * (M * M) + row3 * M + col3, mask=inside,
                other=0.0)
    floor = tl.load(tiny)
    L = tl.zeros([BLOCK_B, MP, MP], dtype=A.dtype)
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
    vec = live[:, None] & (idx[None, :] < M)
    rhs = tl.load(b + batch.to(tl.int64)[:, None] * M + idx[None, :], mask=vec, other=0.0)
    y = tl.zeros([BLOCK_B, MP], dtype=A.dtype)
    for i in tl.static_range(M):  # L y = b
        row_i = tl.sum(tl.where(row3 == i, L, 0.0), axis=1)  # L[:, i, :]
        l_ii = tl.sum(tl.where(idx[None, :] == i, row_i, 0.0), axis=1)
        b_i = tl.sum(tl.where(idx[None, :] == i, rhs, 0.0), axis=1)
        known = tl.sum(tl.where(idx[None, :] < i, row_i * y, 0.0), axis=1)
        y = tl.where(idx[None, :] == i, ((b_i - known) / l_ii)[:, None], y)
    out = tl.zeros([BLOCK_B, MP], dtype=A.dtype)
    for step in tl.static_range(M):  # L^T x = y, last row first
        i = M - 1 - step
        col_i = tl.sum(tl.where(col3 == i, L, 0.0), axis=2)  # L[:, :, i]
        l_ii = tl.sum(tl.where(idx[None, :] == i, col_i, 0.0), axis=1)
        y_i = tl.sum(tl.where(idx[None, :] == i, y, 0.0), axis=1)
        known = tl.sum(tl.where(idx[None, :] > i, col_i * out, 0.0), axis=1)
        out = tl.where(idx[None, :] == i, ((y_i - known) / l_ii)[:, None], out)
    tl.store(x + batch.to(tl.int64)[:, None] * M + idx[None, :], out, mask=vec)


def _grid(n: int, d: int):
    return (triton.cdiv(n, ROWS), triton.cdiv(d, _block_d(d)))


def window_dots(slots: Tensor, v: Tensor, filled: int) -> Tensor:
    """[filled, d] float64: <slots[j], v> per channel for j < filled (slots: m x n x d, slot
    j contiguous)."""
    n, d = v.shape
    if n == 0 or d == 0 or filled == 0:
        return torch.zeros(filled, d, dtype=torch.float64, device=v.device)
    grid = _grid(n, d)
    partials = torch.empty(grid[0], filled, d, dtype=torch.float64, device=v.device)
    _window_dots_kernel[grid](slots, v.contiguous(), partials, filled, n, d, slots.stride(0),
                              ROWS=ROWS, BLOCK_D=_block_d(d))
    return partials.sum(dim=0)


def window_mix(gy: Tensor, d_g: Tensor, gamma: Tensor, filled: int) -> Tensor:
    """gy - sum_{j < filled} d_g[j] gamma[j] (gamma: [m, d] in gy's dtype), a new tensor."""
    n, d = gy.shape
    out = torch.empty((n, d), dtype=gy.dtype, device=gy.device)
    if n == 0 or d == 0:
        return out
    _window_mix_kernel[_grid(n, d)](gy.contiguous(), d_g, gamma.contiguous(), out, filled, n, d,
                                    d_g.stride(0), ROWS=ROWS, BLOCK_D=_block_d(d))
    return out


def small_spd_solve(a: Tensor, b: Tensor) -> Tensor:
    """x with a x = b for a batch of small SPD matrices (a: B x m x m, b: B x m), one launch."""
    batch, m = b.shape
    x = torch.empty((batch, m), dtype=b.dtype, device=b.device)
    if batch == 0 or m == 0:
        return x
    mp = triton.next_power_of_2(m)
    block_b = max(1, min(32, 1024 // (mp * mp)))
    tiny = _consts((torch.finfo(a.dtype).tiny,), a.dtype, a.device)  # exact in float64
    _small_spd_solve_kernel[(triton.cdiv(batch, block_b),)](
        a.contiguous(), b.contiguous(), x, tiny, batch, M=m, MP=mp, BLOCK_B=block_b)
    return x
