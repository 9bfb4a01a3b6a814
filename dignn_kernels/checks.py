"""Argument validation shared by every backend: one place for the checks and their messages.

- :func:`check_scalars`: mu, eps, max_iter, tol, in Python before any backend sees them;
- :func:`check_graph` / :func:`check_graph_data`: the O(nodes + edges) proof that a CSR will
  not make a kernel index out of bounds (the ``dignn::check_graph`` op), run once per call at
  the op boundary unless the caller vouches for the graph (``trusted=True``) and once per graph
  in the graph cache (:meth:`dignn_kernels.graph.CSRGraph.check`);
- the shape, dtype and device checks (:func:`check_csr`, :func:`check_features`, ...) and,
  per op, all of them in the order of the compiled op (``check_<op>_args``, the mirror of
  ``check_<op>_args`` in csrc/ops/checks.h), which :mod:`dignn_kernels.ops` runs before the
  pass of every backend but the compiled one (whose ops run checks.h themselves), the solve
  entry for every backend and the Triton custom ops for their direct callers;
- :func:`check_same_device`: every tensor argument on one device, which the fake (meta)
  kernels of the ops run too: with one meta tensor among the arguments the dispatcher picks
  the fake kernel, whose empty outputs would otherwise come back as results.

The messages are those of the compiled ops (csrc/ops/checks.h), so a bad argument is named the
same way whatever backend runs.
"""
import math
import numbers
from typing import Optional

import torch
from torch import Tensor

from .csr import diagonal_index

__all__ = ["check_scalars", "check_graph", "check_graph_data", "check_csr", "check_values",
           "check_features", "check_edge_values", "check_projections", "check_transposed",
           "check_compute_dtype", "check_same_device", "check_tensors", "check_positive",
           "check_neural_edge_weights_args", "check_neural_edge_weights_backward_args",
           "check_diffusion_step_args", "check_csr_fma_args",
           "check_neural_weight_grad_args", "check_graph_args", "check_solve_args",
           "check_int", "check_flag", "check_backend_device", "check_projection_range",
           "FLOWS", "check_flow"]

# Tensors a pass may take in 16 bits (storage_dtype; backends.interface.STORAGE_DTYPES).
_STORAGE = (torch.bfloat16, torch.float16)


class _NotGiven:
    def __repr__(self):
        return "<not given>"


# The default of check_scalars' arguments: a scalar not passed. None is a value, and a wrong
# one (an explicit mu=None is refused naming mu, not turned into a float() TypeError later).
_NOT_GIVEN = _NotGiven()


def _is_real(value) -> bool:
    """A real number: int, float, numpy's scalars; not bool (True is not an eps of 1)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_scalars(mu=_NOT_GIVEN, eps=_NOT_GIVEN, max_iter=_NOT_GIVEN, tol=_NOT_GIVEN) -> None:
    """The scalar arguments given, checked in Python before any backend sees them (the C++
    checks stay as a second line for direct callers of torch.ops.dignn): mu and eps finite
    numbers > 0, tol a finite number >= 0, max_iter an integer >= 1; bools and None refused.
    Not while torch.compile traces, where the scalars may be symbolic; the compiled graph
    still runs the C++ checks."""
    if torch.compiler.is_compiling():
        return
    for name, value, zero_ok in (("mu", mu, False), ("eps", eps, False), ("tol", tol, True)):
        if value is _NOT_GIVEN:
            continue
        if not (_is_real(value) and math.isfinite(value)
                and (value > 0 or (zero_ok and value == 0))):
            raise ValueError(f"{name} must be a finite number {'>= 0' if zero_ok else '> 0'}, "
                             f"got {value!r}")
    if max_iter is not _NOT_GIVEN:
        check_int("max_iter", max_iter, 1)


INT64_MAX = 2**63 - 1


def check_int(name: str, value, minimum: int) -> None:
    """A Python int (not bool) >= minimum that fits the ops' int64, else a ValueError naming
    it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if value > INT64_MAX:
        raise ValueError(f"{name} must be at most 2**63 - 1 (an int64), got {value!r}")


