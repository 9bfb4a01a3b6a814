r"""The fixed point: the paper's iteration (eq. iter), Z <- X + cy.Z + rs.(W Z), with its
stopping test ||Z_t - Z_{t-1}||_F <= tol ||Z_t||_F. It converges only when
mu > lambda_max(Delta) (the well-posedness corollary), at rate lambda_max / mu; a divergence
certificate (:func:`fixed_point`) stops it where it provably diverges.

16-bit storage (``storage_dtype``, this solver only): the iterates are kept in bfloat16 or
float16 from Z_1 = round(X) on; every sweep computes in the dtype of the weights (the row pass
of a backend that supports it) and rounds its output, the convergence norms sum in float32
and float64, and the divergence certificate allows for the rounding (:func:`solve`). The
last iteration is computed from the last stored iterate but kept wide
(:func:`_wide_last_iteration`): the map smooths the rounding noise of its input, so with
bfloat16 the solution is about ten times closer to the float32 one than a rounded last
iterate would be (relative 1e-4 against 1.6e-3 on the graphs of tests/test_storage_dtype.py),
and so is x - z, which the backward's dl/dchi takes (the Θχ gradient at h = 4: 2e-3 against
1.8e-2). The compiled backends' fused loop (csrc/ops/solve.h) runs this iteration bit for bit,
stopping where this loop stops (its step norms are of the iterates as stored).
"""
import math
from typing import Callable, Optional

import torch
from torch import Tensor

from ..laplacian import guard_rows, node_mass
from ..solver_state import (DIVERGED, DONE, FIXED_POINT_STATE, FP_BOUND, FP_RELATIVE, FP_TINY,
                            FP_TOL, RESIDUAL, SWEEPS, record_iteration, state_of)
from .common import (Reduce, SolveResult, check_every_arg, empty_history, finish_solve,
                     global_norm, global_sum, history_slot, row_sq, start_solve, weighted_sq)
from .registry import register_solver

__all__ = ["fixed_point", "fixed_point_update", "fixed_point_diverged", "solve"]

# Margin of the fixed-point divergence certificate (see fixed_point_diverged), on squared
# norms: rounding only, on symmetric graphs; a heuristic bound on directed ones.
_CERTIFICATE_SYMMETRIC = 1.0 + 1e-3
_CERTIFICATE_DIRECTED = 100.0
# A guard row with edges leaves no certificate (see solve); an iterate 1000x the bound in norm
# is still taken as divergence (the equilibrium itself stays within the bound's order), so a
# diverging solve ends and warns instead of returning a huge finite iterate.
_CERTIFICATE_GUARDED = 1e6


def fixed_point_update(state: Tensor, history: Tensor, k: int, res: Tensor, size: Tensor,
                       weighted: Tensor) -> Tensor:
    """The bookkeeping of sweep ``k`` of :func:`fixed_point`, in place on the device: from
    the sweep's ||y_{k+1} - y_k|| (``res``), ||y_{k+1}|| (``size``) and certificate norm
    sum_i c_i ||y_{k+1,i}||^2 (``weighted``), the relative residual into history[k - 1]
    (past the kept entries the loop names the last slot, :func:`.common.history_slot`)
    and, if the solve was still live, the sweep counted, the residuals kept, divergence
    (a non-finite residual or the certificate's bound broken) flagged; then done once
    diverged or res <= tol * size. Returns whether the sweep's iterate is accepted (live and
    not bad). The Triton backend's row step runs the same update in a kernel
    (:func:`dignn_kernels.backends._triton_jit.fixed_point_update`)."""
    bad = ~torch.isfinite(res) | (weighted > state[FP_BOUND])
    rel = res / torch.maximum(size, state[FP_TINY])
    history[k - 1] = rel
    live = record_iteration(state, res, bad, res <= state[FP_TOL] * size, rel)  # FP_RELATIVE
    return live & ~bad


