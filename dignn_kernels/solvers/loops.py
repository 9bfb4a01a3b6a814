r"""The solvers of the implicit layer, written once over the pass interface: every sweep is a
row pass of :class:`~dignn_kernels.solvers.system.EquilibriumSystem`, so every backend runs
them.

The layer's equilibrium (paper eq. 10) is Z = X - (1/mu) Delta Z with Delta = C^-1 L,
C = diag(chi), L = K - W, K = diag(kappa) (:mod:`dignn_kernels.laplacian`). Three solvers:

``fixed_point``
    The paper's iteration (eq. iter), Z <- X + cy.Z + ca.(W Z), with its stopping test
    ||Z_t - Z_{t-1}||_F <= tol ||Z_t||_F. It converges only when
    mu > lambda_max(Delta) (corollary 4.3), at rate lambda_max / mu.
``cg``
    When W is symmetric (an undirected graph with symmetric edge values) L is symmetric
    positive semi-definite, and multiplying the equilibrium by C gives
    ``(C + L/mu) Z = C X``: a symmetric positive definite system for *every* mu > 0. It is
    solved by Jacobi-preconditioned conjugate gradient, one system per channel, all channels
    in the same CSR pass. The adjoint system (I + Delta^T/mu) u = g of the backward is the same
    matrix: ``(C + L/mu) v = g``, ``u = C v``. With the Jacobi preconditioner
    diag(C + L/mu) the preconditioned matrix of the rw Laplacian is I + Delta/mu, whose
    condition number 1 + lambda_max/mu stays small for every mu.
``anderson``
    Anderson acceleration (type II, a window of the last few iterates, least squares solved
    per channel on the device) of the fixed-point map, forward and adjoint. It needs no
    symmetry, so it is the fallback for directed graphs.

Guard rows (chi_i <= 1e-30, see laplacian_math.h) keep z_i = x_i in every solver. In the SPD
form such a row is the identity (its C_ii is taken as 1 and its row of L/mu is dropped), but
its column is not: the other rows still diffuse from it (Delta's row i is 0, its column i is
not, eq. 9). cg eliminates it: z_i = x_i is known, its column moves to the right-hand side,
r_j = C_jj x_j + W_ji x_i / mu, and the remaining rows' block of C + L/mu is symmetric positive
definite. The adjoint's v = C^-1 u is 0 on guard rows; its guard rows are
u_i = g_i + (1/mu) sum_j W_ij v_j, one application of the adjoint map
(:func:`_guard_coupled`: both only where a guard row has edges).

Every loop keeps its residual norms, its convergence flag and its counters on the device and
reads them on the host only every ``check_every`` sweeps (0: never, a fixed ``max_iter``
sweeps); once converged, later sweeps leave the iterate unchanged, so the result does not
depend on ``check_every``. That is what lets a solve run under CUDA graph capture.

On a partitioned graph (:mod:`dignn_kernels.distributed`) each process holds some rows; the
system's ``reduce`` (an all-reduce on the device) turns every partial norm and dot product into
the global one, so that all processes take the same steps and stop together. With ``reduce``
None (one process) every loop runs as written.

The residuals of cg and anderson are of the equation itself, ``||X - Z - Delta Z / mu||_F``
(forward) and ``||g - u - Delta^T u / mu||_F`` (adjoint), relative to ``||X||_F`` and
``||g||_F``.

16-bit storage (``storage_dtype``, fixed point only): the iterates are kept in bfloat16 or
float16 from Z_1 = round(X) on; every sweep computes in the dtype of the weights (the row pass
of a backend that supports it) and rounds its output, the convergence norms sum in float32
and float64, and the divergence certificate allows for the rounding (:func:`_solve`). The
last iteration is computed from the last stored iterate but kept wide
(:func:`_wide_last_iteration`): the map smooths the rounding noise of its input, so with
bfloat16 the solution is about ten times closer to the float32 one than a rounded last
iterate would be (relative 1e-4 against 1.6e-3 on the graphs of tests/test_storage_dtype.py),
and so is x - z, which the backward's dl/dchi takes (the Θχ gradient at h = 4: 2e-3 against
1.8e-2). The compiled backends' fused loop (csrc/ops/solve.h) runs this iteration bit for bit,
stopping where this loop stops (its step norms are of the iterates as stored).
"""
import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import Tensor