#: The ``flow`` choices, named and valued as PyG's ``MessagePassing(flow=...)``: with
#: ``"source_to_target"`` an edge ``(edge_index[0, k], edge_index[1, k]) = (j, i)`` sends a
#: message from j to i, so row i of Delta sums over the edges at ``edge_index[1]``; with
#: ``"target_to_source"`` row i sums over the edges at ``edge_index[0]`` (the authors' DIGNN
#: code, ``scatter_add(..., row)`` with ``row, col = edge_index``).
FLOWS = ("source_to_target", "target_to_source")


def check_flow(flow) -> str:
    """The ``flow`` argument, one of :data:`FLOWS`, else a ValueError naming it and both
    choices (PyG's names: the layer reads ``edge_index`` as ``MessagePassing(flow=...)``
    does).

    Args:
        flow: ``"source_to_target"`` (PyG's default: node i aggregates over the edges
            ``(j, i)``, at ``edge_index[1]``) or ``"target_to_source"`` (at
            ``edge_index[0]``, the authors' DIGNN code).

    Returns:
        str: ``flow``.

    Raises:
        ValueError: ``flow`` not one of the two.

    Example:
        >>> from dignn_kernels.checks import check_flow
        >>> check_flow("target_to_source")
        'target_to_source'
        >>> check_flow("in")
        Traceback (most recent call last):
        ...
        ValueError: flow must be 'source_to_target' or 'target_to_source' ..., got 'in'
    """
    if not isinstance(flow, str) or flow not in FLOWS:
        raise ValueError(f"flow must be {FLOWS[0]!r} or {FLOWS[1]!r} (as PyG's "
                         f"MessagePassing(flow=...)), got {flow!r}")
    return flow


def check_flag(name: str, value, none_ok: bool = False) -> None:
    """True or False (or None where ``none_ok``): a truthy string must not pass for True."""
    if not (isinstance(value, bool) or (none_ok and value is None)):
        raise TypeError(f"{name} must be True or False{' or None' if none_ok else ''}, got "
                        f"{value!r}")


def check_backend_device(backend, name: str, device: torch.device) -> None:
    """The backend record ``backend`` (named ``name``) runs on ``device``: the compiled ops
    dispatch on the tensors' device, so backend="cuda" on CPU tensors would run the CPU
    kernels (and "cpu" on CUDA tensors the CUDA ones) under another name."""
    if not backend.available(device):
        raise RuntimeError(f"backend={name!r} cannot run on {device}: pass backend=None (the "
                           f"compiled ops of the tensors' device) or one of the backends "
                           f"available there, dignn_kernels.available_backends({str(device)!r})")


def check_positive(value, name: str) -> None:
    """The C++ ops' check of mu and eps (csrc/ops/checks.h check_positive), for the Triton
    ops' direct callers: finite and > 0."""
    if not (_is_real(value) and math.isfinite(value) and value > 0):
        raise RuntimeError(f"{name} must be > 0 and finite, got {value!r}")


def check_tensors(**named) -> None:
    """Each argument a torch.Tensor, else a TypeError naming it (the optional ones:
    :func:`check_optional_tensors`)."""
    for name, t in named.items():
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")


def check_optional_tensors(**named) -> None:
    for name, t in named.items():
        if t is not None and not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor or None, got {type(t).__name__}")


def check_same_device(op: str, **named) -> None:
    """Every tensor among ``named`` (None skipped; a list or tuple: each of its tensors) on the
    first one's device, else a RuntimeError naming the argument (the CSR's col against rowptr,
    the others against the graph). The fake kernels run it too: on one meta tensor among real
    ones the dispatcher picks the fake kernel, and its empty outputs would be the results."""
    first_name = first = None
    for name, t in named.items():
        items = enumerate(t) if isinstance(t, (list, tuple)) else ((None, t),)
        for i, item in items:
            if not isinstance(item, Tensor):
                continue
            if first is None:
                first_name, first = name, item
            elif item.device != first.device:
                label = name if i is None else f"{name}[{i}]"
                where = "the graph is on" if first_name == "rowptr" and label != "col" else \
                    f"{first_name} is on"
                raise RuntimeError(f"{label} is on {item.device} but {where} {first.device}: "
                                   f"every tensor argument of {op} must be on one device")


