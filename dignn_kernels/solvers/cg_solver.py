r"""Conjugate gradient on the SPD form of the equilibrium.

When W is symmetric (an undirected graph with symmetric edge values) L is symmetric positive
semi-definite, and multiplying the equilibrium by C gives ``(C + L/mu) Z = C X``: a symmetric
positive definite system for *every* mu > 0. It is solved by Jacobi-preconditioned conjugate
gradient, one system per channel, all channels in the same CSR pass. The adjoint system
(I + Delta^T/mu) u = g of the backward is the same matrix: ``(C + L/mu) v = g``, ``u = C v``.
With the Jacobi preconditioner diag(C + L/mu) the preconditioned matrix of the rw Laplacian is
I + Delta/mu, whose condition number 1 + lambda_max/mu stays small for every mu.

Guard rows (chi_i <= 1e-30, see laplacian_math.h) keep z_i = x_i. In the SPD form such a row is
the identity (its C_ii is taken as 1 and its row of L/mu is dropped), but its column is not:
the other rows still diffuse from it (Delta's row i is 0, its column i is not, eq. 6). cg
eliminates it: z_i = x_i is known, its column moves to the right-hand side,
r_j = C_jj x_j + W_ji x_i / mu, and the remaining rows' block of C + L/mu is symmetric positive
definite. The adjoint's v = C^-1 u is 0 on guard rows; its guard rows are
u_i = g_i + (1/mu) sum_j W_ij v_j, one application of the adjoint map
(:func:`_guard_coupled`: both only where a guard row has edges).
"""
from typing import Callable, Optional

import torch
from torch import Tensor

from ..solver_state import DIVERGED, DONE, RESIDUAL, SWEEPS
from .cg_update import CGState, cg_flags, cg_update_for
from .common import (Reduce, SolveResult, check_every_arg, finish_solve, global_norm,
                     global_sum, history_slot, start_solve)
from .registry import register_solver

__all__ = ["conjugate_gradient", "solve"]


def conjugate_gradient(apply: Callable[[Tensor], Tensor], rhs: Tensor, inv_diagonal: Tensor, *,
                       max_iter: int, tol: float, check_every: int = 1,
                       residual_scale: Optional[Tensor] = None, ref_norm: Optional[Tensor] = None,
                       decoupled: Optional[Tensor] = None,
                       callback: Optional[Callable[[int], None]] = None,
                       reduce: Reduce = None, vector_kernels: Optional[str] = None,
                       product: Optional[Callable[[Tensor, Tensor, Tensor], Tensor]] = None,
                       eliminate: bool = False) -> SolveResult:
    """Jacobi-preconditioned conjugate gradient for A V = rhs, A SPD, every column its own
    system (per-column step lengths); one ``apply`` (one CSR sweep) per iteration. Stops once
    ||residual_scale * (rhs - A V)||_F <= tol * ref_norm (default ||rhs||_F); the residual is
    the recursively updated one.

    The iteration is the single-reduction form of Chronopoulos and Gear (1989), equal to
    classic CG in exact arithmetic: with u = M^-1 r (M = diag(1/inv_diagonal)) and w = A u,
    gamma = r.u, delta = w.u,

        beta = gamma / gamma_prev,  alpha = gamma / (delta - beta gamma / alpha_prev),
        p = u + beta p,  s = w + beta s,  V += alpha p,  r -= alpha s,  u = M^-1 r,

    so that everything after the sweep is one pass over the vectors (:mod:`.cg_update`:
    fused into one kernel on a GPU, ``vector_kernels``) and the dot products of an iteration
    come in two reductions (an all-reduce each on a partitioned graph).

    Rows marked ``decoupled`` (A_ij = 0 for j != i) start at their exact value
    rhs_i / A_ii with a zero residual, so they never enter the Krylov space and stay exact
    (guard rows keep z_i = x_i bit for bit); the others start at 0. Where other rows still
    read a decoupled row (A_ji != 0: a guard row with edges, whose column of A is not its
    row), ``eliminate`` moves its known value to their right-hand side,
    r_j = rhs_j - A_ji z_i (one ``apply`` before the first sweep): CG then solves the
    remaining rows' block of A, which is symmetric positive definite.

    ``product`` (optional, the backend's row product of A: ``product(u, w, done)`` writes
    A u into the buffer w and returns the local dots w.u, nothing once the flag ``done`` is
    set) replaces ``apply`` and the dot product's own pass over w and u."""
    check_every = check_every_arg(check_every)
    ref, ref_safe, history = start_solve(rhs, max_iter, ref_norm, reduce)
    update = cg_update_for(rhs, vector_kernels)
    state = CGState.start(rhs, inv_diagonal, residual_scale, decoupled,
                          apply if eliminate and decoupled is not None else None)
    residual = state.finish_reduction(global_sum(state.reduction(), reduce))
    history[0] = residual / ref_safe
    # the flags and counters on the device, updated by the vector update's finish
    flags = cg_flags(residual, tol * ref, ref_safe)
    done = flags[DONE:DONE + 1]  # a view: the kernels read the flag on the device
    # the product's buffer, zeros: a solve done from the start never writes it, and the
    # update still reads it (alpha = 0 times a finite s leaves r as it is)
    w = torch.zeros_like(rhs) if product is not None else None
    if not (check_every == 1 and bool(flags[DONE])):  # (a host read: the CPU default only)
        for k in range(1, max_iter + 1):
            if product is None:
                w = apply(state.u)
                delta = global_sum(update.dot(state, w), reduce)
            else:
                delta = global_sum(product(state.u, w, done), reduce)
            update.step(state, w, delta, done)
            update.finish(state, global_sum(state.reduction(), reduce), flags, history,
                          history_slot(history, k))
            if callback is not None:
                callback(k)
            if check_every and k % check_every == 0 and bool(flags[DONE]):
                break
    sweeps = flags[SWEEPS].long()
    return finish_solve(state.z, rhs, history, sweeps, flags[RESIDUAL], ref_safe,
                        flags[DIVERGED] != 0, sweeps + 1)


