"""The solvers by name: one signature, one registration, one lookup.

Every solver of the layer's equilibrium is a function

    solve(system, rhs, *, adjoint, max_iter, tol, check_every, window, callback,
          storage_dtype) -> SolveResult

registered under its name with :func:`register_solver`. ``system`` is an
:class:`~dignn_kernels.solvers.system.EquilibriumSystem` (or a partitioned graph's
:class:`~dignn_kernels.distributed.system.DistributedSystem`): its maps are the sweeps
(``step``, ``adjoint_step``, ``spd_apply``, the backend's row step and row product), its
``reduce`` the all-reduce of a partitioned solve (None on one process: every norm and dot
product of a solver goes through it), its ``vector_kernels`` who runs the solver's vector work
(the Triton kernels on a GPU). :func:`dignn_kernels.solvers.solve_forward` and
:func:`~dignn_kernels.solvers.solve_adjoint` look the solver up here, so the layer, the op,
the partitioned solve and the CLI all reach a registered solver by its name. The built-in
solvers register themselves in their modules (:mod:`.fixed_point_solver`, :mod:`.cg_solver`,
:mod:`.anderson_solver`); docs/internals/adding-a-solver.md walks through adding one.
"""
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

import torch

__all__ = ["SolverSpec", "register_solver", "get_solver", "solver_names",
           "check_solver_storage", "AUTO", "auto_solver"]


@dataclass(frozen=True)
class SolverSpec:
    """A registered solver: its name, its solve and what it supports.

    ``solve`` has the one signature of the module docstring. ``spd``: it solves the SPD form
    (C + L/mu) Z = C X, which needs a symmetric W (on a directed graph ``anderson`` runs
    instead, with a warning) and reads the self-loops' positions. ``storage_dtype``: it can
    keep its iterates in a 16-bit ``storage_dtype``. ``device_check_every``: its host reads
    of the convergence flag on an accelerator, every this many sweeps (the default of
    ``check_every`` there)."""

    name: str
    solve: Callable
    spd: bool = False
    storage_dtype: bool = False
    device_check_every: int = 4


_REGISTRY: Dict[str, SolverSpec] = {}


