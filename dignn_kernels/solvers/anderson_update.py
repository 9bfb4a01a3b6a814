"""The vector work of one Anderson iteration (:func:`.loops.anderson`) around its sweep,
written once in PyTorch and once as Triton kernels.

Per channel, with the window's differences dF, dG (slot-major m x n x d, ``filled`` slots in
use), f = step(y) - y and gy = step(y):

- the dot products <dF_j, v> of the filled slots with a vector v (the right-hand side dF^T f
  and, after the sweep, the new row and column of the Gram matrix dF^T dF), summed in float64;
- gamma from the regularized normal equations (dF^T dF + lam I) gamma = dF^T f, a batch of
  small SPD systems solved by Cholesky, a = L L^T:

      L_jj = sqrt(max(a_jj - sum_{k<j} L_jk^2, tiny)),
      L_ij = (a_ij - sum_{k<j} L_ik L_jk) / L_jj              (i > j),
      L y = b (forward substitution), L^T x = y (back substitution),

  tiny = the dtype's smallest normal number keeping a semi-definite pivot finite (the caller
  zeroes whatever is not finite);
- the mixed iterate y_new = gy - sum_j dG_j gamma_j.

- :class:`AndersonVectors`: PyTorch ops, any device. The dots loop over the slots with one
  scratch buffer (on the CPU faster than any batched form of these per-channel products);
  the small solves are LAPACK's on the CPU (:func:`lapack_small_spd_solve`: 26 against 330 us
  for 64 systems of 5 x 5 on this 2-core CPU) and elementwise ops on a GPU
  (:func:`torch_small_spd_solve`: no host check, about a hundred small ops for m = 5).
- :class:`TritonAndersonVectors`: on a GPU each of the three is one kernel
  (:mod:`._triton_anderson`): the dots of all slots in one pass over the window (reading
  filled + 1 vectors, where the loop reads and writes four per slot), the small solves in
  registers (for m <= ``TRITON_MAX_M``), the mix in one pass (filled + 2 vectors, where the
  chain of addcmul reads and writes three per slot). On the CPU its kernels run only in the
  Triton interpreter (the tests).

:func:`anderson_vectors_for` picks one as :func:`.cg_update.cg_update_for` picks cg's update.
"""
from typing import Optional

import torch
from torch import Tensor

from .cg_update import resolve_vector_kernels

__all__ = ["AndersonVectors", "TritonAndersonVectors", "anderson_vectors_for",
           "torch_small_spd_solve", "lapack_small_spd_solve", "TRITON_MAX_M"]

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


class AndersonVectors:
    """The iteration's vector work in PyTorch ops, for one solve of ``rhs``'s shape."""

    name = "torch"

    def __init__(self, rhs: Tensor, window: int):
        self.solve = lapack_small_spd_solve if rhs.device.type == "cpu" else \
            torch_small_spd_solve
        self._scratch = None

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
    """The same as Triton kernels (:mod:`._triton_anderson`)."""

    name = "triton"

    def __init__(self, rhs: Tensor, window: int):
        super().__init__(rhs, window)
        if window <= TRITON_MAX_M:
            from ._triton_anderson import small_spd_solve
            self.solve = small_spd_solve

    def dots(self, slots: Tensor, v: Tensor, filled: int) -> Tensor:
        from ._triton_anderson import window_dots
        return window_dots(slots, v, filled)

    @staticmethod
    def mix(gy: Tensor, d_g: Tensor, gamma: Tensor, filled: int) -> Tensor:
        from ._triton_anderson import window_mix
        return window_mix(gy, d_g, gamma, filled)


def anderson_vectors_for(rhs: Tensor, window: int, vector_kernels: Optional[str] = None
                         ) -> AndersonVectors:
    """The vector work for one solve of ``rhs`` with ``window`` slots: ``vector_kernels`` as
    for cg (:func:`.cg_update.resolve_vector_kernels`)."""
    if resolve_vector_kernels(rhs, vector_kernels) == "triton":
        return TritonAndersonVectors(rhs, window)
    return AndersonVectors(rhs, window)