from ..backends.interface import (FIXED_POINT_STATE, FP_BOUND, FP_DIVERGED, FP_DONE,
                                  FP_RELATIVE, FP_RESIDUAL, FP_SWEEPS, FP_TINY, FP_TOL)
from ..laplacian import guard_rows, node_mass
from .device_state import record_iteration, state_of
from .cg_update import CG_DIVERGED, CG_DONE, CG_RESIDUAL, CG_SWEEPS, CGState, cg_flags, \
    cg_update_for
from .anderson_update import AA_ACCEPT, AA_DIVERGED, AA_DONE, AA_RESIDUAL, AA_SWEEPS, \
    anderson_state, anderson_vectors_for
from .system import EquilibriumSystem

# Sums per-process partial sums over the processes of a partitioned solve (an all-reduce that
# stays on the device); None: one process holds every row.
Reduce = Optional[Callable[[Tensor], Tensor]]

__all__ = ["SOLVERS", "ANDERSON_WINDOW", "DivergenceWarning", "SolveResult", "fixed_point",
           "fixed_point_update", "conjugate_gradient", "anderson", "solve_forward",
           "solve_adjoint", "default_check_every", "check_every_arg", "fixed_point_diverged"]

SOLVERS = ("fixed_point", "cg", "anderson")
ANDERSON_WINDOW = 5
# Margin of the fixed-point divergence certificate (see fixed_point_diverged), on squared
# norms: rounding only, on symmetric graphs; a heuristic bound on directed ones.
_CERTIFICATE_SYMMETRIC = 1.0 + 1e-3
_CERTIFICATE_DIRECTED = 100.0


class DivergenceWarning(RuntimeWarning):
    """A solve diverged or produced non-finite values: its output is not the equilibrium."""


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


def default_check_every(device: torch.device, solver: str = "cg") -> int:
    """Host checks of the convergence flag: every sweep on the CPU (free there); on an
    accelerator every 16 fixed-point sweeps (a solve of the layer's default 10 iterations never
    waits for the device) and every 4 sweeps of cg or anderson (which converge in fewer);
    never while a CUDA graph is being captured."""
    if device.type == "cpu":
        return 1
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return 0
    return 16 if solver == "fixed_point" else 4


_HALF = (torch.bfloat16, torch.float16)  # 16-bit storage: reductions sum in float32


def _wide(t: Tensor) -> Tensor:
    """``t`` for a sum: 16-bit storage widened to float32 (squares of float16 overflow above
    256)."""
    return t.float() if t.dtype in _HALF else t


def _global(partial: Tensor, reduce: Reduce) -> Tensor:
    """The sum over processes of per-process partial sums (itself on one process)."""
    return partial if reduce is None else reduce(partial)


def _norm(t: Tensor, reduce: Reduce = None) -> Tensor:
    if reduce is None:
        return torch.linalg.vector_norm(t, dtype=torch.float32 if t.dtype in _HALF else None
                                        ).double()
    return reduce(_wide(t).square().sum(dtype=torch.float64)).sqrt()


def _row_sq(t: Tensor) -> Tensor:
    """||t_i||^2 of every row in float64, from one read of t: the reduction widens each element
    (16-bit storage included) without a widened or squared copy of t."""
    return torch.linalg.vector_norm(t, dim=1, dtype=torch.float64).square()


def _weighted_sq(t: Tensor, weight: Tensor, reduce: Reduce = None, row_sq=None) -> Tensor:
    """sum_i weight_i ||t_i||^2 (``row_sq``: t's :func:`_row_sq`, if at hand)."""
    row_sq = _row_sq(t) if row_sq is None else row_sq
    return _global((row_sq * weight.double()).sum(), reduce)