def fixed_point(step: Callable[[Tensor], Tensor], rhs: Tensor, *, max_iter: int, tol: float,
                check_every: int = 1, certificate: Optional[Tensor] = None,
                growth: float = _CERTIFICATE_SYMMETRIC,
                callback: Optional[Callable[[int], None]] = None,
                reduce: Reduce = None,
                row_step: Optional[Callable[..., None]] = None,
                uncertified: Optional[Tensor] = None) -> SolveResult:
    """The paper's iteration (eq. iter) from Z_0 = 0: y_1 = rhs, y_{k+1} = step(y_k), at most
    ``max_iter`` iterations (max_iter - 1 sweeps), until ||y_{k+1} - y_k|| <= tol ||y_{k+1}||
    (the paper's stopping test). The result counts iterations as the paper does
    (:attr:`SolveResult.counts_start`): a fused backend's loop gives the same numbers.

    ``certificate`` (n weights c_i > 0) turns on the divergence test: the iterates are the
    partial sums y_k = sum_{j<k} J^j rhs of a map J = -Delta/mu that is self-adjoint in the
    c-weighted inner product, so while every eigenvalue of Delta is <= mu each of them is
    bounded, ||y_k||_c <= ||rhs||_c. An iterate above ``growth`` times that bound proves
    mu < lambda_max(Delta): the loop stops there (before anything overflows), keeps the last
    iterate under the bound and flags ``diverged``.

    The solve's state lives on the device (one float64 tensor, laid out as
    `dignn_kernels.solver_state.FIXED_POINT_STATE` says), updated once a sweep by
    :func:`fixed_point_update`. ``row_step`` (a backend's row step of the same map with the
    certificate's weights, ``(y, out, state, history, k) -> None``, see
    :class:`~dignn_kernels.backends.interface.RowStep`) runs a sweep and that update itself:
    every sweep writes into one of two buffers, takes the norms from its own output and
    writes nothing once the solve is done, so no iterate is read again for the bookkeeping;
    at the end the buffer holding the last accepted iterate is picked on the device."""
    check_every = check_every_arg(check_every)
    ref, ref_safe, history = start_solve(rhs, max_iter, reduce=reduce)
    zero = torch.zeros_like(ref)
    bound = growth * weighted_sq(rhs, certificate, reduce) if certificate is not None else \
        torch.full_like(ref, math.inf)
    if uncertified is not None:  # (a device flag: no certificate holds, see solve)
        bound = torch.where(uncertified, bound * (_CERTIFICATE_GUARDED / growth), bound)
    # iteration 1: ||Z_1 - Z_0|| = ||X||, relative 1 (0 for X = 0); rhs = 0: y = 0 is exact
    fields = {DONE: (ref <= 0).double(), DIVERGED: zero, SWEEPS: zero,
              RESIDUAL: ref, FP_RELATIVE: (ref > 0).double(),
              FP_TOL: torch.full_like(ref, tol), FP_BOUND: bound,
              FP_TINY: torch.full_like(ref, torch.finfo(torch.float64).tiny)}
    state = state_of(fields, FIXED_POINT_STATE)
    y = rhs
    if row_step is not None:
        # sweep k reads buffers[k % 2] and writes buffers[(k - 1) % 2]; y_1 is buffers[1]
        buffers = (torch.empty_like(rhs, memory_format=torch.contiguous_format),
                   rhs.clone(memory_format=torch.contiguous_format))
        y = buffers[1]
    if not (check_every == 1 and bool(state[DONE])):  # (a host read: the CPU default only)
        for k in range(1, max_iter):
            # sweep k's entry is history[k - 1]; past the kept entries, the slot dropped at the
            # end (common.history_slot): the bookkeeping is told that slot + 1 for its k
            entry = history_slot(history, k - 1) + 1
            if row_step is not None:
                y_next = buffers[(k - 1) % 2]
                row_step(y, y_next, state, history, entry)
                y = y_next  # once done, the sweeps leave both buffers as they are
            else:
                y_next = step(y)
                res = global_norm(y_next - y, reduce)  # the residual of y_{k-1}
                rows = row_sq(y_next)  # one read of y_next for its norm and the certificate
                size = global_sum(rows.sum(), reduce).sqrt()
                weighted = weighted_sq(y_next, certificate, reduce, rows) \
                    if certificate is not None else zero
                accept = fixed_point_update(state, history, entry, res, size, weighted)
            if callback is not None:
                callback(k)
            if row_step is None and check_every == 1:  # every sweep starts live here
                is_done, is_diverged = torch.stack([state[DONE],
                                                    state[DIVERGED]]).tolist()
                if not is_diverged:
                    y = y_next
                if is_done:
                    break
                continue
            if row_step is None:
                y = torch.where(accept, y_next, y)
            if check_every and k % check_every == 0 and bool(state[DONE]):
                break
    if row_step is not None:
        # the last accepted iterate, y_{K+1} (K live sweeps) or y_K after a diverged sweep K
        y = torch.where((state[SWEEPS] + state[DIVERGED]) % 2 == 1, buffers[0],
                        buffers[1])
    sweeps = state[SWEEPS].long()
    out = finish_solve(y, rhs, history, sweeps, state[RESIDUAL], ref_safe,
                       state[DIVERGED] != 0, sweeps)
    out.relative, out.counts_start = state[FP_RELATIVE], True
    return out