_CHECK_KERNEL = {}
_CHECK_OP = torch.ops.dignn.check_graph  # the compiled check (CPU and CUDA kernels)


def _has_check_kernel(device_type: str) -> bool:
    if device_type not in _CHECK_KERNEL:
        key = {"cpu": "CPU", "cuda": "CUDA"}.get(device_type)
        _CHECK_KERNEL[device_type] = key is not None and \
            torch._C._dispatch_has_kernel_for_dispatch_key("dignn::check_graph", key)
    return _CHECK_KERNEL[device_type]


def check_graph_args(rowptr, col, num_nodes, t_rowptr=None, t_col=None, t_perm=None) -> bool:
    """The arguments of :func:`check_graph` (csrc/ops/checks.h check_graph_args): types,
    shapes, dtypes, devices and num_nodes; returns whether the transposed CSR is given."""
    check_tensors(rowptr=rowptr, col=col)
    check_optional_tensors(t_rowptr=t_rowptr, t_col=t_col, t_perm=t_perm)
    check_csr(rowptr, col)
    check_same_device("check_graph", rowptr=rowptr, col=col, t_rowptr=t_rowptr, t_col=t_col,
                      t_perm=t_perm)
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, numbers.Integral):
        raise TypeError(f"num_nodes must be an int, got {type(num_nodes).__name__}")
    if num_nodes < 0:
        raise RuntimeError(f"num_nodes must be >= 0, got {num_nodes}")
    n = rowptr.numel() - 1
    if n != num_nodes:
        raise RuntimeError(f"rowptr has {n} + 1 entries for {n} rows but num_nodes = "
                           f"{num_nodes}: rowptr must hold num_nodes + 1 row offsets")
    return check_transposed(t_rowptr, t_col, t_perm, rowptr, col)


def check_graph(rowptr: Tensor, col: Tensor, num_nodes: int, t_rowptr: Optional[Tensor] = None,
                t_col: Optional[Tensor] = None, t_perm: Optional[Tensor] = None) -> None:
    """Raises RuntimeError, naming the argument and the first bad entry, unless (rowptr, col)
    is a CSR of ``num_nodes`` rows whose columns are node indices: rowptr[0] == 0, rowptr
    non-decreasing, rowptr[-1] == col.numel(), 0 <= col < num_nodes; the same of the transposed
    CSR (t_rowptr, t_col) when given, t_perm a permutation of 0..m-1 and (t_rowptr, t_col,
    t_perm) the transpose of (rowptr, col) (entry k of the transposed CSR in row j is the CSR's
    edge t_perm[k], in row t_col[k] and column j). O(nodes + edges); on a GPU it reads one flag
    back (a sync). On a device without a dignn kernel (CUDA tensors with a CPU-only build, for
    the triton backend) it checks host copies; on the meta device, which holds no values, it
    refuses.

    Args:
        rowptr: int64 Tensor [n + 1].
        col: int32 or int64 Tensor [m].
        num_nodes: int, n.
        t_rowptr, t_col, t_perm: the transposed CSR and its edge positions, or None.

    Raises:
        RuntimeError: the first bad entry, naming its argument.

    Example:
        >>> import torch
        >>> from dignn_kernels import ops
        >>> ops.check_graph(torch.tensor([0, 1, 2]), torch.tensor([1, 0]), 2)
        >>> ops.check_graph(torch.tensor([0, 1, 2]), torch.tensor([1, 5]), 2)
        Traceback (most recent call last):
            ...
        RuntimeError: ...
    """
    if not torch.compiler.is_compiling():
        check_graph_args(rowptr, col, num_nodes, t_rowptr, t_col, t_perm)
        num_nodes = int(num_nodes)
    if isinstance(rowptr, Tensor) and rowptr.device.type == "meta":
        raise RuntimeError("rowptr is on the meta device, whose tensors hold no values: the "
                           "graph's data cannot be checked. Pass the graph on a device that "
                           "holds it (cpu, cuda), or trusted=True for a graph known to be valid "
                           "(one from dignn_kernels.build_graph)")
    if isinstance(rowptr, Tensor) and rowptr.device.type != "cpu" and \
            not _has_check_kernel(rowptr.device.type):
        rowptr, col, t_rowptr, t_col, t_perm = (
            t.cpu() if isinstance(t, Tensor) else t for t in (rowptr, col, t_rowptr, t_col,
                                                              t_perm))
    _CHECK_OP(rowptr, col, num_nodes, t_rowptr, t_col, t_perm)