def _start(rhs: Tensor, max_iter: int, ref: Optional[Tensor] = None, reduce: Reduce = None):
    dev = rhs.device
    ref = _norm(rhs, reduce) if ref is None else ref.double()
    ref_safe = ref.clamp_min(torch.finfo(torch.float64).tiny)
    history = torch.full((max_iter + 1,), math.nan, dtype=torch.float64, device=dev)
    return ref, ref_safe, history


def _finish(solution, rhs, history, sweeps, residual, ref_safe, diverged, valid_upto):
    positions = torch.arange(history.numel(), device=history.device)
    history = torch.where(positions < valid_upto, history, torch.nan)
    if solution is rhs:
        solution = rhs.clone()
    return SolveResult(solution, history, sweeps, residual, residual / ref_safe, diverged)


def check_every_arg(check_every: int) -> int:
    if isinstance(check_every, bool) or not isinstance(check_every, int) or check_every < 0:
        raise ValueError(f"check_every must be an integer >= 0 (0: run max_iter sweeps with no "
                         f"host check), got {check_every!r}")
    return check_every


def fixed_point_update(state: Tensor, history: Tensor, k: int, res: Tensor, size: Tensor,
                       weighted: Tensor) -> Tensor:
    """The bookkeeping of sweep ``k`` of :func:`fixed_point`, in place on the device: from
    the sweep's ||y_{k+1} - y_k|| (``res``), ||y_{k+1}|| (``size``) and certificate norm
    sum_i c_i ||y_{k+1,i}||^2 (``weighted``), the relative residual into history[k - 1]
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
    :data:`~dignn_kernels.backends.interface.FIXED_POINT_STATE` says), updated once a sweep by
    :func:`fixed_point_update`. ``row_step`` (a backend's row step of the same map with the
    certificate's weights, ``(y, out, state, history, k) -> None``, see
    :class:`~dignn_kernels.backends.interface.RowStep`) runs a sweep and that update itself:
    every sweep writes into one of two buffers, takes the norms from its own output and
    writes nothing once the solve is done, so no iterate is read again for the bookkeeping;
    at the end the buffer holding the last accepted iterate is picked on the device."""
    check_every = check_every_arg(check_every)
    ref, ref_safe, history = _start(rhs, max_iter, reduce=reduce)
    zero = torch.zeros_like(ref)
    bound = growth * _weighted_sq(rhs, certificate, reduce) if certificate is not None else \
        torch.full_like(ref, math.inf)
    if uncertified is not None:  # (a device flag: no certificate holds, see _solve)
        bound = torch.where(uncertified, math.inf, bound)
    # iteration 1: ||Z_1 - Z_0|| = ||X||, relative 1 (0 for X = 0); rhs = 0: y = 0 is exact
    fields = {FP_DONE: (ref <= 0).double(), FP_DIVERGED: zero, FP_SWEEPS: zero,
              FP_RESIDUAL: ref, FP_RELATIVE: (ref > 0).double(),
              FP_TOL: torch.full_like(ref, tol), FP_BOUND: bound,
              FP_TINY: torch.full_like(ref, torch.finfo(torch.float64).tiny)}
    state = state_of(fields, FIXED_POINT_STATE)
    y = rhs
    if row_step is not None:
        # sweep k reads buffers[k % 2] and writes buffers[(k - 1) % 2]; y_1 is buffers[1]
        buffers = (torch.empty_like(rhs, memory_format=torch.contiguous_format),
                   rhs.clone(memory_format=torch.contiguous_format))
        y = buffers[1]
    if not (check_every == 1 and bool(state[FP_DONE])):  # (a host read: the CPU default only)
        for k in range(1, max_iter):
            if row_step is not None:
                y_next = buffers[(k - 1) % 2]
                row_step(y, y_next, state, history, k)
                y = y_next  # once done, the sweeps leave both buffers as they are
            else:
                y_next = step(y)
                res = _norm(y_next - y, reduce)  # the residual of y_{k-1}
                row_sq = _row_sq(y_next)  # one read of y_next for its norm and the certificate
                size = _global(row_sq.sum(), reduce).sqrt()
                weighted = _weighted_sq(y_next, certificate, reduce, row_sq) \
                    if certificate is not None else zero
                accept = fixed_point_update(state, history, k, res, size, weighted)
            if callback is not None:
                callback(k)
            if row_step is None and check_every == 1:  # every sweep starts live here
                is_done, is_diverged = torch.stack([state[FP_DONE],
                                                    state[FP_DIVERGED]]).tolist()
                if not is_diverged:
                    y = y_next
                if is_done:
                    break
                continue
            if row_step is None:
                y = torch.where(accept, y_next, y)
            if check_every and k % check_every == 0 and bool(state[FP_DONE]):
                break
    if row_step is not None:
        # the last accepted iterate, y_{K+1} (K live sweeps) or y_K after a diverged sweep K
        y = torch.where((state[FP_SWEEPS] + state[FP_DIVERGED]) % 2 == 1, buffers[0],
                        buffers[1])
    sweeps = state[FP_SWEEPS].long()
    out = _finish(y, rhs, history, sweeps, state[FP_RESIDUAL], ref_safe,
                  state[FP_DIVERGED] != 0, sweeps)
    out.relative, out.counts_start = state[FP_RELATIVE], True
    return out


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
    ref, ref_safe, history = _start(rhs, max_iter, ref_norm, reduce)
    update = cg_update_for(rhs, vector_kernels)
    state = CGState.start(rhs, inv_diagonal, residual_scale, decoupled,
                          apply if eliminate and decoupled is not None else None)
    residual = state.finish_reduction(_global(state.reduction(), reduce))
    history[0] = residual / ref_safe
    # the flags and counters on the device, updated by the vector update's finish
    flags = cg_flags(residual, tol * ref, ref_safe)
    done = flags[CG_DONE:CG_DONE + 1]  # a view: the kernels read the flag on the device
    # the product's buffer, zeros: a solve done from the start never writes it, and the
    # update still reads it (alpha = 0 times a finite s leaves r as it is)
    w = torch.zeros_like(rhs) if product is not None else None
    if not (check_every == 1 and bool(flags[CG_DONE])):  # (a host read: the CPU default only)
        for k in range(1, max_iter + 1):
            if product is None:
                w = apply(state.u)
                delta = _global(update.dot(state, w), reduce)
            else:
                delta = _global(product(state.u, w, done), reduce)
            update.step(state, w, delta, done)
            update.finish(state, _global(state.reduction(), reduce), flags, history, k)
            if callback is not None:
                callback(k)
            if check_every and k % check_every == 0 and bool(flags[CG_DONE]):
                break
    sweeps = flags[CG_SWEEPS].long()
    return _finish(state.z, rhs, history, sweeps, flags[CG_RESIDUAL], ref_safe,
                   flags[CG_DIVERGED] != 0, sweeps + 1)


