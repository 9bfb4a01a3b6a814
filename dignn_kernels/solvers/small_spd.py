"""Anderson's least squares per channel: a batch of small SPD systems a x = b (a: B x m x m,
the window's regularized normal equations; b: B x m), solved by Cholesky, a = L L^T:

    L_jj = sqrt(max(a_jj - sum_{k<j} L_jk^2, tiny)),
    L_ij = (a_ij - sum_{k<j} L_ik L_jk) / L_jj              (i > j),
    L y = b (forward substitution), L^T x = y (back substitution);

tiny = the dtype's smallest normal number keeps a semi-definite pivot finite (the caller
zeroes whatever is not finite). Written three times:

- :func:`torch_small_spd_solve`: elementwise tensor ops on the device, no host check (a GPU
  without Triton); about a hundred small ops for m = 5, each one kernel launch on a GPU;
- :func:`~._triton_small_spd.triton_small_spd_solve`: the same in one launch, each program a
  block of systems in registers (for m <= ``TRITON_MAX_M``); on the CPU it runs only in the
  Triton interpreter (the tests);
- :func:`lapack_small_spd_solve`: LAPACK's Cholesky (``torch.linalg.cholesky_ex``,
  ``torch.cholesky_solve``), the CPU's: 26 against 330 us for 64 systems of 5 x 5 (this
  2-core CPU, one or two threads); a system whose factorization fails (not positive definite,
  or not finite) gets NaN, which the caller zeroes.

:func:`small_spd_solve_for` picks one, the GPU's as :func:`.cg_update.cg_update_for` picks
cg's update.
"""
from typing import Callable, Optional

import torch
from torch import Tensor

from .cg_update import resolve_vector_kernels

__all__ = ["torch_small_spd_solve", "lapack_small_spd_solve", "small_spd_solve_for",
           "TRITON_MAX_M"]

# The largest window the Triton kernel holds in registers (a B x 16 x 16 tile per program).
TRITON_MAX_M = 16


def torch_small_spd_solve(a: Tensor, b: Tensor) -> Tensor:
    """x with a x = b for a batch of small SPD matrices (module docstring), in tensor ops."""
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
    """x with a x = b by LAPACK (module docstring); NaN for a system it cannot factor."""
    chol, info = torch.linalg.cholesky_ex(a)
    x = torch.cholesky_solve(b.unsqueeze(-1), chol).squeeze(-1)
    return x.masked_fill_((info != 0).unsqueeze(-1), float("nan"))


def small_spd_solve_for(rhs: Tensor, window: int, vector_kernels: Optional[str] = None
                        ) -> Callable[[Tensor, Tensor], Tensor]:
    """The solve for ``rhs``'s device and an Anderson ``window``: ``vector_kernels`` as for
    cg (:func:`.cg_update.resolve_vector_kernels`) picks the Triton kernel (windows up to
    ``TRITON_MAX_M``); else LAPACK on the CPU, the tensor ops on a GPU."""
    if resolve_vector_kernels(rhs, vector_kernels) == "triton" and window <= TRITON_MAX_M:
        from ._triton_small_spd import triton_small_spd_solve
        return triton_small_spd_solve
    return lapack_small_spd_solve if rhs.device.type == "cpu" else torch_small_spd_solve
