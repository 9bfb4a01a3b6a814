"""What every solver shares: its result (:class:`SolveResult`), its warning
(:class:`DivergenceWarning`), and the sums it takes over the rows, through the system's
``reduce`` on a partitioned graph (:mod:`.registry` has the one signature of a solver)."""
import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import Tensor

from ..checks import check_int

__all__ = ["DivergenceWarning", "SolveResult", "Reduce", "HISTORY_LENGTH", "check_every_arg",
           "global_sum", "global_norm", "row_sq", "weighted_sq", "start_solve", "empty_history",
           "history_slot", "finish_solve"]

# Sums per-process partial sums over the processes of a partitioned solve (an all-reduce that
# stays on the device); None: one process holds every row.
Reduce = Optional[Callable[[Tensor], Tensor]]

#: The most entries a solve's :attr:`SolveResult.history` keeps: the relative residuals of
#: its first HISTORY_LENGTH sweeps, whatever ``max_iter`` is (80 KB of float64), so that no
#: allocation grows with ``max_iter``. Later sweeps still count in the stats; the last one's
#: residual is :attr:`SolveResult.relative`.
HISTORY_LENGTH = 10_000


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
    ||Z_{k+2}||), for k below min(max_iter + 1, :data:`HISTORY_LENGTH`); ``sweeps`` counts
    the sweeps done before convergence; ``residual`` and ``relative`` describe the returned
    solution (fixed point: the last difference ||Z_K - Z_{K-1}|| and that over ||Z_K||, the
    paper's stopping test); ``diverged`` flags a fixed point that broke its divergence
    certificate or a non-finite residual."""

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
    """The sum over the processes of a partitioned solve of per-process partial sums.

    Args:
        partial: this process's partial sums (any shape).
        reduce: the system's ``reduce`` (an all-reduce on the device), None on one process.

    Returns:
        The global sums (``partial`` itself on one process).

    Example:
        >>> import torch
        >>> from dignn_kernels.solvers.common import global_sum
        >>> global_sum(torch.tensor([1.0, 2.0]), None).tolist()
        [1.0, 2.0]
    """
    return partial if reduce is None else reduce(partial)


def global_norm(t: Tensor, reduce: Reduce = None) -> Tensor:
    """||t||_F over every process's rows.

    Args:
        t: this process's rows (16-bit storage is summed in float32).
        reduce: the system's ``reduce``, None on one process.

    Returns:
        A 0-dim float64 tensor on t's device.

    Example:
        >>> import torch
        >>> from dignn_kernels.solvers.common import global_norm
        >>> float(global_norm(torch.tensor([[3.0], [4.0]])))
        5.0
    """
    if reduce is None:
        return torch.linalg.vector_norm(t, dtype=torch.float32 if t.dtype in _HALF else None
                                        ).double()
    return reduce(_wide(t).square().sum(dtype=torch.float64)).sqrt()


def row_sq(t: Tensor) -> Tensor:
    """||t_i||^2 of every row, from one read of t: the reduction widens each element (16-bit
    storage included) without a widened or squared copy of t.

    Args:
        t: n x d.

    Returns:
        [n] float64.

    Example:
        >>> import torch
        >>> from dignn_kernels.solvers.common import row_sq
        >>> row_sq(torch.tensor([[3.0, 4.0], [1.0, 0.0]])).tolist()
        [25.0, 1.0]
    """
    return torch.linalg.vector_norm(t, dim=1, dtype=torch.float64).square()


def weighted_sq(t: Tensor, weight: Tensor, reduce: Reduce = None,
                rows: Optional[Tensor] = None) -> Tensor:
    """sum_i weight_i ||t_i||^2 over every process's rows.

    Args:
        t: this process's rows, n x d.
        weight: [n] per-row weights.
        reduce: the system's ``reduce``, None on one process.
        rows: t's :func:`row_sq`, if at hand (one read of t less).

    Returns:
        A 0-dim float64 tensor.

    Example:
        >>> import torch
        >>> from dignn_kernels.solvers.common import weighted_sq
        >>> float(weighted_sq(torch.tensor([[3.0, 4.0], [1.0, 0.0]]), torch.tensor([1.0, 2.0])))
        27.0
    """
    rows = row_sq(t) if rows is None else rows
    return global_sum((rows * weight.double()).sum(), reduce)


def start_solve(rhs: Tensor, max_iter: int, ref: Optional[Tensor] = None,
                reduce: Reduce = None):
    """What a solve starts from: its reference norm and an empty history.

    Args:
        rhs: the right-hand side.
        max_iter: the solve's most sweeps (the history keeps one entry more, up to
            :data:`HISTORY_LENGTH`).
        ref: the reference norm, if not ||rhs||_F.
        reduce: the system's ``reduce``, None on one process.

    Returns:
        (ref, ref_safe, history): the reference norm (float64), it kept away from 0 for the
        divisions, and the history of relative residuals, NaN so far: the
        min(max_iter + 1, HISTORY_LENGTH) entries :func:`finish_solve` returns, then one
        that takes the entries of the sweeps past them (:func:`history_slot`), so that the
        loops and kernels write every sweep's entry without a test of their own.

    Example:
        >>> import torch
        >>> from dignn_kernels.solvers.common import start_solve
        >>> ref, ref_safe, history = start_solve(torch.zeros(2, 1), max_iter=3)
        >>> float(ref), bool(ref_safe > 0), history.shape
        (0.0, True, torch.Size([5]))
        >>> start_solve(torch.zeros(2, 1), max_iter=10**9)[2].shape  # not 8 GB
        torch.Size([10001])
    """
    ref = global_norm(rhs, reduce) if ref is None else ref.double()
    ref_safe = ref.clamp_min(torch.finfo(torch.float64).tiny)
    return ref, ref_safe, empty_history(max_iter, rhs.device)


def empty_history(max_iter: int, device: torch.device) -> Tensor:
    """The history of :func:`start_solve` before the solve: NaN.

    Args:
        max_iter: the solve's most sweeps.
        device: the solve's device.

    Returns:
        min(max_iter + 1, HISTORY_LENGTH) + 1 float64 NaN.

    Example:
        >>> import torch
        >>> from dignn_kernels.solvers.common import empty_history
        >>> empty_history(2, torch.device("cpu")).tolist()
        [nan, nan, nan, nan]
    """
    return torch.full((min(max_iter + 1, HISTORY_LENGTH) + 1,), math.nan, dtype=torch.float64,
                      device=device)


def history_slot(history: Tensor, k: int) -> int:
    """Where a solve's entry k goes in the history of :func:`start_solve`: k while it is kept,
    else the last slot, which :func:`finish_solve` drops.

    Args:
        history: the history of :func:`start_solve`.
        k: the entry (a sweep count).

    Returns:
        The index to write.

    Example:
        >>> import torch
        >>> from dignn_kernels.solvers.common import history_slot, start_solve
        >>> history = start_solve(torch.ones(2, 1), max_iter=3)[2]
        >>> history_slot(history, 2), history_slot(history, 7)
        (2, 4)
    """
    return min(k, history.numel() - 1)


def finish_solve(solution, rhs, history, sweeps, residual, ref_safe, diverged, valid_upto):
    """A solve's :class:`SolveResult`.

    Args:
        solution: the solution (``rhs`` itself is copied: the caller owns its result).
        rhs: the right-hand side.
        history: the relative residuals of :func:`start_solve`; NaN from ``valid_upto`` on
            (its last slot dropped).
        sweeps: the sweeps done (0-dim tensor).
        residual: the final residual (0-dim float64).
        ref_safe: the reference norm of :func:`start_solve`.
        diverged: 0-dim bool.
        valid_upto: how many history entries are valid (int or 0-dim tensor).

    Returns:
        The :class:`SolveResult`, its relative residual residual / ref_safe.

    Example:
        >>> import torch
        >>> from dignn_kernels.solvers.common import finish_solve, start_solve
        >>> rhs = torch.ones(2, 1)
        >>> ref, ref_safe, history = start_solve(rhs, max_iter=2)
        >>> out = finish_solve(rhs, rhs, history, torch.tensor(0), ref, ref_safe,
        ...                    torch.tensor(False), 1)
        >>> out.solution is rhs, float(out.relative)
        (False, 1.0)
    """
    history = history[:-1]
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