def anderson(step: Callable[[Tensor], Tensor], rhs: Tensor, *, max_iter: int, tol: float,
             window: int = ANDERSON_WINDOW, check_every: int = 1,
             callback: Optional[Callable[[int], None]] = None,
             reduce: Reduce = None, vector_kernels: Optional[str] = None) -> SolveResult:
    """Anderson acceleration (type II, mixing 1) of y -> step(y) from y_0 = rhs, one sweep per
    iteration, at most ``max_iter`` sweeps, until ||step(y) - y|| <= tol ||rhs||.

    Each channel (column) mixes its own last ``window`` iterates: with f = step(y) - y and
    the differences dF, dG of f and step(y) over the window,
    gamma = argmin ||f - dF gamma|| (regularized normal equations, a batched m x m solve on
    the device) and y <- step(y) - dG gamma: the vector work of :mod:`.anderson_update`
    (Triton kernels on a GPU, ``vector_kernels`` as for cg), whose bookkeeping keeps the
    solve's state on the device. A non-finite residual ends the solve as diverged with the
    last accepted iterate."""
    check_every = check_every_arg(check_every)
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be an integer >= 1, got {window!r}")
    if rhs.dim() != 2:
        raise ValueError(f"rhs must be 2-D (nodes x channels), got shape {list(rhs.shape)}")
    ref, ref_safe, history = _start(rhs, max_iter, reduce=reduce)
    m = min(window, max(max_iter - 1, 1))
    vectors = anderson_vectors_for(rhs, m, vector_kernels)
    y = rhs
    gy = step(y)
    f = gy - y
    residual = _norm(f, reduce)
    history[0] = residual / ref_safe
    state = anderson_state(residual, tol * ref, ref_safe)
    if callback is not None:
        callback(1)
    # The window, slot-major (each slot one contiguous n x d block); per channel its Gram
    # matrix and the next right-hand side, kept by the vector work's finish.
    d_f = rhs.new_zeros((m,) + rhs.shape)
    d_g = rhs.new_zeros((m,) + rhs.shape)
    gram = torch.zeros(rhs.size(1), m, m, dtype=torch.float64, device=rhs.device)
    proj = torch.zeros(m, rhs.size(1), dtype=torch.float64, device=rhs.device)
    if check_every == 1 and bool(state[AA_DONE]):  # (a host read: the CPU default only)
        max_iter = 1
    for k in range(1, max_iter):
        filled = min(k - 1, m)
        y_new = gy if filled == 0 else \
            vectors.mix(gy, d_g, vectors.gamma(gram, proj, rhs.dtype), filled)
        gy_new = step(y_new)
        slot, count = (k - 1) % m, min(k, m)
        f_new, sums = vectors.record(gy_new, y_new, f, gy, d_f, d_g, slot, count)
        vectors.finish(_global(sums, reduce), count, slot, gram, proj, state, history, k)
        if callback is not None:
            callback(k + 1)
        # An iteration that is not accepted ends the solve (done or diverged): what the later
        # ones compute is never returned, so gy and f need no selection.
        if check_every == 1:
            accepted, done = state[[AA_ACCEPT, AA_DONE]].tolist()
            y = y_new if accepted else y
            gy, f = gy_new, f_new
            if done:
                break
        else:
            y = torch.where(state[AA_ACCEPT] != 0, y_new, y)
            gy, f = gy_new, f_new
            if check_every and (k + 1) % check_every == 0 and bool(state[AA_DONE]):
                break
    sweeps = state[AA_SWEEPS].long()
    return _finish(y, rhs, history, sweeps, state[AA_RESIDUAL], ref_safe,
                   state[AA_DIVERGED] != 0, sweeps)