def register_solver(name: str, *, spd: bool = False, storage_dtype: bool = False,
                    device_check_every: int = 4) -> Callable[[Callable], Callable]:
    """A decorator that registers ``solve`` (the one signature, see the module docstring)
    under ``name``.

    Args:
        name: the solver's name, as the layer's and the op's ``solver=`` takes it.
        spd: it solves the SPD form (C + L/mu) Z = C X: symmetric W only (directed graphs
            run ``anderson`` instead, with a warning), self-loop positions precomputed.
        storage_dtype: it accepts a 16-bit ``storage_dtype`` (else the entry points refuse
            one with this solver).
        device_check_every: the default ``check_every`` on an accelerator (every sweep on
            the CPU, where a host read is free).

    Returns:
        The decorator; it returns ``solve`` unchanged.

    Raises:
        ValueError: ``name`` is not a non-empty string, is registered already, or
            ``device_check_every`` is not an integer >= 1.

    Example:
        A solver's module registers its solve once, where it is defined (the layer then
        takes ``solver="my_solver"``; tests/test_solver_registry.py registers a whole one):

        >>> from dignn_kernels.solvers import register_solver
        >>> @register_solver("my_solver")  # doctest: +SKIP
        ... def solve(system, rhs, *, adjoint, max_iter, tol, check_every, window, callback,
        ...           storage_dtype):
        ...     ...
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"a solver's name must be a non-empty string, got {name!r}")
    if name in _REGISTRY:
        raise ValueError(f"a solver named {name!r} is registered already: pick another name")
    if isinstance(device_check_every, bool) or not isinstance(device_check_every, int) or \
            device_check_every < 1:
        raise ValueError(f"device_check_every must be an integer >= 1, got "
                         f"{device_check_every!r}")

    def register(solve: Callable) -> Callable:
        _REGISTRY[name] = SolverSpec(name, solve, spd=spd, storage_dtype=storage_dtype,
                                     device_check_every=device_check_every)
        return solve

    return register


def solver_names() -> Tuple[str, ...]:
    """The registered solvers' names, in the order they were registered.

    Returns:
        A tuple of names (the built-in ones first: fixed_point, cg, anderson).

    Example:
        >>> from dignn_kernels.solvers.registry import solver_names
        >>> solver_names()[:3]
        ('fixed_point', 'cg', 'anderson')
    """
    return tuple(_REGISTRY)


def get_solver(name: str) -> SolverSpec:
    """The solver registered under ``name``.

    Args:
        name: a registered name.

    Returns:
        Its :class:`SolverSpec`.

    Raises:
        ValueError: no solver is registered under ``name`` (the message lists those that
            are).

    Example:
        >>> from dignn_kernels.solvers import get_solver
        >>> get_solver("cg").spd
        True
    """
    spec = _REGISTRY.get(name) if isinstance(name, str) else None
    if spec is None:
        raise ValueError(f"solver must be one of {solver_names()}, got {name!r}")
    return spec


def check_solver_storage(solver: str, storage_dtype: Optional[torch.dtype]) -> None:
    """Refuses a 16-bit ``storage_dtype`` with a solver that keeps its iterates in the
    compute dtype: the one check of the layer, the op's entry and the solvers' entry.

    Args:
        solver: a registered solver's name.
        storage_dtype: None, or the solve's 16-bit storage dtype.

    Raises:
        ValueError: a ``storage_dtype`` with a solver that is not registered or does not
            take one (the message names the solvers that do).

    Example:
        >>> import torch
        >>> from dignn_kernels.solvers.registry import check_solver_storage
        >>> check_solver_storage("fixed_point", torch.bfloat16)
        >>> check_solver_storage("cg", None)
    """
    if storage_dtype is None or get_solver(solver).storage_dtype:
        return
    able = [s.name for s in _REGISTRY.values() if s.storage_dtype]
    which = " or ".join(f"solver={name!r}" for name in able)
    raise ValueError(f"storage_dtype={storage_dtype} runs with {which} only ({solver} keeps "
                     f"its iterates in the compute dtype); got solver={solver!r}. Pass "
                     f"{which} or storage_dtype=None.")


#: The name that asks for :func:`auto_solver`'s choice, per graph: the layer's default.
AUTO = "auto"


def auto_solver(symmetric: bool, storage_dtype: Optional[torch.dtype] = None) -> str:
    """The solver that ``solver="auto"`` runs on a graph: one rule for the layer's default,
    the ``dignn`` presets and graphs users bring, chosen so that no solve diverges.

    The paper's fixed-point iteration Z <- X - (1/mu) Delta Z (eq. iter) converges only while
    mu > lambda_max(Delta) (corollary "Tractable Well-Posedness Condition"), and for the graph
    neural Laplacian nothing keeps it there: theorem "Spectral Range of Delta_Phi" bounds
    lambda_max by 2 c_phi^2 c_chi c_X cosh(c_chi c_X), which grows with the norm c_X of the
    layer's input, which training is free to grow. So:

    - a symmetric W (an undirected graph): ``cg``, which solves the same equation in its
      symmetric positive definite form (C + L/mu) Z = C X for every mu > 0. Where the fixed
      point converges the layer is the same function; where it would not, cg still reaches
      the unique equilibrium, and the implicit gradients are those of that equilibrium.
    - a directed graph: ``anderson``. cg needs a symmetric W; the equation keeps a unique
      solution for every mu > 0 (Gershgorin: every eigenvalue of Delta = C^-1 (K - W) has real
      part >= 0), and Anderson's residual is that of the equation itself.
    - 16-bit iterates (``storage_dtype``) exist for the fixed point only: it runs then, with
      its condition mu > lambda_max.

    The rule needs neither mu nor the Laplacian. ``solver="fixed_point"`` keeps the paper's
    iteration.

    Args:
        symmetric: whether the graph's W is symmetric (:attr:`CSRGraph.symmetric`).
        storage_dtype: None, or the solve's 16-bit storage dtype.

    Returns:
        str: ``"cg"``, ``"anderson"`` or ``"fixed_point"``.

    Example:
        >>> import torch
        >>> from dignn_kernels.solvers import auto_solver
        >>> auto_solver(True), auto_solver(False), auto_solver(True, torch.bfloat16)
        ('cg', 'anderson', 'fixed_point')
    """
    if storage_dtype is not None:
        return "fixed_point"
    return "cg" if symmetric else "anderson"
