"""The vector work of one Anderson iteration (:func:`.anderson_solver.anderson`) around its sweep,
written once in PyTorch and once as Triton kernels.

Per channel, with the window's differences dF, dG (slot-major m x n x d, ``filled`` slots in
use), f = step(y) - y and gy = step(y), an iteration is:

- ``gamma``: gamma from the regularized normal equations (dF^T dF + lam I) gamma = dF^T f,
  lam = reg * mean(diag(dF^T dF)) + tiny (the Gram matrix and the right-hand side kept from
  the previous iteration's ``finish``; a batch of small SPD systems solved by Cholesky,
  a = L L^T:

      L_jj = sqrt(max(a_jj - sum_{k<j} L_jk^2, tiny)),
      L_ij = (a_ij - sum_{k<j} L_ik L_jk) / L_jj              (i > j),
      L y = b (forward substitution), L^T x = y (back substitution),

  tiny = the dtype's smallest normal number keeping a semi-definite pivot finite); whatever
  is not finite is zeroed (the step is then the plain fixed-point step);
- ``mix``: the mixed iterate y_new = gy - sum_j dG_j gamma_j;
- (the sweep gy_new = step(y_new));
- ``record``: f_new = gy_new - y_new, the window's slot ``slot`` set to dF = f_new - f,
  dG = gy_new - gy, and the sums the iteration needs of them in float64: ||f_new||^2 (a row
  that sums to it), then per channel the new row and column <dF_j, dF_slot> of the Gram
  matrix and the next right-hand side <dF_j, f_new>, for the ``count`` filled slots (this
  process's rows: a partitioned solve sums the table over processes);
- ``finish``: from the (global) sums, the residual ||f_new||, the history, the solve's state
  (``dignn_kernels.solver_state.ANDERSON_STATE``: done, diverged, sweeps, residual, whether
  the iterate is accepted), the Gram matrix's new row and column and the next right-hand
  side, all on the device.

- :class:`AndersonVectors`: PyTorch ops, any device. The dots loop over the slots with one
  scratch buffer (on the CPU faster than any batched form of these per-channel products, but
  still two passes per slot and vector: the record reads or writes an n x d vector about 50
  times for a window of 5);
  the small solves are LAPACK's on the CPU (:func:`lapack_small_spd_solve`: 26 against 330 us
  for 64 systems of 5 x 5 on this 2-core CPU) and elementwise ops on a GPU
  (:func:`torch_small_spd_solve`: no host check, about a hundred small ops for m = 5).
- :class:`TritonAndersonVectors`: on a GPU each step is one kernel
  (:mod:`._triton_anderson`): gamma (the regularization, the small solves in registers for
  m <= ``TRITON_MAX_M``, the zeroing and the cast), the mix in one pass (filled + 2 vectors,
  where the chain of addcmul reads and writes three per slot), the record in one pass
  (reading gy_new, y_new, f, gy and the other count - 1 slots once, writing f_new and the
  two slots; its sums in the same pass, where the PyTorch ops read the window twice and
  each of f_new and the slots again) and the finish in one small kernel, where the PyTorch
  ops take about thirty. On the CPU its kernels run only in the Triton interpreter (the
  tests).
- :class:`CpuAndersonVectors`: on the CPU, the PyTorch ops with the record as the compiled
  op ``dignn::anderson_record`` (:func:`dignn_kernels.ops.anderson_record`): one pass over
  the rows, its sums in float64 as the Triton record's.

:func:`anderson_vectors_for` picks one as :func:`.cg_update.cg_update_for` picks cg's update.
"""
from typing import Optional

import torch
from torch import Tensor

from ..solver_state import (ACCEPT, ANDERSON_STATE, DIVERGED, DONE, REF_SAFE, RESIDUAL,
                            SHARED_STATE, SWEEPS, TARGET, state_of)
from .cg_update import resolve_vector_kernels

__all__ = ["AndersonVectors", "TritonAndersonVectors", "CpuAndersonVectors",
           "anderson_vectors_for",
           "torch_small_spd_solve", "lapack_small_spd_solve", "anderson_state",
           "anderson_regularization", "TRITON_MAX_M"]

# The largest window the Triton solve holds in registers (a B x 16 x 16 tile per program).
TRITON_MAX_M = 16


