"""Triton kernels of the conjugate-gradient update and its bookkeeping (:mod:`.cg_update`,
whose docstring has the formulas; :class:`~.cg_update.TorchCGUpdate` is the same in PyTorch,
their test oracle).

Both kernels tile the n x d vectors in blocks of ``ROWS`` rows by ``BLOCK_D`` channels and
write one row of partial sums per row block, which a ``torch.sum`` over the blocks then adds
in a fixed order: deterministic, no atomics. A program walks its block in chunks of
:func:`chunk_rows` rows (64 bytes of a channel: 16 float32 rows, 8 float64), its column sums
in registers: a whole 64 x 64 block of the cg step's ten vectors at once needs more registers
than a thread has (ptxas, sm_90: all 255 in float32, and 1 KB per thread spilled in float64).
"""
import triton
import triton.language as tl
from torch import Tensor

from ..backends._triton_jit import _load_done, record_iteration
from ..solver_state import REF_SAFE, TARGET

__all__ = ["column_dots", "cg_step", "cg_finish", "ROWS", "chunk_rows"]

ROWS = 64  # rows of a program's block: one row of partial sums each
# The slots of its state past the shared ones (solver_state.CG_STATE), as kernel constants
_TARGET, _REF_SAFE = tl.constexpr(TARGET), tl.constexpr(REF_SAFE)


