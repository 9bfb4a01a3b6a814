"""Device time per kernel role of a training step, from torch.profiler.

The GPU issue's goal is "the CUDA backend at least as fast as the Triton one on every kernel".
The two backends launch different kernels for the same work, so :func:`kernel_role` names the
work a kernel does, one of :data:`ROLES`:

- ``cached row pass``: a sweep with cached edge weights, of the fixed point or cg's row product
  (CUDA ``row_pass_kernel<T, S, V, G, false, kDots>``, Triton ``_csr_fma_kernel``);
- ``neural row pass``: the sweep that forms the neural edge weights (paper eq. 13-14) as it
  goes (``row_pass_kernel<T, S, V, G, true, false>``, ``_neural_edge_weights_kernel``; before
  2026-11-27 ``_neural_weights_kernel``, before 2026-11-24 ``_neural_step_kernel``);
- ``gradient pass``: the backward's pass over the edges that forms dl/dW per edge from the
  adjoint and the iterate and sums it into the gradients of the projections p, q
  (``neural_weight_grad_kernel``, ``_neural_weight_grad_kernel``; before 2026-11-27
  ``grad_pass_kernel``, ``_weight_grad_kernel``);
- ``combine (heavy rows)``: a heavy row's segment partials summed in a fixed order
  (``row_combine_kernel``, ``neural_weight_grad_combine_kernel``, the Triton
  ``_*_combine_kernel``);
- ``step bookkeeping``: the solver's work between sweeps: norm reductions, the convergence
  stats and flag (``sum_squares_kernel``, ``finalize_step_kernel``; ``_finish_step_kernel`` of
  the Triton backend profiled on 2026-11-23), cg's vector update and dot products
  (``_cg_step_kernel``, ``_column_dots_kernel``, ``row_product_dots_kernel``);
- ``dense (aten)``: what torch itself launches: aten's elementwise, reduction and indexing
  kernels and the cuBLAS/CUTLASS GEMMs of the linear maps (and, profiled on the CPU, the aten
  operators);
- ``other``: the rest: copies and memsets, the setup of a graph or a solve
  (``schedule_counts_kernel``, ``schedule_fill_kernel``, ``row_coefficients_kernel``,
  ``row_sums_kernel``), cuSPARSE (the torch backend) and anything not recognised.

:func:`profile_step` runs a step under the profiler and sums the time per role.
bench/layer/test_gpu_speed.py::test_kernel_times records it for the cuda and triton backends and its
test_summary compares them role by role; bench/layer/test_kernel_times.py holds :func:`kernel_role`
to kernel names of real profiles.
"""
import re
from typing import Callable, Dict

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity

__all__ = ["ROLES", "GOAL_ROLES", "kernel_role", "profile_step"]

ROLES = ("cached row pass", "neural row pass", "gradient pass", "combine (heavy rows)",
         "step bookkeeping", "dense (aten)", "other")
# the roles of the goal "CUDA at least as fast as Triton on every kernel"
GOAL_ROLES = ("cached row pass", "neural row pass", "gradient pass")

# Kernels of this project by their bare name (no namespace, no template arguments): the CUDA
# kernels of csrc/cuda/ and the Triton kernels of dignn_kernels/backends/_triton_jit.py and
# dignn_kernels/solvers/_triton_cg.py. row_pass_kernel is told apart by its template argument.
_PROJECT_KERNELS = {
    "_csr_fma_kernel": "cached row pass",
    "_neural_edge_weights_kernel": "neural row pass",
    "neural_weight_grad_kernel": "gradient pass",
    "_neural_weight_grad_kernel": "gradient pass",
    "row_combine_kernel": "combine (heavy rows)",
    "neural_weight_grad_combine_kernel": "combine (heavy rows)",
    "_csr_fma_combine_kernel": "combine (heavy rows)",
    "_neural_edge_weights_combine_kernel": "combine (heavy rows)",
    "_neural_weight_grad_combine_kernel": "combine (heavy rows)",
    "sum_squares_kernel": "step bookkeeping",
    "finalize_step_kernel": "step bookkeeping",
    "_finish_step_kernel": "step bookkeeping",
    "_fixed_point_update_kernel": "step bookkeeping",
    "_cg_step_kernel": "step bookkeeping",
    "_cg_finish_kernel": "step bookkeeping",
    "_column_dots_kernel": "step bookkeeping",
    "row_product_dots_kernel": "step bookkeeping",
    "schedule_counts_kernel": "other",
    "schedule_fill_kernel": "other",
    "row_coefficients_kernel": "other",
    "row_sums_kernel": "other",
}
# The names older profiles print (bench/results): the same kernels, renamed after their ops
# on 2026-11-27 (before 2026-11-24 the neural Triton kernels were _neural_step/_neural_combine).
_FORMER_NAMES = {
    "_neural_weights_kernel": "_neural_edge_weights_kernel",
    "_neural_step_kernel": "_neural_edge_weights_kernel",
    "grad_pass_kernel": "neural_weight_grad_kernel",
    "_weight_grad_kernel": "_neural_weight_grad_kernel",
    "grad_combine_kernel": "neural_weight_grad_combine_kernel",
    "_neural_weights_combine_kernel": "_neural_edge_weights_combine_kernel",
    "_neural_combine_kernel": "_neural_edge_weights_combine_kernel",
    "_weight_grad_combine_kernel": "_neural_weight_grad_combine_kernel",
}
_ROW_PASS = "row_pass_kernel"
# row_pass_kernel's template arguments (plain, no nesting): its first boolean one is kNeural
# (<T, V, G, kNeural> in the H100 profile of 2026-11-23, <T, S, V, G, kNeural, kDots> now)
_ROW_PASS_ARGS = re.compile(r"row_pass_kernel<([^<>]*)>")
# cuBLAS, cuBLASLt and CUTLASS kernels (the GEMMs behind aten::mm / aten::addmm); their names
# carry no namespace of torch
_BLAS_KERNEL = re.compile(r"gemm|gemv|xmma|cutlass|nvjet|cublas|splitKreduce", re.IGNORECASE)
# namespaces of torch's own kernels and operators
_TORCH_NAMESPACES = {"at", "aten", "at_cuda_detail"}


