r"""Anderson acceleration (type II, a window of the last few iterates, least squares solved
per channel on the device) of the fixed-point map, forward and adjoint. It needs no symmetry,
so it is the solver for directed graphs (where ``cg`` falls back to it). Its residual is of
the equation itself, ``||X - Z - Delta Z / mu||_F`` (forward) or ``||g - u - Delta^T u /
mu||_F`` (adjoint), relative to ``||X||_F`` or ``||g||_F``.
"""
from typing import Callable, Optional

import torch
from torch import Tensor

from ..checks import check_int
from ..solver_state import ACCEPT, DIVERGED, DONE, RESIDUAL, SWEEPS
from .anderson_update import anderson_state, anderson_vectors_for
from .common import (Reduce, SolveResult, check_every_arg, finish_solve, global_norm,
                     global_sum, history_slot, start_solve)
from .registry import register_solver

__all__ = ["ANDERSON_WINDOW", "anderson", "solve"]

ANDERSON_WINDOW = 5  # the layer's window: the last 5 iterates


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
    check_int("window", window, 1)
    if rhs.dim() != 2:
        raise ValueError(f"rhs must be 2-D (nodes x channels), got shape {list(rhs.shape)}")
    ref, ref_safe, history = start_solve(rhs, max_iter, reduce=reduce)
    m = min(window, max(max_iter - 1, 1))
    vectors = anderson_vectors_for(rhs, m, vector_kernels)
    y = rhs
    gy = step(y)
    f = gy - y
    residual = global_norm(f, reduce)
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
    if check_every == 1 and bool(state[DONE]):  # (a host read: the CPU default only)
        max_iter = 1
    for k in range(1, max_iter):
        filled = min(k - 1, m)
        y_new = gy if filled == 0 else \
            vectors.mix(gy, d_g, vectors.gamma(gram, proj, rhs.dtype), filled)
        gy_new = step(y_new)
        slot, count = (k - 1) % m, min(k, m)
        f_new, sums = vectors.record(gy_new, y_new, f, gy, d_f, d_g, slot, count)
        vectors.finish(global_sum(sums, reduce), count, slot, gram, proj, state, history,
                       history_slot(history, k))
        if callback is not None:
            callback(k + 1)
        # An iteration that is not accepted ends the solve (done or diverged): what the later
        # ones compute is never returned, so gy and f need no selection.
        if check_every == 1:
            accepted, done = state[[ACCEPT, DONE]].tolist()
            y = y_new if accepted else y
            gy, f = gy_new, f_new
            if done:
                break
        else:
            y = torch.where(state[ACCEPT] != 0, y_new, y)
            gy, f = gy_new, f_new
            if check_every and (k + 1) % check_every == 0 and bool(state[DONE]):
                break
    sweeps = state[SWEEPS].long()
    return finish_solve(y, rhs, history, sweeps, state[RESIDUAL], ref_safe,
                        state[DIVERGED] != 0, sweeps)


@register_solver("anderson")
def solve(system, rhs: Tensor, *, adjoint: bool, max_iter: int, tol: float, check_every: int,
          window: int, callback, storage_dtype: Optional[torch.dtype]) -> SolveResult:
    """The registered ``anderson`` (the signature of :mod:`.registry`; ``max_iter`` counts
    sweeps; ``storage_dtype`` unused): Anderson acceleration of the system's forward (or
    adjoint) fixed-point map, ``window`` iterates mixed."""
    step_map = system.adjoint_step if adjoint else system.step
    return anderson(lambda y: step_map(y, rhs), rhs, max_iter=max_iter, tol=tol, window=window,
                    check_every=check_every, callback=callback, reduce=system.reduce,
                    vector_kernels=system.vector_kernels)