@register_solver("cg", spd=True)
def solve(system, rhs: Tensor, *, adjoint: bool, max_iter: int, tol: float, check_every: int,
          window: int, callback, storage_dtype: Optional[torch.dtype]) -> SolveResult:
    """The registered ``cg`` (the signature of :mod:`.registry`; ``max_iter`` counts sweeps;
    ``window`` and ``storage_dtype`` unused): the forward (C + L/mu) Z = C X, or the adjoint
    (C + L/mu) v = g, u = C v, with guard rows as the module docstring says."""
    reduce = system.reduce
    cg = dict(max_iter=max_iter, tol=tol, check_every=check_every, decoupled=system.decoupled,
              callback=callback, reduce=reduce, vector_kernels=system.vector_kernels,
              product=system.spd_product())
    coupled = _guard_coupled(system, check_every)
    if adjoint:  # (S + L/mu) v = g, then u = S v
        out = conjugate_gradient(system.spd_apply, rhs, system.inv_diagonal, **cg)
        u = system.mass.unsqueeze(1) * out.solution
        if coupled:
            # Guard rows G (Delta's row 0, column not): v = C^-1 u is 0 there and the other
            # rows' block solves A_NN v_N = g_N, as above; the adjoint equation's guard rows
            # then read u_G = g_G + (1/mu) W_GN v_N, which is the adjoint map
            # (g + cy.u + W^T (rs.u), cy = rs = 0 on G) applied to u.
            guard = getattr(system, "guard", system.decoupled).unsqueeze(1)
            u = torch.where(guard, system.adjoint_step(u, rhs), u)
        out.solution = u
        return out
    return conjugate_gradient(system.spd_apply, system.mass.unsqueeze(1) * rhs,
                              system.inv_diagonal, residual_scale=1.0 / system.mass,
                              ref_norm=global_norm(rhs, reduce), eliminate=coupled, **cg)


def _guard_coupled(system, check_every: int) -> bool:
    """Whether cg must eliminate guard rows (z_i = x_i known) that other rows read: the SPD
    form's guard row is an identity row, but its column keeps the neighbours' -W_ji / mu
    (they diffuse from it, paper eq. 6), so without the elimination cg would solve a
    different, unsymmetric system. Read on the host where the loop reads it every sweep
    anyway (``check_every`` == 1, the CPU default), else (no host read between checks on a
    GPU) and on a system that does not say (a partitioned one, whose ranks must agree)
    assumed: the elimination then costs one more sweep, exact either way."""
    flag = getattr(system, "guard_coupled", None)
    if flag is None or check_every != 1:
        return True
    return bool(flag)