def _neural_row_pass(name: str) -> bool:
    """Whether a row_pass_kernel's name is of its neural variant (kNeural true)."""
    args = _ROW_PASS_ARGS.search(name)
    flags = [a.strip() for a in args.group(1).split(",") if a.strip() in ("true", "false")] \
        if args else []
    return bool(flags) and flags[0] == "true"


def _qualified_name(name: str):
    """The namespace parts and the bare name of a profiler event: ``void
    ns::kernel<...>(args)`` -> ``["ns", "kernel"]``; a Triton kernel or an unqualified event
    -> ``[name]``."""
    name = name.replace("(anonymous namespace)::", "")
    head = re.split(r"[<(]", name, maxsplit=1)[0].split()  # the last word: no return type
    return head[-1].split("::") if head else [""]


def kernel_role(name: str) -> str:
    """The role (one of :data:`ROLES`) of a kernel or operator as torch.profiler names it."""
    parts = _qualified_name(name)
    kernel = _FORMER_NAMES.get(parts[-1], parts[-1])
    if kernel == _ROW_PASS:
        return "neural row pass" if _neural_row_pass(name) else "cached row pass"
    if kernel in _PROJECT_KERNELS:
        return _PROJECT_KERNELS[kernel]
    if _BLAS_KERNEL.search(name) or parts[0] in _TORCH_NAMESPACES:
        return "dense (aten)"
    return "other"


# The attribute of a profiler event with its own time on the device, in microseconds: named
# after the device since torch 2.4, after CUDA before.
_SELF_DEVICE_TIME = ("self_device_time_total", "self_cuda_time_total")


def _self_device_us(event) -> float:
    for attr in _SELF_DEVICE_TIME:
        if hasattr(event, attr):
            return getattr(event, attr)
    raise AttributeError(f"profiler event {event.key!r} has none of {_SELF_DEVICE_TIME}")


def profile_step(step_fn: Callable[[], object], rounds: int,
                 activity: ProfilerActivity = ProfilerActivity.CUDA) -> Dict[str, dict]:
    """Runs ``step_fn`` once (warm-up: JIT compilation, caches, allocator), then ``rounds``
    times under ``torch.profiler.profile(activities=[activity])``; returns, for every role of
    :data:`ROLES` in that order, ``{"us": time per step, "launches": events per step,
    "kernels": {name: {"us": time per step, "calls": per step}}}``.

    ``activity`` CUDA (the measurement): the device's events, kernels, copies and memsets, each
    with its own time on the device. ``activity`` CPU: the CPU operators, each with its self
    time (nested operators count each); that runs without a GPU, and is how the code path is
    tested on the CPU."""
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    if activity not in (ProfilerActivity.CUDA, ProfilerActivity.CPU):
        raise ValueError(f"activity must be ProfilerActivity.CUDA or ProfilerActivity.CPU, "
                         f"got {activity}")
    on_device = activity == ProfilerActivity.CUDA
    step_fn()
    if on_device:
        torch.cuda.synchronize()
    with torch.profiler.profile(activities=[activity]) as prof:
        for _ in range(rounds):
            step_fn()
        if on_device:
            torch.cuda.synchronize()
    device_type = DeviceType.CUDA if on_device else DeviceType.CPU
    roles = {role: {"us": 0.0, "launches": 0.0, "kernels": {}} for role in ROLES}
    for event in prof.key_averages():
        if event.device_type != device_type:
            continue  # with CUDA: the host's runtime calls (cudaLaunchKernel, ...)
        own_us = _self_device_us(event) if on_device else event.self_cpu_time_total
        per_step = {"us": own_us / rounds, "calls": event.count / rounds}
        role = roles[kernel_role(event.key)]
        role["us"] += per_step["us"]
        role["launches"] += per_step["calls"]
        role["kernels"][event.key] = per_step
    return roles
