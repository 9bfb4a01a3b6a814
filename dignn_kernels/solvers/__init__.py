"""Equilibrium solvers for the implicit layer, written once over the pass interface of
:mod:`dignn_kernels.backends`:

- :mod:`.registry`: the solvers by name, one signature (:func:`register_solver`,
  :func:`get_solver`); the built-in ones, a module each: :mod:`.fixed_point_solver`,
  :mod:`.cg_solver`, :mod:`.anderson_solver`;
- :mod:`.loops`: the forward and adjoint solves by name (:func:`solve_forward`,
  :func:`solve_adjoint`), what the solvers share (:mod:`.common`);
- :mod:`.system`: the forward, adjoint and SPD maps of one problem, each one row pass;
- :mod:`.op`: the one differentiable solve op (``dignn::implicit_solve``) and its entry
  :func:`implicit_diffusion`.
"""
from .loops import (ANDERSON_WINDOW, SOLVERS, DivergenceWarning, SolveResult, anderson,
                    check_every_arg, conjugate_gradient, default_check_every, fixed_point,
                    fixed_point_diverged, solve_adjoint, solve_forward)
from .op import (backward_stats, host_reads_allowed, implicit_diffusion, resolve_solver,
                 warn_if_diverged)
from .common import HISTORY_LENGTH
from .registry import AUTO, auto_solver, get_solver, register_solver
from .system import EquilibriumSystem

__all__ = ["SOLVERS", "ANDERSON_WINDOW", "DivergenceWarning", "SolveResult",
           "EquilibriumSystem", "fixed_point", "conjugate_gradient", "anderson",
           "solve_forward", "solve_adjoint", "implicit_diffusion", "resolve_solver",
           "default_check_every", "check_every_arg", "fixed_point_diverged",
           "host_reads_allowed", "backward_stats", "warn_if_diverged", "register_solver",
           "get_solver", "AUTO", "auto_solver", "HISTORY_LENGTH"]