def chunk_rows(t: Tensor) -> int:
    """The rows of ``t`` a program holds in registers at once: 64 bytes of a channel."""
    return max(1, min(ROWS, 64 // t.element_size()))


def _block_d(d: int) -> int:
    return min(triton.next_power_of_2(max(d, 1)), 64)


@triton.jit
def _columns(D, BLOCK_D: tl.constexpr):
    """This program's row block and channels of an n x D row-major tensor: (row block,
    channels, channel mask)."""
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    return tl.program_id(0), cols, cols < D


@triton.jit
def _chunk(row0, n, D, cols, cmask, CHUNK: tl.constexpr):
    """Rows row0 .. row0 + CHUNK - 1 of the tensor on the channels ``cols``: (rows, row
    mask, mask, offsets)."""
    rows = row0 + tl.arange(0, CHUNK)
    rmask = rows < n
    offsets = rows.to(tl.int64)[:, None] * D + cols[None, :]
    return rows, rmask, rmask[:, None] & cmask[None, :], offsets


@triton.jit
def _column_dots_kernel(a, b, partials, n, D, ROWS: tl.constexpr, CHUNK: tl.constexpr,
                        BLOCK_D: tl.constexpr):
    pid_r, cols, cmask = _columns(D, BLOCK_D)
    total = tl.zeros([BLOCK_D], dtype=partials.dtype.element_ty)
    for start in range(0, ROWS, CHUNK):
        rows, rmask, mask, offsets = _chunk(pid_r * ROWS + start, n, D, cols, cmask, CHUNK)
        x = tl.load(a + offsets, mask=mask, other=0.0)
        total += tl.sum(x * tl.load(b + offsets, mask=mask, other=0.0), axis=0)
    tl.store(partials + pid_r.to(tl.int64) * D + cols, total, mask=cmask)


@triton.jit
def _cg_step_kernel(z, r, u, p, s, w, inv_diagonal, weights, gamma, gamma_prev, alpha_prev,
                    delta, done, alpha_out, partials, n, D, ROWS: tl.constexpr,
                    CHUNK: tl.constexpr, BLOCK_D: tl.constexpr):
    pid_r, cols, cmask = _columns(D, BLOCK_D)
    # the step lengths of this block's channels (every program makes the same ones)
    g = tl.load(gamma + cols, mask=cmask, other=0.0)
    g_prev = tl.load(gamma_prev + cols, mask=cmask, other=0.0)
    a_prev = tl.load(alpha_prev + cols, mask=cmask, other=0.0)
    dl = tl.load(delta + cols, mask=cmask, other=0.0)
    running = _load_done(done) == 0
    keep = (g_prev > 0) & (a_prev > 0)
    beta = tl.where(running & keep, g / tl.where(keep, g_prev, 1.0), 0.0)
    denominator = dl - tl.where(keep, beta * g / tl.where(keep, a_prev, 1.0), 0.0)
    positive = denominator > 0
    alpha = tl.where(running & positive, g / tl.where(positive, denominator, 1.0), 0.0)
    tl.store(alpha_out + cols, alpha, mask=cmask & (pid_r == 0))

    # the next r.u and ||scale r||^2: sum_i weights[k, i] r_i^2
    sum_u = tl.zeros([BLOCK_D], dtype=partials.dtype.element_ty)
    sum_res = tl.zeros([BLOCK_D], dtype=partials.dtype.element_ty)
    for start in range(0, ROWS, CHUNK):
        rows, rmask, mask, offsets = _chunk(pid_r * ROWS + start, n, D, cols, cmask, CHUNK)
        inv = tl.load(inv_diagonal + rows, mask=rmask, other=0.0)
        # u = M^-1 r (what the last update stored, to its rounding): r is read anyway, so u
        # is written for the sweep but not read back here (10 vectors moved per iteration,
        # not 11)
        r_old = tl.load(r + offsets, mask=mask, other=0.0)
        p_new = r_old * inv[:, None] + beta[None, :] * tl.load(p + offsets, mask=mask, other=0.0)
        s_new = tl.load(w + offsets, mask=mask, other=0.0) + \
            beta[None, :] * tl.load(s + offsets, mask=mask, other=0.0)
        z_new = tl.load(z + offsets, mask=mask, other=0.0) + alpha[None, :] * p_new
        r_new = r_old - alpha[None, :] * s_new
        tl.store(p + offsets, p_new, mask=mask)
        tl.store(s + offsets, s_new, mask=mask)
        tl.store(z + offsets, z_new, mask=mask)
        tl.store(r + offsets, r_new, mask=mask)
        tl.store(u + offsets, r_new * inv[:, None], mask=mask)
        r_sq = r_new * r_new
        w_u = tl.load(weights + rows, mask=rmask, other=0.0)
        w_res = tl.load(weights + n + rows, mask=rmask, other=0.0)
        sum_u += tl.sum(r_sq * w_u[:, None], axis=0)
        sum_res += tl.sum(r_sq * w_res[:, None], axis=0)
    base = pid_r.to(tl.int64) * 2 * D
    tl.store(partials + base + cols, sum_u, mask=cmask)
    tl.store(partials + base + D + cols, sum_res, mask=cmask)


@triton.jit(do_not_specialize=["k"])
def _cg_finish_kernel(sums, d, flags, history, k, BLOCK: tl.constexpr):
    """cg_update.TorchCGUpdate.finish in one program, float64: res = sqrt(max(sum_c
    sums[1, c], 0)) (NaN kept), history[k] = res / ref_safe; if live, the iteration counted,
    res kept, a non-finite res flagged as divergence; done once diverged or res <= target.
    State: solver_state.CG_STATE."""
    total = tl.sum(tl.zeros([BLOCK], dtype=tl.float64), axis=0)
    for start in range(0, d, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        total += tl.sum(tl.load(sums + d + cols, mask=cols < d, other=0.0).to(tl.float64),
                        axis=0)
    res = tl.sqrt(tl.where(total < 0, 0.0, total))  # a NaN stays NaN, as clamp_min keeps it
    bad = res * 0.0 != 0.0  # NaN or inf (no float literal: they are float32)
    tl.store(history + k, res / tl.load(flags + _REF_SAFE))
    record_iteration(flags, res, bad, res <= tl.load(flags + _TARGET))


def cg_finish(sums: Tensor, flags: Tensor, history: Tensor, k: int) -> None:
    """The bookkeeping of iteration k on the device (see the kernel), from the [2, d] sums."""
    d = sums.shape[1]
    _cg_finish_kernel[(1,)](sums.contiguous(), d, flags, history, k,
                            BLOCK=min(triton.next_power_of_2(max(d, 1)), 1024))


def _grid(n: int, d: int):
    return (triton.cdiv(n, ROWS), triton.cdiv(d, _block_d(d)))


def column_dots(a: Tensor, b: Tensor) -> Tensor:
    """[d]: sum_i a_i * b_i per column of two n x d tensors."""
    n, d = a.shape
    if n == 0 or d == 0:
        return a.new_zeros(d)
    grid = _grid(n, d)
    partials = a.new_empty(grid[0], d)
    _column_dots_kernel[grid](a, b, partials, n, d, ROWS=ROWS, CHUNK=chunk_rows(a),
                              BLOCK_D=_block_d(d))
    return partials.sum(dim=0)


def cg_step(state, w: Tensor, delta: Tensor, done: Tensor):
    """One update of ``state`` (:class:`~.cg_update.CGState`) in place, after the sweep
    w = A u with delta = w.u (global), unless ``done`` (its first element nonzero: the
    solve's flags) says the solve is done (then alpha = beta = 0); returns (alpha [d], the
    local sums [2, d] of the new r.u and ||scale r||^2)."""
    n, d = state.r.shape
    alpha = delta.new_empty(d)
    if n == 0 or d == 0:
        alpha.zero_()
        return alpha, state.r.new_zeros(2, d)
    grid = _grid(n, d)
    partials = state.r.new_empty(grid[0], 2, d)
    _cg_step_kernel[grid](state.z, state.r, state.u, state.p, state.s, w.contiguous(),
                          state.inv_diagonal, state.weights, state.gamma, state.gamma_prev,
                          state.alpha_prev, delta.contiguous(), done.reshape(-1), alpha,
                          partials, n, d, ROWS=ROWS, CHUNK=chunk_rows(state.r),
                          BLOCK_D=_block_d(d))
    return alpha, partials.sum(dim=0)
