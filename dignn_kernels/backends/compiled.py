"""The compiled backends ``"cpu"`` and ``"cuda"``: the ``torch.ops.dignn`` operators (C++ with
OpenMP on the CPU, CUDA kernels on the GPU; csrc/). The dispatcher picks the kernel from the
tensors' device, so both backends share the same passes; they differ in where they run.

Both keep a fused solve (:class:`~dignn_kernels.backends.interface.FusedSolve`): the C++ loop of
``dignn::implicit_diffusion`` and ``dignn::implicit_diffusion_backward`` (one loop for both
devices, csrc/ops/), which fuses the edge weights into the first sweep and runs every sweep
without returning to Python. On the CPU it is faster than the solvers' loop over the passes
(bench/layer/test_cpu_speed.py measures the layer on it); on a GPU it launches from C++ and keeps
the convergence test on the device.

16-bit storage (``storage_dtype``), in both: the row pass takes y in bfloat16 or float16 and
writes its output there (rounded to nearest even, as torch's ``.to()`` on the same device),
the gradient pass gathers z and v in 16 bits, each load widened to float32 where every sum
runs (csrc/cpu/passes_impl.h, "16-bit storage"; csrc/cuda/launch.h); b, p and q in 16 bits
are widened once per pass (csrc/ops/storage.h, written once for both). A fixed-point solve
with 16-bit iterates and float32 x runs in the fused loop too, with the results of the solvers'
loop over these passes (csrc/ops/solve.h; float64 x takes that loop). On cornell5 (one CPU
thread) a bfloat16 cached sweep takes 0.75 of a float32 one: the gathers of neighbour rows
move half the bytes (bench/results/cpu_cornell5_storage16.json). The CUDA kernels' 16-bit
passes have been verified in the kernels' host emulator only (tests/test_cuda_emulated.py),
not yet timed on a GPU (bench/layer/test_gpu_speed.py::test_storage_dtype_step).

cg (the solvers' loop, on both) takes the row product of the ops ``csr_schedule`` and
``row_product`` on the GPU only: the CSR's schedule made once per solve, not once per sweep as
``csr_fma`` makes it, and w.u summed in the sweep's epilogue (a table of per-block sums and one
small kernel), not in a second pass over w and u. On the CPU, where the host reads every value
anyway, that dot product is under 3% of a cg iteration (cornell5, one thread): the CPU backend
keeps cg on ``csr_fma`` and its own dot product; its ``row_product`` kernel exists for the op's
callers and tests. The other sweeps of the solvers' loop on the GPU (anderson's, a partitioned
solve's) take the row map: ``csr_fma`` on the schedule made once per solve, where a plain call
makes it anew (a counting kernel, three scans and a fill kernel before every sweep).
"""
from functools import partial

import torch

from .interface import STORAGE_DTYPES, Backend, FusedSolve, widened_to

__all__ = ["CPU", "CUDA", "prepared_row_map", "prepared_row_product"]

_ops = torch.ops.dignn


def _cuda_built() -> bool:
    """Whether the extension was built with its CUDA kernels: asked of the dispatcher (the
    ops' registrations), not of the package's build record one floor up."""
    return torch._C._dispatch_has_kernel_for_dispatch_key("dignn::csr_fma", "CUDA")


def _scheduled(ops, rowptr, col):
    """(col, schedule) of a graph for a solve's sweeps: int64 columns made int32 once (the GPU
    kernels read int32), the schedule made once (``ops.csr_schedule``)."""
    if col.dtype == torch.int64 and rowptr.shape[0] - 1 <= torch.iinfo(torch.int32).max:
        col = col.to(torch.int32)
    return col, ops.csr_schedule(rowptr, col)


def prepared_row_product(ops):
    """The pass interface's row product over the ops ``csr_schedule`` and ``row_product`` of
    ``ops`` (torch.ops.dignn, or the tests' emulated build): each sweep one op call on the
    graph's schedule (:func:`_scheduled`)."""
    def row_product(rowptr, col, w, cy, rs):
        col, schedule = _scheduled(ops, rowptr, col)
        return partial(ops.row_product, rowptr, col, w, cy, rs, schedule)
    return row_product


def prepared_row_map(ops):
    """The pass interface's row map over the ops ``csr_schedule`` and ``csr_fma`` of ``ops``:
    each sweep ``map(y, b)`` one ``csr_fma`` call on the graph's schedule (with an
    ``out_dtype`` other than y's, on y widened to it: the op writes y's dtype)."""
    def row_map(rowptr, col, w, cy, rs):
        col, schedule = _scheduled(ops, rowptr, col)
        return lambda y, b, out_dtype=None: ops.csr_fma(
            rowptr, col, w, widened_to(y, out_dtype), b, cy, rs, schedule)
    return row_map


_FUSED = FusedSolve(forward=_ops.implicit_diffusion, backward=_ops.implicit_diffusion_backward,
                    storage_dtypes=STORAGE_DTYPES)

# Vector kernels None: the CPU's compiled Anderson record (dignn::anderson_record), PyTorch's
# ops for the rest.
CPU = Backend(name="cpu", available=lambda device: device.type == "cpu",
              neural_edge_weights=_ops.neural_edge_weights, csr_fma=_ops.csr_fma,
              neural_weight_grad=_ops.neural_weight_grad, fused_solve=_FUSED,
              storage_dtypes=STORAGE_DTYPES, vector_kernels=None)

CUDA = Backend(name="cuda",
               available=lambda device: device.type == "cuda" and _cuda_built()
               and torch.cuda.is_available(),
               neural_edge_weights=_ops.neural_edge_weights, csr_fma=_ops.csr_fma,
               neural_weight_grad=_ops.neural_weight_grad, fused_solve=_FUSED,
               storage_dtypes=STORAGE_DTYPES, row_product=prepared_row_product(_ops),
               row_map=prepared_row_map(_ops), vector_kernels="torch")
