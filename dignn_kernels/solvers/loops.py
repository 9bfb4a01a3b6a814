r"""The solvers of the implicit layer, written once over the pass interface: every sweep is a
row pass of :class:`~dignn_kernels.solvers.system.EquilibriumSystem`, so every backend runs
them. The layer's equilibrium (paper eq. 17) is Z = X - (1/mu) Delta Z with Delta = C^-1 L,
C = diag(chi), L = K - W, K = diag(kappa) (:mod:`dignn_kernels.laplacian`).

The solvers are registered by name (:mod:`.registry`, one signature), one module each:
``fixed_point`` (:mod:`.fixed_point_solver`, the paper's iteration), ``cg``
(:mod:`.cg_solver`, conjugate gradient on the SPD form, undirected graphs) and ``anderson``
(:mod:`.anderson_solver`, Anderson acceleration, any graph). :func:`solve_forward` and
:func:`solve_adjoint` look a solver up by its name; this module imports the three so that
they are registered, and keeps their names importable from here.

What every solver does the same way:

- Guard rows (chi_i <= 1e-30, see laplacian_math.h) keep z_i = x_i.
- Every loop keeps its residual norms, its convergence flag and its counters on the device
  (:mod:`dignn_kernels.solver_state`) and reads them on the host only every ``check_every``
  sweeps (0: never, a fixed ``max_iter`` sweeps); once converged, later sweeps leave the
  iterate unchanged, so the result does not depend on ``check_every``. That is what lets a
  solve run under CUDA graph capture.
- Nothing a solve allocates grows with ``max_iter``: its history keeps the relative residuals
  of the first :data:`HISTORY_LENGTH` sweeps (:func:`.common.start_solve`). Every loop returns
  to Python after each sweep, so Ctrl-C ends a solve there with a KeyboardInterrupt; the
  compiled backends' fused loop checks for it a few times a second (csrc/ops/interrupt.h).
- On a partitioned graph (:mod:`dignn_kernels.distributed`) each process holds some rows; the
  system's ``reduce`` (an all-reduce on the device) turns every partial norm and dot product
  into the global one, so that all processes take the same steps and stop together. With
  ``reduce`` None (one process) every loop runs as written.
"""
from typing import Optional

import torch
from torch import Tensor

from .common import HISTORY_LENGTH, DivergenceWarning, SolveResult, check_every_arg
from .registry import check_solver_storage, get_solver, solver_names
# the built-in solvers, registered in this order (SOLVERS and the messages that list them)
from .fixed_point_solver import fixed_point, fixed_point_diverged, fixed_point_update
from .cg_solver import conjugate_gradient
from .anderson_solver import ANDERSON_WINDOW, anderson

__all__ = ["SOLVERS", "ANDERSON_WINDOW", "HISTORY_LENGTH", "DivergenceWarning", "SolveResult",
           "fixed_point", "fixed_point_update", "conjugate_gradient", "anderson",
           "solve_forward", "solve_adjoint", "default_check_every", "check_every_arg",
           "fixed_point_diverged"]

#: The built-in solvers' names, registered by the imports above: what the layer's
#: ``solver=`` takes (and any solver registered with :func:`~.registry.register_solver`).
SOLVERS = solver_names()


def default_check_every(device: torch.device, solver: str = "cg") -> int:
    """How often a solve reads its convergence flag on the host, by default.

    Every sweep on the CPU (free there); on an accelerator the solver's own choice
    (:attr:`~.registry.SolverSpec.device_check_every`: every 16 fixed-point sweeps, so that a
    solve of the layer's default 10 iterations never waits for the device, every 4 sweeps of
    cg or anderson, which converge in fewer); never while a CUDA graph is being captured.

    Args:
        device: the solve's device.
        solver: a registered solver's name.

    Returns:
        The ``check_every`` of a solve there (0: no host read).

    Raises:
        ValueError: ``solver`` is not registered.

    Example:
        >>> import torch
        >>> from dignn_kernels.solvers import default_check_every
        >>> default_check_every(torch.device("cpu"), "fixed_point")
        1
    """
    spec = get_solver(solver)
    if device.type == "cpu":
        return 1
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return 0
    return spec.device_check_every


def _solve(system, rhs: Tensor, solver: str, adjoint: bool, *, max_iter: int, tol: float,
           check_every: int, window: int, callback,
           storage_dtype: Optional[torch.dtype]) -> SolveResult:
    """The registered ``solver``'s solve (its storage_dtype checked here, for every entry)."""
    check_solver_storage(solver, storage_dtype)
    return get_solver(solver).solve(system, rhs, adjoint=adjoint, max_iter=max_iter, tol=tol,
                                    check_every=check_every, window=window,
                                    callback=callback, storage_dtype=storage_dtype)