# --------------------------------------------------------------- forward / adjoint --

def _solve(system: EquilibriumSystem, rhs: Tensor, solver: str, adjoint: bool, *,
           max_iter: int, tol: float, check_every: int, window: int, callback,
           storage_dtype: Optional[torch.dtype] = None) -> SolveResult:
    if storage_dtype is not None and solver != "fixed_point":
        raise ValueError(f"storage_dtype={storage_dtype} runs with solver='fixed_point' only; "
                         f"got solver={solver!r}")
    reduce, kernels = system.reduce, system.vector_kernels  # the backend's vector kernels
    if solver == "cg":
        cg = dict(max_iter=max_iter, tol=tol, check_every=check_every,
                  decoupled=system.decoupled, callback=callback, reduce=reduce,
                  vector_kernels=kernels,
                  product=system.spd_product())
        coupled = _guard_coupled(system, check_every)
        if adjoint:  # (S + L/mu) v = g, then u = S v
            out = conjugate_gradient(system.spd_apply, rhs, system.inv_diagonal, **cg)
            u = system.mass.unsqueeze(1) * out.solution
            if coupled:
                # Guard rows G (Delta's row 0, column not): v = C^-1 u is 0 there and the
                # other rows' block solves A_NN v_N = g_N, as above; the adjoint equation's
                # guard rows then read u_G = g_G + (1/mu) W_GN v_N, which is the adjoint map
                # (g + cy.u + W^T (ca.u), cy = ca = 0 on G) applied to u.
                guard = getattr(system, "guard", system.decoupled).unsqueeze(1)
                u = torch.where(guard, system.adjoint_step(u, rhs), u)
            out.solution = u
            return out
        return conjugate_gradient(system.spd_apply, system.mass.unsqueeze(1) * rhs,
                                  system.inv_diagonal, residual_scale=1.0 / system.mass,
                                  ref_norm=_norm(rhs, reduce), eliminate=coupled, **cg)
    step_map = system.adjoint_step if adjoint else system.step
    step = lambda y: step_map(y, rhs)  # noqa: E731
    wide_step = lambda y: step_map(y, rhs, rhs.dtype)  # noqa: E731
    if solver == "anderson":
        return anderson(step, rhs, max_iter=max_iter, tol=tol, window=window,
                        check_every=check_every, callback=callback, reduce=reduce,
                        vector_kernels=kernels)
    growth = _CERTIFICATE_SYMMETRIC if system.symmetric else _CERTIFICATE_DIRECTED
    # J = -C^-1 L / mu is self-adjoint in the c-weighted inner product, J^T in the 1/c one
    certificate = 1.0 / system.mass if adjoint else system.mass
    # A guard row with edges breaks that self-adjointness (Delta's row is 0, its column is
    # not), and with it the bound: the certificate is then off (a non-finite residual still
    # ends a diverging solve).
    fixed = dict(tol=tol, check_every=check_every, certificate=certificate, callback=callback,
                 reduce=reduce, row_step=system.row_step_of(adjoint, rhs, certificate),
                 uncertified=getattr(system, "guard_coupled", None))
    if storage_dtype is None or max_iter == 1:
        return fixed_point(step, rhs, max_iter=max_iter, growth=growth, **fixed)
    out = fixed_point(step, rhs.to(storage_dtype), max_iter=max_iter - 1,
                      growth=_stored_growth(growth, storage_dtype), **fixed)
    return _wide_last_iteration(wide_step, rhs, out, max_iter, reduce)


