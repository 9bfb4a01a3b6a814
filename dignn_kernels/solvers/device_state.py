"""A solve's flags and counters on the device: one float64 tensor (flags as 0 / 1) whose first
four fields the fixed point's layout (:data:`~dignn_kernels.backends.interface.FIXED_POINT_STATE`)
and cg's (:data:`~dignn_kernels.solvers.cg_update.CG_FLAGS`) share: done, diverged, the
iterations counted and the last residual. Written here once in PyTorch ops; the Triton kernels
of the same bookkeeping use :func:`dignn_kernels.backends._triton_jit.record_iteration`."""
from typing import Dict

import torch
from torch import Tensor

from ..backends.interface import FP_DIVERGED, FP_DONE, FP_RESIDUAL, FP_SWEEPS

__all__ = ["state_of", "record_iteration"]


def state_of(fields: Dict[int, Tensor], size: int) -> Tensor:
    """A solve's state from its fields {index: 0-dim tensor}, one for each of 0 .. size - 1,
    as one float64 tensor."""
    return torch.stack([fields[i].double() for i in range(size)])


def record_iteration(state: Tensor, res: Tensor, bad: Tensor, stop: Tensor, *more: Tensor
                     ) -> Tensor:
    """One iteration, in place: if the solve was live, the iteration counted, ``res`` kept,
    divergence flagged where ``bad``, done once bad or ``stop``, and the fields after the
    shared four set to ``more``; a done solve keeps its state. Returns whether it was live."""
    live = state[FP_DONE] == 0
    fields = {FP_DONE: (bad | stop).double(), FP_DIVERGED: bad.double(),
              FP_SWEEPS: state[FP_SWEEPS] + 1, FP_RESIDUAL: res}
    updated = [fields[i] for i in range(len(fields))] + list(more)
    state[:len(updated)] = torch.where(live, torch.stack(updated), state[:len(updated)])
    return live