def solve_forward(system, x: Tensor, solver: str, *, max_iter: int, tol: float,
                  check_every: int = 1, window: int = ANDERSON_WINDOW, callback=None,
                  storage_dtype: Optional[torch.dtype] = None) -> SolveResult:
    """Z = X - (1/mu) Delta Z with a registered solver.

    Args:
        system: the problem's maps (:class:`~.system.EquilibriumSystem`, or a partitioned
            graph's :class:`~dignn_kernels.distributed.system.DistributedSystem`).
        x: the right-hand side X (nodes x channels).
        solver: a registered solver's name (:data:`SOLVERS`, or one added with
            :func:`~.registry.register_solver`).
        max_iter: the most sweeps for cg and anderson, iterations for the fixed point
            (see :func:`fixed_point`).
        tol: the solver's relative stopping tolerance.
        check_every: host reads of the convergence flag, every this many sweeps (0: none).
        window: Anderson's window.
        callback: called with the iteration's number after each sweep, or None.
        storage_dtype: None, or the 16-bit dtype the iterates (and so the solution) are
            stored in (solvers registered with ``storage_dtype=True`` only).

    Returns:
        The :class:`SolveResult`.

    Raises:
        ValueError: an unregistered ``solver``, or a ``storage_dtype`` it does not take.

    Example:
        >>> import torch, dignn_kernels as dk
        >>> from dignn_kernels.backends import get_backend
        >>> from dignn_kernels.solvers import solve_forward
        >>> ei = torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]])
        >>> g = dk.build_graph(ei, 3)
        >>> w, chi, kappa = g.fixed_laplacian("rw", torch.float64)
        >>> system = dk.solvers.EquilibriumSystem(get_backend("torch"), g.rowptr, g.col, w,
        ...                                       chi, kappa, 2.2)
        >>> out = solve_forward(system, torch.ones(3, 2, dtype=torch.float64), "cg",
        ...                     max_iter=50, tol=1e-10)
        >>> bool(out.diverged)
        False
    """
    return _solve(system, x, solver, False, max_iter=max_iter, tol=tol,
                  check_every=check_every, window=window, callback=callback,
                  storage_dtype=storage_dtype)


def solve_adjoint(system, g: Tensor, solver: str, *, max_iter: int, tol: float,
                  check_every: int = 1, window: int = ANDERSON_WINDOW, callback=None,
                  storage_dtype: Optional[torch.dtype] = None) -> SolveResult:
    """u = g - (1/mu) Delta^T u (u = dl/dX) with a registered solver: the backward's solve.

    For ``cg``: the SPD system (S + L/mu) v = g, then u = S v; its residual g - A v equals
    the adjoint equation's residual, so the stopping test is the same as the other solvers'.

    Args:
        system: as in :func:`solve_forward`.
        g: the incoming gradient dl/dZ (nodes x channels).
        solver: as in :func:`solve_forward`.
        max_iter: as in :func:`solve_forward`.
        tol: as in :func:`solve_forward`.
        check_every: as in :func:`solve_forward`.
        window: as in :func:`solve_forward`.
        callback: as in :func:`solve_forward`.
        storage_dtype: as in :func:`solve_forward`.

    Returns:
        The :class:`SolveResult` of u.

    Raises:
        ValueError: an unregistered ``solver``, or a ``storage_dtype`` it does not take.

    Example:
        On a directed 3-cycle (the adjoint reads W^T), with the plain-PyTorch backend:

        >>> import torch, dignn_kernels as dk
        >>> from dignn_kernels.backends import get_backend
        >>> from dignn_kernels.solvers import solve_adjoint
        >>> g = dk.build_graph(torch.tensor([[0, 1, 2], [1, 2, 0]]), 3)
        >>> w, chi, kappa = g.fixed_laplacian("rw", torch.float32)
        >>> t_rowptr, t_col, t_perm = g.transposed()
        >>> system = dk.solvers.EquilibriumSystem(get_backend("torch"), g.rowptr, g.col, w, chi,
        ...                                       kappa, 2.2, t_rowptr=t_rowptr, t_col=t_col,
        ...                                       t_perm=t_perm)
        >>> u = solve_adjoint(system, torch.ones(3, 4), "anderson", max_iter=30, tol=1e-6)
        >>> u.solution.shape, bool(u.relative <= 1e-6)
        (torch.Size([3, 4]), True)
    """
    return _solve(system, g, solver, True, max_iter=max_iter, tol=tol,
                  check_every=check_every, window=window, callback=callback,
                  storage_dtype=storage_dtype)