def _guard_coupled(system: EquilibriumSystem, check_every: int) -> bool:
    """Whether cg must eliminate guard rows (z_i = x_i known) that other rows read: the SPD
    form's guard row is an identity row, but its column keeps the neighbours' -W_ji / mu
    (they diffuse from it, paper eq. 9), so without the elimination cg would solve a
    different, unsymmetric system. Read on the host where the loop reads it every sweep
    anyway (``check_every`` == 1, the CPU default), else (no host read between checks on a
    GPU) and on a system that does not say (a partitioned one, whose ranks must agree)
    assumed: the elimination then costs one more sweep, exact either way."""
    flag = getattr(system, "guard_coupled", None)
    if flag is None or check_every != 1:
        return True
    return bool(flag)


def _wide_last_iteration(wide_step: Callable[[Tensor], Tensor], rhs: Tensor, out: SolveResult,
                         max_iter: int, reduce: Reduce = None) -> SolveResult:
    """The last iteration of a 16-bit fixed point (``out``, at most max_iter - 1 iterations
    of stored iterates), taken from the last stored iterate y by ``wide_step`` (the map from
    16-bit y into rhs's dtype): the solution in rhs's dtype, one more iteration in the stats
    and the history. A diverged solve keeps its last iterate (widened). ``z - y`` and the
    final pick read y in 16 bits, widened exactly by type promotion."""
    y = out.solution
    z = wide_step(y)
    res, size = _norm(z - y, reduce), _norm(z, reduce)
    rel = res / size.clamp_min(torch.finfo(torch.float64).tiny)
    keep = out.diverged
    history = torch.full((max_iter + 1,), math.nan, dtype=torch.float64, device=rhs.device)
    history[: out.history.numel()] = out.history
    history.index_copy_(0, out.sweeps.reshape(1),
                        torch.where(keep, history[out.sweeps], rel).reshape(1))
    result = SolveResult(torch.where(keep, y, z), history, out.sweeps + (~keep).long(),
                         torch.where(keep, out.residual, res),
                         torch.where(keep, out.relative, rel),
                         out.diverged | ~torch.isfinite(res))
    result.counts_start = out.counts_start
    return result


