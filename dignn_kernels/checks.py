"""Argument validation shared by every backend: one place for the checks and their messages.

- :func:`check_scalars`: mu, eps, max_iter, tol, in Python before any backend sees them;
- :func:`check_graph` / :func:`check_graph_data`: the O(nodes + edges) proof that a CSR will
  not make a kernel index out of bounds (the ``dignn::check_graph`` op), run once per call at
  the op boundary unless the caller vouches for the graph (``trusted=True``) and once per graph
  in the graph cache (:meth:`dignn_kernels.graph.CSRGraph.check`);
- the shape, dtype and device checks (:func:`check_csr`, :func:`check_features`, ...), which
  the solve entry runs for every backend and the Triton custom ops for their direct callers.

The messages are those of the compiled ops (csrc/ops/checks.h), so a bad argument is named the
same way whatever backend runs.
"""
import math
from typing import Optional

import torch
from torch import Tensor

__all__ = ["check_scalars", "check_graph", "check_graph_data", "check_csr", "check_values",
           "check_features", "check_edge_values", "check_projections", "check_transposed",
           "check_compute_dtype"]

# Tensors a pass may take in 16 bits (storage_dtype; backends.interface.STORAGE_DTYPES).
_STORAGE = (torch.bfloat16, torch.float16)


def check_scalars(mu=None, eps=None, max_iter=None, tol=None) -> None:
    """The scalar arguments, checked in Python before any backend sees them (the C++ checks
    stay as a second line for direct callers of torch.ops.dignn). Not while torch.compile
    traces, where the scalars may be symbolic; the compiled graph still runs the C++ checks."""
    if torch.compiler.is_compiling():
        return
    for name, value, zero_ok in (("mu", mu, False), ("eps", eps, False), ("tol", tol, True)):
        if value is None:
            continue
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not (number and math.isfinite(value) and (value > 0 or (zero_ok and value == 0))):
            raise ValueError(f"{name} must be a finite number {'>= 0' if zero_ok else '> 0'}, "
                             f"got {value!r}")
    if max_iter is not None and (isinstance(max_iter, bool) or not isinstance(max_iter, int)
                                 or max_iter < 1):
        raise ValueError(f"max_iter must be an integer >= 1, got {max_iter!r}")


_CHECK_KERNEL = {}
_CHECK_OP = torch.ops.dignn.check_graph  # the compiled check (CPU and CUDA kernels)


def _has_check_kernel(device_type: str) -> bool:
    if device_type not in _CHECK_KERNEL:
        key = {"cpu": "CPU", "cuda": "CUDA"}.get(device_type)
        _CHECK_KERNEL[device_type] = key is not None and \
            torch._C._dispatch_has_kernel_for_dispatch_key("dignn::check_graph", key)
    return _CHECK_KERNEL[device_type]


def check_graph(rowptr: Tensor, col: Tensor, num_nodes: int, t_rowptr: Optional[Tensor] = None,
                t_col: Optional[Tensor] = None, t_perm: Optional[Tensor] = None) -> None:
    """Raises RuntimeError, naming the argument and the first bad entry, unless (rowptr, col)
    is a CSR of ``num_nodes`` rows whose columns are node indices: rowptr[0] == 0, rowptr
    non-decreasing, rowptr[-1] == col.numel(), 0 <= col < num_nodes; the same of the transposed
    CSR (t_rowptr, t_col) when given, and t_perm a permutation of 0..m-1. O(nodes + edges);
    on a GPU it reads one flag back (a sync). On a device without a dignn kernel (CUDA tensors
    with a CPU-only build, for the triton backend) it checks host copies."""
    if isinstance(rowptr, Tensor) and rowptr.device.type != "cpu" and \
            not _has_check_kernel(rowptr.device.type):
        rowptr, col, t_rowptr, t_col, t_perm = (
            t.cpu() if isinstance(t, Tensor) else t for t in (rowptr, col, t_rowptr, t_col,
                                                              t_perm))
    _CHECK_OP(rowptr, col, num_nodes, t_rowptr, t_col, t_perm)


def check_graph_data(trusted: bool, rowptr, col, nodes, t_rowptr=None, t_col=None,
                     t_perm=None) -> None:
    """:func:`check_graph` for an op whose node signal (n x d) is ``nodes``, unless the caller
    vouches for the graph (``trusted``), torch.compile traces (the graph's values are not
    known then) or a CUDA graph is being captured (the check reads a flag back, which a
    capture cannot; the eager warm-up a capture needs has checked the graph, and a replay
    runs the captured kernels only). The one data check of every backend: the ops here and
    the solve entry (:func:`dignn_kernels.solvers.implicit_diffusion`) run it once, the passes
    of :mod:`dignn_kernels.backends` never. When rowptr's length does not match ``nodes`` the
    data are not checked: the op's own shape check then names rowptr and the node signal."""
    if trusted or torch.compiler.is_compiling():
        return
    if isinstance(rowptr, Tensor) and rowptr.is_cuda and \
            torch.cuda.is_current_stream_capturing():
        return
    if not (isinstance(rowptr, Tensor) and isinstance(nodes, Tensor) and rowptr.dim() == 1
            and nodes.dim() >= 1 and rowptr.shape[0] == nodes.shape[0] + 1):
        return
    check_graph(rowptr, col, nodes.shape[0], t_rowptr, t_col, t_perm)