def torch_small_spd_solve(a: Tensor, b: Tensor) -> Tensor:
    """x with a x = b for a batch of small SPD matrices (a: B x m x m, b: B x m; module
    docstring), in elementwise tensor ops."""
    m = a.shape[-1]
    tiny = torch.finfo(a.dtype).tiny
    chol = torch.zeros_like(a)
    for j in range(m):
        row = chol[:, j, :j]
        pivot = (a[:, j, j] - (row * row).sum(dim=1)).clamp_min(tiny).sqrt()
        chol[:, j, j] = pivot
        if j + 1 < m:
            below = (chol[:, j + 1:, :j] * row.unsqueeze(1)).sum(dim=2)
            chol[:, j + 1:, j] = (a[:, j + 1:, j] - below) / pivot.unsqueeze(1)
    y = torch.zeros_like(b)
    for i in range(m):  # chol y = b
        y[:, i] = (b[:, i] - (chol[:, i, :i] * y[:, :i]).sum(dim=1)) / chol[:, i, i]
    x = torch.zeros_like(b)
    for i in reversed(range(m)):  # chol^T x = y
        x[:, i] = (y[:, i] - (chol[:, i + 1:, i] * x[:, i + 1:]).sum(dim=1)) / chol[:, i, i]
    return x


def lapack_small_spd_solve(a: Tensor, b: Tensor) -> Tensor:
    """The same by LAPACK (``torch.linalg.cholesky_ex``, ``torch.cholesky_solve``); a system
    whose factorization fails (not positive definite, or not finite) gets NaN."""
    chol, info = torch.linalg.cholesky_ex(a)
    x = torch.cholesky_solve(b.unsqueeze(-1), chol).squeeze(-1)
    return x.masked_fill_((info != 0).unsqueeze(-1), float("nan"))


def anderson_regularization(dtype: torch.dtype) -> float:
    """reg: the Tikhonov term of the window's normal equations relative to their mean
    diagonal, above the rounding of a Gram matrix accumulated in ``dtype``."""
    return 1e-12 if dtype == torch.float64 else 1e-6


def anderson_state(residual: Tensor, target: Tensor, ref_safe: Tensor) -> Tensor:
    """The state after the first sweep (f = step(rhs) - rhs, ``residual`` its norm): one
    sweep, diverged where the residual is not finite, done then or where it meets the
    target."""
    diverged = ~torch.isfinite(residual)
    fields = {DONE: diverged | (residual <= target), DIVERGED: diverged,
              SWEEPS: torch.ones_like(residual), RESIDUAL: residual, TARGET: target,
              REF_SAFE: ref_safe, ACCEPT: torch.zeros_like(residual)}
    return state_of(fields, ANDERSON_STATE)


class AndersonVectors:
    """The iteration's vector work in PyTorch ops, for one solve of ``rhs``'s shape and a
    window of ``window`` slots."""

    name = "torch"

    def __init__(self, rhs: Tensor, window: int):
        self.solve = lapack_small_spd_solve if rhs.device.type == "cpu" else \
            torch_small_spd_solve
        self._scratch = None
        self._eye = torch.eye(window, dtype=torch.float64, device=rhs.device)
        self._reg = anderson_regularization(rhs.dtype)

    def gamma(self, gram: Tensor, proj: Tensor, dtype: torch.dtype) -> Tensor:
        """[m, d] in ``dtype``, contiguous: gamma of every channel from its Gram matrix
        (``gram``: d x m x m, float64) and right-hand side (``proj``: m x d, float64),
        regularized, anything not finite zeroed. (The mix multiplies every row of a slot by
        gamma[j]: with the transposed solution's stride of m between channels, the CPU's
        broadcast addcmul took 16 against 7 ms for 5 slots of cornell5's 18,660 x 64, side by
        side in one process, one thread, another job on the other core.)"""
        tiny = torch.finfo(torch.float64).tiny
        lam = self._reg * gram.diagonal(dim1=1, dim2=2).mean(dim=1) + tiny
        gamma = self.solve(gram + lam[:, None, None] * self._eye, proj.t())
        return torch.nan_to_num(gamma, nan=0.0, posinf=0.0, neginf=0.0).t().to(
            dtype, memory_format=torch.contiguous_format)

    def record(self, gy_new: Tensor, y_new: Tensor, f: Tensor, gy: Tensor, d_f: Tensor,
               d_g: Tensor, slot: int, count: int):
        """(f_new, sums): f_new = gy_new - y_new (a new tensor), d_f[slot] = f_new - f and
        d_g[slot] = gy_new - gy written, and the [1 + 2 count, d] float64 sums of this
        process's rows: ||f_new||^2 (a row whose sum is it: here all in its first entry),
        then <d_f[j], d_f[slot]> and <d_f[j], f_new> for j < count, per channel."""
        f_new = gy_new - y_new
        torch.sub(f_new, f, out=d_f[slot])
        torch.sub(gy_new, gy, out=d_g[slot])
        # ||f_new||^2 in the first channel's entry (the finish sums the row): one read of f_new,
        # where per-channel float64 norms take 50x longer on the CPU
        square = torch.zeros(1, f_new.shape[1], dtype=torch.float64, device=f_new.device)
        square[:, :1] = torch.linalg.vector_norm(f_new).double().square()
        return f_new, torch.cat([square, self.dots(d_f, d_f[slot], count),
                                 self.dots(d_f, f_new, count)])

    @staticmethod
    def finish(sums: Tensor, count: int, slot: int, gram: Tensor, proj: Tensor, state: Tensor,
               history: Tensor, k: int) -> None:
        """The bookkeeping of iteration k from the (global) sums of :meth:`record`, in place on
        the device: the Gram matrix's row and column ``slot``, the next right-hand side's first
        ``count`` rows, the relative residual into history[k] (the loop's
        :func:`~.common.history_slot` of k) and, if the solve was live, the iteration counted, a
        finite residual kept and its iterate accepted, a non-finite one flagged as divergence;
        then done once diverged or the residual meets the target."""
        column = sums[1:1 + count].t()
        gram[:, :count, slot] = column
        gram[:, slot, :count] = column
        proj[:count] = sums[1 + count:]
        res = sums[0].sum().clamp_min(0.0).sqrt()  # (a NaN stays NaN)
        history[k] = res / state[REF_SAFE]
        bad = ~torch.isfinite(res)
        live = state[DONE] == 0
        accept = live & ~bad
        fields = [(state[DONE] != 0) | bad | (res <= state[TARGET]),
                  (state[DIVERGED] != 0) | (live & bad), state[SWEEPS] + live,
                  torch.where(accept, res, state[RESIDUAL])]
        state[:SHARED_STATE] = torch.stack([t.double() for t in fields])
        state[ACCEPT] = accept.double()

    def dots(self, slots: Tensor, v: Tensor, filled: int) -> Tensor:
        """[filled, d] float64: <slots[j], v> per channel for j < filled (this process's
        rows)."""
        if self._scratch is None:
            self._scratch = torch.empty_like(v)
        return torch.stack([torch.mul(slots[j], v, out=self._scratch).sum(dim=0)
                            for j in range(filled)]).double()

    @staticmethod
    def mix(gy: Tensor, d_g: Tensor, gamma: Tensor, filled: int) -> Tensor:
        """gy - sum_{j < filled} d_g[j] gamma[j] (gamma: [m, d] in gy's dtype), a new tensor."""
        y = torch.addcmul(gy, d_g[0], gamma[0], value=-1.0)
        for j in range(1, filled):
            y.addcmul_(d_g[j], gamma[j], value=-1.0)
        return y