def check_graph_data(trusted: bool, rowptr, col, nodes, t_rowptr=None, t_col=None,
                     t_perm=None, diag_index=None) -> None:
    """:func:`check_graph` for an op whose node signal (n x d) is ``nodes``, unless the caller
    vouches for the graph (``trusted``), torch.compile traces (the graph's values are not
    known then) or a CUDA graph is being captured (the check reads a flag back, which a
    capture cannot; the eager warm-up a capture needs has checked the graph, and a replay
    runs the captured kernels only). The one data check of every backend: the ops here and
    the solve entry (:func:`dignn_kernels.solvers.implicit_diffusion`) run it once, the passes
    of :mod:`dignn_kernels.backends` never. When rowptr's length does not match ``nodes`` the
    data are not checked: the op's own shape check then names rowptr and the node signal.
    ``diag_index`` (the solve entry's): the positions of the self-loops, compared with
    :func:`dignn_kernels.csr.diagonal_index` of the checked CSR."""
    if trusted is True or torch.compiler.is_compiling():
        return
    check_flag("trusted", trusted)  # a truthy "no" must not skip the check
    if isinstance(rowptr, Tensor) and rowptr.is_cuda and \
            torch.cuda.is_current_stream_capturing():
        return
    if not (isinstance(rowptr, Tensor) and isinstance(nodes, Tensor) and rowptr.dim() == 1
            and nodes.dim() >= 1 and rowptr.shape[0] == nodes.shape[0] + 1):
        return
    check_graph(rowptr, col, nodes.shape[0], t_rowptr, t_col, t_perm)
    if isinstance(diag_index, Tensor):
        _check_diag_index_data(rowptr, col, diag_index)


def _check_diag_index_data(rowptr: Tensor, col: Tensor, diag_index: Tensor) -> None:
    """cg's Jacobi preconditioner reads W_ii at diag_index[i]: another position would
    precondition with a wrong diagonal (or divide by zero)."""
    want = diagonal_index(rowptr, col)
    if diag_index.shape == want.shape and bool(torch.equal(diag_index, want)):
        return
    i = int(torch.nonzero(diag_index != want)[0, 0])
    raise RuntimeError(f"diag_index[{i}] = {int(diag_index[i])} but row {i}'s self-loop is at "
                       f"CSR position {int(want[i])} (-1: none): pass None (computed) or "
                       f"CSRGraph.diagonal_index() of this graph")


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
        raise RuntimeError(f"{values_name} must hold one value per edge ({col_name} has "
                           f"{col.numel()} entries), got shape {list(values.shape)}")
    return rowptr.numel() - 1


def check_projections(p, q, like, n, rowptr) -> None:
    check_features(p, "p", n, rowptr)
    check_values(q, "q", p.shape, like, rowptr)
    check_values(p, "p", q.shape, like, rowptr)