def check_csr(rowptr: Tensor, col: Tensor, rowptr_name="rowptr", col_name="col") -> None:
    if rowptr.dim() != 1 or rowptr.numel() < 1:
        raise RuntimeError(f"{rowptr_name} must be a 1-D tensor of n + 1 row offsets, got "
                           f"shape {list(rowptr.shape)}")
    if rowptr.dtype != torch.int64:
        raise RuntimeError(f"{rowptr_name} must be int64, got {rowptr.dtype}")
    if col.dim() != 1:
        raise RuntimeError(f"{col_name} must be a 1-D tensor, got shape {list(col.shape)}")
    if col.dtype not in (torch.int32, torch.int64):
        raise RuntimeError(f"{col_name} must be int32 or int64, got {col.dtype}")
    if col.device != rowptr.device:
        raise RuntimeError(f"{col_name} is on {col.device} but {rowptr_name} is on "
                           f"{rowptr.device}")


def check_values(t: Tensor, t_name: str, shape, like: Tensor, rowptr: Tensor,
                 storage_ok: bool = False) -> None:
    """Shape, dtype (like's; with ``storage_ok`` also a 16-bit storage dtype) and device."""
    if list(t.shape) != list(shape):
        raise RuntimeError(f"{t_name} must have shape {list(shape)}, got {list(t.shape)}")
    if t.dtype != like.dtype and not (storage_ok and t.dtype in _STORAGE):
        raise RuntimeError(f"{t_name} must have dtype {like.dtype} like the features, got "
                           f"{t.dtype}")
    if t.device != rowptr.device:
        raise RuntimeError(f"{t_name} is on {t.device} but the graph is on {rowptr.device}")


def check_features(x: Tensor, x_name: str, n: int, rowptr: Tensor,
                    rowptr_name: str = "rowptr", storage_ok: bool = False) -> None:
    """A node signal: 2-D, one row per node, float32 or float64 (``storage_ok``: or a
    16-bit storage dtype, bfloat16 or float16), on the graph's device."""
    if x.dim() != 2:
        raise RuntimeError(f"{x_name} must be 2-D (nodes x channels), got shape "
                           f"{list(x.shape)}")
    if x.shape[0] != n:
        raise RuntimeError(f"{rowptr_name} has {n} + 1 entries for {n} rows but {x_name} has "
                           f"{x.shape[0]} rows ({x_name} has {x.shape[0]} rows but the graph "
                           f"has {n} nodes): {rowptr_name} must hold num_nodes + 1 row offsets "
                           f"and {x_name} one row per node")
    if x.dtype not in (torch.float32, torch.float64) and not (storage_ok and x.dtype in _STORAGE):
        raise RuntimeError(f"{x_name} must be float32 or float64, got {x.dtype}; the layer "
                           f"computes float16/bfloat16 features in float32")
    if x.device != rowptr.device:
        raise RuntimeError(f"{x_name} is on {x.device} but the graph is on {rowptr.device}")


def check_compute_dtype(t: Tensor, t_name: str) -> None:
    """The compute dtype of a pass that takes 16-bit storage: float32 or float64."""
    if t.dtype not in (torch.float32, torch.float64):
        raise RuntimeError(f"{t_name} must be float32 or float64 (the compute dtype; only "
                           f"iterates and projections may be stored in 16 bits), got {t.dtype}")


def check_edge_values(rowptr, col, values, values_name, rowptr_name="rowptr",
                       col_name="col") -> int:
    check_csr(rowptr, col, rowptr_name, col_name)
    if values.dim() != 1 or values.numel() != col.numel():
        raise RuntimeError(f"{values_name} must hold one value per edge ({col.numel()}), got "
                           f"shape {list(values.shape)}")
    return rowptr.numel() - 1


def check_projections(p, q, like, n, rowptr) -> None:
    check_features(p, "p", n, rowptr)
    check_values(q, "q", p.shape, like, rowptr)
    check_values(p, "p", q.shape, like, rowptr)


def check_transposed(t_rowptr, t_col, t_perm, rowptr, col) -> bool:
    given = [t is not None for t in (t_rowptr, t_col, t_perm)]
    if not any(given):
        return False
    if not all(given):
        raise RuntimeError("t_rowptr, t_col and t_perm go together: pass all three or none")
    check_csr(t_rowptr, t_col, "t_rowptr", "t_col")
    if t_rowptr.numel() != rowptr.numel():
        raise RuntimeError(f"t_rowptr has {t_rowptr.numel()} entries but rowptr has "
                           f"{rowptr.numel()}: the transposed CSR has the graph's num_nodes + 1 "
                           f"row offsets")
    if t_perm.dim() != 1 or t_perm.dtype not in (torch.int64, torch.int32):
        raise RuntimeError(f"t_perm must be a 1-D int64 (or int32) tensor, got shape "
                           f"{list(t_perm.shape)} and dtype {t_perm.dtype}")
    if t_col.numel() != col.numel() or t_perm.numel() != col.numel():
        raise RuntimeError(f"t_col and t_perm must hold one entry per edge ({col.numel()}), "
                           f"got {t_col.numel()} and {t_perm.numel()}")
    if t_rowptr.device != rowptr.device or t_perm.device != rowptr.device:
        raise RuntimeError(f"t_rowptr, t_col and t_perm must be on the graph's device "
                           f"{rowptr.device}")
    return True