class TritonAndersonVectors(AndersonVectors):
    """The same as Triton kernels (:mod:`._triton_anderson`; a window of more than
    ``TRITON_MAX_M`` slots takes the PyTorch gamma)."""

    name = "triton"

    def __init__(self, rhs: Tensor, window: int):
        super().__init__(rhs, window)
        if window <= TRITON_MAX_M:
            from ._triton_anderson import anderson_gamma
            self.gamma = lambda gram, proj, dtype: anderson_gamma(gram, proj, self._reg, dtype)

    @staticmethod
    def record(gy_new: Tensor, y_new: Tensor, f: Tensor, gy: Tensor, d_f: Tensor, d_g: Tensor,
               slot: int, count: int):
        from ._triton_anderson import window_record
        return window_record(gy_new, y_new, f, gy, d_f, d_g, slot, count)

    @staticmethod
    def finish(sums: Tensor, count: int, slot: int, gram: Tensor, proj: Tensor, state: Tensor,
               history: Tensor, k: int) -> None:
        """:meth:`AndersonVectors.finish` in one kernel."""
        from ._triton_anderson import anderson_finish
        anderson_finish(sums, count, slot, gram, proj, state, history, k)

    @staticmethod
    def mix(gy: Tensor, d_g: Tensor, gamma: Tensor, filled: int) -> Tensor:
        from ._triton_anderson import window_mix
        return window_mix(gy, d_g, gamma, filled)


class CpuAndersonVectors(AndersonVectors):
    """The PyTorch ops with the record in one compiled pass (CPU, float32 or float64)."""

    name = "cpu"

    @staticmethod
    def record(gy_new: Tensor, y_new: Tensor, f: Tensor, gy: Tensor, d_f: Tensor, d_g: Tensor,
               slot: int, count: int):
        from ..ops import anderson_record
        return anderson_record(gy_new, y_new, f, gy, d_f, d_g, slot, count)


def anderson_vectors_for(rhs: Tensor, window: int, vector_kernels: Optional[str] = None
                         ) -> AndersonVectors:
    """The vector work for one solve of ``rhs`` with ``window`` slots: ``vector_kernels`` as
    for cg (:func:`.cg_update.resolve_vector_kernels`); None on the CPU: the PyTorch ops with
    the compiled record (:class:`CpuAndersonVectors`), "torch" the PyTorch ops alone."""
    if resolve_vector_kernels(rhs, vector_kernels) == "triton":
        return TritonAndersonVectors(rhs, window)
    if vector_kernels is None and rhs.device.type == "cpu" and \
            rhs.dtype in (torch.float32, torch.float64):
        return CpuAndersonVectors(rhs, window)
    return AndersonVectors(rhs, window)
