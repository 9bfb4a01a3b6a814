"""A solve's state on the device: every slot of every solver's layout, named once.

A solve keeps its flags and counters in one float64 tensor (flags as 0 / 1), updated in place
on the device by its bookkeeping (PyTorch ops, or one Triton kernel) and read on the host only
where the loop checks for convergence (``check_every``), so that a solve can run without
waiting for the device. The layouts:

====  ===========  ===========  ===========
slot  fixed point  cg           anderson
====  ===========  ===========  ===========
0     done         done         done
1     diverged     diverged     diverged
2     sweeps       sweeps       sweeps
3     residual     residual     residual
4     relative     target       target
5     tol          ref_safe     ref_safe
6     bound                     accept
7     tiny
====  ===========  ===========  ===========

The first :data:`SHARED_STATE` slots are every solver's, kept by :func:`record_iteration`
(and its Triton twin, ``dignn_kernels.backends._triton_jit.record_iteration``); slot 0 is the
flag the row kernels read to skip a finished solve's sweeps. The Triton kernels take these
numbers as ``tl.constexpr`` globals of their own modules, made from the names below.

Why a module at the top of the package rather than in :mod:`dignn_kernels.solvers`: a
backend's row step (:mod:`dignn_kernels.backends`, which the solvers import) runs the fixed
point's bookkeeping on this state, so the layout sits above both.
"""
from typing import Dict

import torch
from torch import Tensor

__all__ = ["DONE", "DIVERGED", "SWEEPS", "RESIDUAL", "SHARED_STATE", "FP_RELATIVE", "FP_TOL",
           "FP_BOUND", "FP_TINY", "FIXED_POINT_STATE", "TARGET", "REF_SAFE", "CG_STATE",
           "ACCEPT", "ANDERSON_STATE", "state_of", "record_iteration"]

# Every solver's: done, diverged (a non-finite residual or a broken divergence certificate),
# the sweeps counted while live, the last residual.
DONE, DIVERGED, SWEEPS, RESIDUAL = range(4)
SHARED_STATE = 4
# The fixed point (dignn_kernels.solvers.fixed_point): the last sweep's relative residual,
# then its constants: tol, the divergence certificate's bound, float64's smallest normal.
FP_RELATIVE, FP_TOL, FP_BOUND, FP_TINY = range(SHARED_STATE, SHARED_STATE + 4)
FIXED_POINT_STATE = SHARED_STATE + 4
# cg and anderson: the constants of a test on the equation's residual, the target
# tol * ||rhs|| and the reference norm the history divides by (kept away from 0).
TARGET, REF_SAFE = SHARED_STATE, SHARED_STATE + 1
CG_STATE = SHARED_STATE + 2
# anderson: whether the last iteration's iterate was accepted (live and finite).
ACCEPT = CG_STATE
ANDERSON_STATE = CG_STATE + 1


def state_of(fields: Dict[int, Tensor], size: int) -> Tensor:
    """A solve's state from its fields.

    Args:
        fields: ``{slot: 0-dim tensor}``, one entry for each slot 0 .. size - 1.
        size: the layout's size (:data:`FIXED_POINT_STATE`, :data:`CG_STATE`, ...).

    Returns:
        The state, one float64 tensor of ``size`` entries on the fields' device.

    Raises:
        KeyError: a slot below ``size`` has no field.

    Example:
        >>> import torch
        >>> from dignn_kernels.solver_state import (CG_STATE, DIVERGED, DONE, REF_SAFE,
        ...                                         RESIDUAL, SWEEPS, TARGET, state_of)
        >>> one = torch.ones((), dtype=torch.float64)
        >>> state_of({DONE: one * 0, DIVERGED: one * 0, SWEEPS: one * 0, RESIDUAL: one,
        ...           TARGET: one * 1e-6, REF_SAFE: one}, CG_STATE).tolist()
        [0.0, 0.0, 0.0, 1.0, 1e-06, 1.0]
    """
    return torch.stack([fields[i].double() for i in range(size)])


def record_iteration(state: Tensor, res: Tensor, bad: Tensor, stop: Tensor, *more: Tensor
                     ) -> Tensor:
    """One iteration's bookkeeping of the shared slots, in place on the device.

    If the solve was live: the iteration counted, ``res`` kept, divergence flagged where
    ``bad``, done once bad or ``stop``, and the slots after the shared ones set to ``more``;
    a done solve keeps its state.

    Args:
        state: the solve's float64 state (any layout above).
        res: the iteration's residual (0-dim float64).
        bad: 0-dim bool, the iteration failed (a non-finite residual, a broken certificate).
        stop: 0-dim bool, the residual meets the stopping test.
        *more: values for slots SHARED_STATE, SHARED_STATE + 1, ... (e.g. FP_RELATIVE).

    Returns:
        0-dim bool tensor: whether the solve was live before this iteration.

    Example:
        >>> import torch
        >>> from dignn_kernels.solver_state import (CG_STATE, DONE, RESIDUAL, SWEEPS,
        ...                                         record_iteration)
        >>> state = torch.zeros(CG_STATE, dtype=torch.float64)
        >>> res = torch.tensor(0.5, dtype=torch.float64)
        >>> bool(record_iteration(state, res, ~torch.isfinite(res), res < 1.0))
        True
        >>> state[[DONE, SWEEPS, RESIDUAL]].tolist()
        [1.0, 1.0, 0.5]
    """
    live = state[DONE] == 0
    fields = {DONE: (bad | stop).double(), DIVERGED: bad.double(), SWEEPS: state[SWEEPS] + 1,
              RESIDUAL: res}
    updated = [fields[i] for i in range(SHARED_STATE)] + list(more)
    state[:len(updated)] = torch.where(live, torch.stack(updated), state[:len(updated)])
    return live