def solve_forward(system: EquilibriumSystem, x: Tensor, solver: str, *, max_iter: int,
                  tol: float, check_every: int = 1, window: int = ANDERSON_WINDOW,
                  callback=None, storage_dtype: Optional[torch.dtype] = None) -> SolveResult:
    """Z = X - (1/mu) Delta Z with the given solver (``max_iter``: sweeps for cg and
    anderson, iterations for the fixed point, see :func:`fixed_point`). ``storage_dtype``
    (fixed point only): the iterates, and so the solution, in that 16-bit dtype."""
    return _solve(system, x, solver, False, max_iter=max_iter, tol=tol,
                  check_every=check_every, window=window, callback=callback,
                  storage_dtype=storage_dtype)


def solve_adjoint(system: EquilibriumSystem, g: Tensor, solver: str, *, max_iter: int,
                  tol: float, check_every: int = 1, window: int = ANDERSON_WINDOW,
                  callback=None, storage_dtype: Optional[torch.dtype] = None) -> SolveResult:
    """u = g - (1/mu) Delta^T u (u = dl/dX) with the given solver. For ``cg``: the SPD
    system (S + L/mu) v = g, then u = S v; its residual g - A v equals the adjoint equation's
    residual, so the stopping test is the same as the other solvers'. ``storage_dtype`` as
    in :func:`solve_forward`."""
    return _solve(system, g, solver, True, max_iter=max_iter, tol=tol,
                  check_every=check_every, window=window, callback=callback,
                  storage_dtype=storage_dtype)


def _stored_growth(growth: float, storage_dtype: Optional[torch.dtype]) -> float:
    """The divergence certificate's margin for iterates stored in ``storage_dtype``: Z_1 =
    round(X) and each rounded iterate may exceed the exact bound by (1 + eps)^2; 4 eps leaves
    room for the roundings the sweeps carry along."""
    return growth if storage_dtype is None else \
        growth * (1.0 + 4.0 * torch.finfo(storage_dtype).eps)


def fixed_point_diverged(x: Tensor, z: Tensor, chi: Tensor, symmetric: bool,
                         storage_dtype: Optional[torch.dtype] = None) -> Tensor:
    """On the device: True when ``z``, an iterate of the paper's fixed point from Z_1 = X,
    is non-finite or breaks the bound ||Z_t||_C <= ||X||_C that holds for every iterate while
    mu >= lambda_max(Delta) (C = diag(chi), 1 on guard rows; see :func:`fixed_point`). On a
    symmetric graph a break proves divergence; on a directed one it is a heuristic with a
    wide margin. ``storage_dtype``: the solve stored its iterates in 16 bits (a wider
    margin, as in the solvers' loop)."""
    mass = node_mass(chi)
    growth = _stored_growth(_CERTIFICATE_SYMMETRIC if symmetric else _CERTIFICATE_DIRECTED,
                            storage_dtype)
    zs = _weighted_sq(z, mass)
    # guard rows (with edges) break the bound (see _solve): only non-finite z proves it then
    certified = ~guard_rows(chi).any()
    return ~torch.isfinite(zs) | (certified & (zs > growth * _weighted_sq(x, mass)))