@register_solver("fixed_point", storage_dtype=True, device_check_every=16)
def solve(system, rhs: Tensor, *, adjoint: bool, max_iter: int, tol: float, check_every: int,
          window: int, callback, storage_dtype: Optional[torch.dtype]) -> SolveResult:
    """The fixed point of the system's forward (or adjoint) map from Z_0 = 0, the registered
    ``fixed_point`` (the signature of :mod:`.registry`; ``max_iter`` counts iterations, Z_1 =
    X the first; ``window`` unused). A 16-bit ``storage_dtype`` keeps the iterates in it,
    the last iteration wide (module docstring)."""
    step_map = system.adjoint_step if adjoint else system.step
    step = lambda y: step_map(y, rhs)  # noqa: E731
    growth = _CERTIFICATE_SYMMETRIC if system.symmetric else _CERTIFICATE_DIRECTED
    # J = -C^-1 L / mu is self-adjoint in the c-weighted inner product, J^T in the 1/c one
    certificate = 1.0 / system.mass if adjoint else system.mass
    # A guard row with edges breaks that self-adjointness (Delta's row is 0, its column is
    # not), and with it the bound: the certificate then keeps only a wide heuristic margin.
    fixed = dict(tol=tol, check_every=check_every, certificate=certificate, callback=callback,
                 reduce=system.reduce, row_step=system.row_step_of(adjoint, rhs, certificate),
                 uncertified=getattr(system, "guard_coupled", None))
    if storage_dtype is None or max_iter == 1:
        return fixed_point(step, rhs, max_iter=max_iter, growth=growth, **fixed)
    out = fixed_point(step, rhs.to(storage_dtype), max_iter=max_iter - 1,
                      growth=_stored_growth(growth, storage_dtype), **fixed)
    wide_step = lambda y: step_map(y, rhs, rhs.dtype)  # noqa: E731
    return _wide_last_iteration(wide_step, rhs, out, max_iter, system.reduce)


def _wide_last_iteration(wide_step: Callable[[Tensor], Tensor], rhs: Tensor, out: SolveResult,
                         max_iter: int, reduce: Reduce = None) -> SolveResult:
    """The last iteration of a 16-bit fixed point (``out``, at most max_iter - 1 iterations
    of stored iterates), taken from the last stored iterate y by ``wide_step`` (the map from
    16-bit y into rhs's dtype): the solution in rhs's dtype, one more iteration in the stats
    and the history. A diverged solve keeps its last iterate (widened). ``z - y`` and the
    final pick read y in 16 bits, widened exactly by type promotion."""
    y = out.solution
    z = wide_step(y)
    res, size = global_norm(z - y, reduce), global_norm(z, reduce)
    rel = res / size.clamp_min(torch.finfo(torch.float64).tiny)
    keep = out.diverged
    history = empty_history(max_iter, rhs.device)  # its last slot takes an entry past the end
    history[: out.history.numel()] = out.history
    at = out.sweeps.clamp_max(history.numel() - 1).reshape(1)  # (on the device)
    history.index_copy_(0, at, torch.where(keep, history[at], rel.reshape(1)))
    result = SolveResult(torch.where(keep, y, z), history[:-1], out.sweeps + (~keep).long(),
                         torch.where(keep, out.residual, res),
                         torch.where(keep, out.relative, rel),
                         out.diverged | ~torch.isfinite(res))
    result.counts_start = out.counts_start
    return result


def _stored_growth(growth: float, storage_dtype: Optional[torch.dtype]) -> float:
    """The divergence certificate's margin for iterates stored in ``storage_dtype``: Z_1 =
    round(X) and each rounded iterate may exceed the exact bound by (1 + eps)^2; 4 eps leaves
    room for the roundings the sweeps carry along."""
    return growth if storage_dtype is None else \
        growth * (1.0 + 4.0 * torch.finfo(storage_dtype).eps)


def fixed_point_diverged(x: Tensor, z: Tensor, chi: Tensor, rowptr: Tensor, symmetric: bool,
                         storage_dtype: Optional[torch.dtype] = None) -> Tensor:
    """On the device: True when ``z``, an iterate of the paper's fixed point from Z_1 = X,
    is non-finite or breaks the bound ||Z_t||_C <= ||X||_C that holds for every iterate while
    mu >= lambda_max(Delta) (C = diag(chi), 1 on guard rows; see :func:`fixed_point`). On a
    symmetric graph a break proves divergence; on a directed one, or where a guard row has
    edges (``rowptr``: the graph's CSR), it is a heuristic with a wider margin, the same as the
    solvers' loop. ``storage_dtype``: the solve stored its iterates in 16 bits (a wider
    margin, as in the loop)."""
    mass = node_mass(chi)
    growth = _stored_growth(_CERTIFICATE_SYMMETRIC if symmetric else _CERTIFICATE_DIRECTED,
                            storage_dtype)
    guarded = (guard_rows(chi) & (rowptr[1:] != rowptr[:-1])).any()
    bound = growth * weighted_sq(x, mass)
    bound = torch.where(guarded, bound * (_CERTIFICATE_GUARDED / growth), bound)
    zs = weighted_sq(z, mass)
    return ~torch.isfinite(zs) | (zs > bound)