def check_projection_range(p: Tensor, name: str = "p") -> None:
    """Raises ValueError naming ``p`` when its entries are so large that the neural edge
    weights' pi_ij = p_i . p_j (paper eq. 13), summed in the compute dtype, can overflow: once
    h max|p|^2 passes the dtype's largest value a partial sum may be inf, or inf - inf = NaN
    with mixed signs, and tanh(|pi_ij|) then reads 1 or NaN where the exact pi_ij may be
    small. Reads max|p| on the host: the solve runs it where it may read the host (its
    ``host_checks``), the ops for a graph they check (not ``trusted``). Non-finite entries
    are left to the solve's warning, which names them."""
    if torch.compiler.is_compiling() or not isinstance(p, Tensor) or p.numel() == 0 or \
            not p.is_floating_point() or p.device.type == "meta" or p.dim() != 2:
        return  # (what is not a float signal: the op's own checks name it)
    compute = torch.float64 if p.dtype == torch.float64 else torch.float32
    low, high = torch.aminmax(p.detach())
    top = max(-float(low), float(high))
    limit = math.sqrt(torch.finfo(compute).max / p.shape[-1])
    if math.isfinite(top) and top > limit:
        raise ValueError(
            f"{name} reaches |{name}| = {top:.3g}, beyond {limit:.3g}: the neural edge weights' "
            f"dot products {name}_i . {name}_j (paper eq. 13, summed over its {p.shape[-1]} "
            f"channels in {compute}) can overflow there, and the weights would be wrong. "
            f"Compute in torch.float64 (the layer: x and its parameters), or scale the "
            f"features down.")


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
        raise RuntimeError(f"t_col and t_perm must hold one entry per edge (col has "
                           f"{col.numel()} entries), got {t_col.numel()} and {t_perm.numel()}")
    if t_rowptr.device != rowptr.device or t_perm.device != rowptr.device:
        raise RuntimeError(f"t_rowptr, t_col and t_perm must be on the graph's device "
                           f"{rowptr.device}")
    return True


def check_storage16_supported(t: Tensor, name: str, storage16: bool) -> None:
    if not storage16 and t.dtype in _STORAGE:
        raise RuntimeError(f"{name} is {t.dtype} but this op takes float32 or float64 (16-bit "
                           f"storage is taken by the row pass csr_fma, the gradient pass "
                           f"neural_weight_grad and neural_edge_weights); pass {name} in "
                           f"float32 or float64")


# ------------------------------------------------------------------ per op (O(1)) --
# The mirror of csrc/ops/checks.h's check_<op>_args, in the same order and with the same
# messages, so every backend refuses what the compiled ops refuse, naming the same argument.
# Each takes the op's tensors by name and first checks that they are tensors on one device.

def _op_tensors(op: str, optional=(), **named) -> None:
    for name, t in named.items():
        if name in optional:
            check_optional_tensors(**{name: t})
        elif isinstance(t, (list, tuple)):
            for i, item in enumerate(t):
                check_tensors(**{f"{name}[{i}]": item})
        else:
            check_tensors(**{name: t})
    check_csr(named["rowptr"], named["col"])
    check_same_device(op, **named)


def check_neural_edge_weights_args(rowptr, col, a, p, q, eps, storage16: bool = True) -> int:
    """storage16: p and q may be stored in 16 bits (then a holds the compute dtype)."""
    _op_tensors("neural_edge_weights", rowptr=rowptr, col=col, a=a, p=p, q=q)
    n = check_edge_values(rowptr, col, a, "a")
    check_storage16_supported(p, "p", storage16)
    check_features(p, "p", n, rowptr, storage_ok=storage16)
    check_values(q, "q", p.shape, p, rowptr)
    like = a if p.dtype in _STORAGE else p
    check_compute_dtype(like, "a")
    check_values(a, "a", [col.numel()], like, rowptr)
    check_positive(eps, "eps")
    return n


def check_neural_edge_weights_backward_args(rowptr, col, a, p, q, eps, grad_w, t_rowptr, t_col,
                                            t_perm) -> int:
    _op_tensors("neural_edge_weights_backward", rowptr=rowptr, col=col, a=a, p=p, q=q,
                grad_w=grad_w, t_rowptr=t_rowptr, t_col=t_col, t_perm=t_perm)
    n = check_neural_edge_weights_args(rowptr, col, a, p, q, eps, storage16=False)
    check_values(grad_w, "grad_w", [col.numel()], p, rowptr)
    check_transposed(t_rowptr, t_col, t_perm, rowptr, col)
    return n


def check_diffusion_step_args(rowptr, col, w, chi, kappa, x, z, mu) -> int:
    _op_tensors("diffusion_step", rowptr=rowptr, col=col, w=w, chi=chi, kappa=kappa, x=x, z=z)
    n = check_edge_values(rowptr, col, w, "w")
    check_features(x, "x", n, rowptr)
    check_values(z, "z", x.shape, x, rowptr)
    check_values(chi, "chi", [n], x, rowptr)
    check_values(kappa, "kappa", [n], x, rowptr)
    check_values(w, "w", [col.numel()], x, rowptr)
    check_positive(mu, "mu")
    return n


