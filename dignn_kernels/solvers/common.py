"""What every solver shares: its result (:class:`SolveResult`), its warning
(:class:`DivergenceWarning`), and the sums it takes over the rows, through the system's
``reduce`` on a partitioned graph (:mod:`.registry` has the one signature of a solver)."""
import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import Tensor

from ..checks import check_int

__all__ = ["DivergenceWarning", "SolveResult", "Reduce", "check_every_arg", "global_sum",
           "global_norm", "row_sq", "weighted_sq", "start_solve", "finish_solve"]

# Sums per-process partial sums over the processes of a partitioned solve (an all-reduce that
# stays on the device); None: one process holds every row.
Reduce = Optional[Callable[[Tensor], Tensor]]


class DivergenceWarning(RuntimeWarning):
    """A solve diverged or produced non-finite values: its output is not the equilibrium.

    Example:
        >>> import warnings
        >>> from dignn_kernels.solvers import DivergenceWarning
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("error", DivergenceWarning)  # a failed solve raises
        ...     issubclass(DivergenceWarning, RuntimeWarning)
        True
    """


@dataclass
class SolveResult:
    """What a solver returns; every tensor stays on the solve's device.

    ``history[k]`` is the relative residual of the iterate that k CSR sweeps produced (NaN
    where unknown or past the end; fixed point: of the sweep k + 1, ||Z_{k+2} - Z_{k+1}|| over
    ||Z_{k+2}||); ``sweeps`` counts the sweeps done before convergence; ``residual`` and
    ``relative`` describe the returned solution (fixed point: the last difference
    ||Z_K - Z_{K-1}|| and that over ||Z_K||, the paper's stopping test);
    ``diverged`` flags a fixed point that broke its divergence certificate or a non-finite
    residual."""

    solution: Tensor
    history: Tensor
    sweeps: Tensor
    residual: Tensor
    relative: Tensor
    diverged: Tensor

    counts_start: bool = False  # fixed point: Z_1 = X is iteration 1 (the paper's count)

    def stats(self) -> Tensor:
        """[iterations, residual, relative residual, diverged] as float64: iterations are
        the sweeps, plus 1 for the fixed point, whose first iterate Z_1 = X costs none."""
        return torch.stack([self.sweeps.double() + float(self.counts_start),
                            self.residual.double(), self.relative.double(),
                            self.diverged.double()])


_HALF = (torch.bfloat16, torch.float16)  # 16-bit storage: reductions sum in float32


def _wide(t: Tensor) -> Tensor:
    """``t`` for a sum: 16-bit storage widened to float32 (squares of float16 overflow above
    256)."""
    return t.float() if t.dtype in _HALF else t


def global_sum(partial: Tensor, reduce: Reduce) -> Tensor:
    """The sum over processes of per-process partial sums (itself on one process)."""
    return partial if reduce is None else reduce(partial)


def global_norm(t: Tensor, reduce: Reduce = None) -> Tensor:
    """||t||_F over every process's rows, float64 (16-bit t summed in float32)."""
    if reduce is None:
        return torch.linalg.vector_norm(t, dtype=torch.float32 if t.dtype in _HALF else None
                                        ).double()
    return reduce(_wide(t).square().sum(dtype=torch.float64)).sqrt()


def row_sq(t: Tensor) -> Tensor:
    """||t_i||^2 of every row in float64, from one read of t: the reduction widens each element
    (16-bit storage included) without a widened or squared copy of t."""
    return torch.linalg.vector_norm(t, dim=1, dtype=torch.float64).square()


def weighted_sq(t: Tensor, weight: Tensor, reduce: Reduce = None,
                rows: Optional[Tensor] = None) -> Tensor:
    """sum_i weight_i ||t_i||^2 over every process's rows (``rows``: t's :func:`row_sq`, if
    at hand)."""
    rows = row_sq(t) if rows is None else rows
    return global_sum((rows * weight.double()).sum(), reduce)


def start_solve(rhs: Tensor, max_iter: int, ref: Optional[Tensor] = None,
                reduce: Reduce = None):
    """(ref, ref_safe, history) of a solve: the reference norm (default ||rhs||_F), it kept
    away from 0 for the divisions, and the history of relative residuals, NaN so far."""
    dev = rhs.device
    ref = global_norm(rhs, reduce) if ref is None else ref.double()
    ref_safe = ref.clamp_min(torch.finfo(torch.float64).tiny)
    history = torch.full((max_iter + 1,), math.nan, dtype=torch.float64, device=dev)
    return ref, ref_safe, history


def finish_solve(solution, rhs, history, sweeps, residual, ref_safe, diverged, valid_upto):
    """The :class:`SolveResult`: the history NaN from ``valid_upto`` on, a solution that is
    still ``rhs`` itself copied (the caller owns its result)."""
    positions = torch.arange(history.numel(), device=history.device)
    history = torch.where(positions < valid_upto, history, torch.nan)
    if solution is rhs:
        solution = rhs.clone()
    return SolveResult(solution, history, sweeps, residual, residual / ref_safe, diverged)


def check_every_arg(check_every: int) -> int:
    """``check_every`` checked: an integer >= 0 (0: ``max_iter`` sweeps, no host check).

    Args:
        check_every: host reads of the convergence flag, every this many sweeps.

    Returns:
        ``check_every``.

    Raises:
        ValueError: it is not an integer >= 0 (a bool included).

    Example:
        >>> from dignn_kernels.solvers import check_every_arg
        >>> check_every_arg(4)
        4
    """
    check_int("check_every", check_every, 0)
    return check_every