def check_csr_fma_args(rowptr, col, w, y, b, cy, rs) -> int:
    """y (and b) may be stored in 16 bits (then w holds the compute dtype)."""
    _op_tensors("csr_fma", rowptr=rowptr, col=col, w=w, y=y, b=b, cy=cy, rs=rs)
    n = check_edge_values(rowptr, col, w, "w")
    check_features(y, "y", n, rowptr, storage_ok=True)
    like = w if y.dtype in _STORAGE else y
    check_compute_dtype(like, "w")
    check_values(b, "b", y.shape, like, rowptr, storage_ok=True)
    check_values(w, "w", [col.numel()], like, rowptr)
    check_values(cy, "cy", [n], like, rowptr)
    check_values(rs, "rs", [n], like, rowptr)
    return n


def check_neural_weight_grad_args(rowptr, col, a, p, q, z, v, eps, t_rowptr=None, t_col=None,
                                  t_perm=None) -> bool:
    """z, v, p and q may be stored in 16 bits (then a holds the compute dtype). Returns
    whether the transposed CSR is given."""
    _op_tensors("neural_weight_grad", ("t_rowptr", "t_col", "t_perm"), rowptr=rowptr, col=col,
                a=a, p=p, q=q, z=z, v=v, t_rowptr=t_rowptr, t_col=t_col, t_perm=t_perm)
    n = check_edge_values(rowptr, col, a, "a")
    check_features(z, "z", n, rowptr, storage_ok=True)
    like = a if z.dtype in _STORAGE else z
    check_compute_dtype(like, "a")
    check_values(v, "v", z.shape, like, rowptr, storage_ok=True)
    check_features(p, "p", n, rowptr, storage_ok=True)
    check_values(q, "q", p.shape, like, rowptr, storage_ok=True)
    check_values(p, "p", q.shape, like, rowptr, storage_ok=True)
    check_values(a, "a", [col.numel()], like, rowptr)
    check_positive(eps, "eps")
    return check_transposed(t_rowptr, t_col, t_perm, rowptr, col)


def check_solve_args(rowptr, col, edge_value, x, chi, p, q, kappa, t_rowptr, t_col, t_perm,
                     diag_index=None) -> None:
    """The tensors of a solve (the solve entry, every backend; the mirror of
    check_implicit_diffusion_args less the scalars, which check_scalars has checked)."""
    _op_tensors("implicit_diffusion", ("p", "q", "kappa", "t_rowptr", "t_col", "t_perm",
                                       "diag_index"),
                rowptr=rowptr, col=col, edge_value=edge_value, x=x, chi=chi, p=p, q=q,
                kappa=kappa, t_rowptr=t_rowptr, t_col=t_col, t_perm=t_perm,
                diag_index=diag_index)
    n = check_edge_values(rowptr, col, edge_value, "edge_value")
    check_features(x, "x", n, rowptr)
    check_values(edge_value, "edge_value", [col.numel()], x, rowptr)
    check_values(chi, "chi", [n], x, rowptr)
    if (p is None) != (q is None):
        raise RuntimeError("p and q go together: pass both (neural Laplacian) or neither")
    if p is not None:
        if kappa is not None:
            raise RuntimeError("kappa is computed from the neural edge weights; pass it only "
                               "for fixed W")
        check_projections(p, q, x, n, rowptr)
    elif kappa is not None:
        check_values(kappa, "kappa", [n], x, rowptr)
    check_transposed(t_rowptr, t_col, t_perm, rowptr, col)
    if diag_index is not None and (list(diag_index.shape) != [n]
                                   or diag_index.dtype != torch.int64):
        raise RuntimeError(f"diag_index must be an int64 tensor of shape [{n}] (the CSR "
                           f"position of each row's self-loop, or -1: CSRGraph.diagonal_index"
                           f"()), got {diag_index.dtype} of shape {list(diag_index.shape)}")
