"""The ``triton`` backend: the passes as Triton kernels (:mod:`._triton_jit`, math of
``csrc/dignn/laplacian_math.h``), registered as ``torch.library`` custom ops in namespace
``torch.ops.dignn_triton`` with fake kernels, so ``torch.compile`` traces them:

- ``neural_edge_weights`` (differentiable in p and q) and its backward;
- ``csr_fma``, the row pass;
- ``neural_weight_grad``, the gradient pass.

Their names are the compiled ops' (``torch.ops.dignn``), and the kernels' are theirs too.

The solvers of :mod:`dignn_kernels.solvers` run on these passes; the backend has no solve
loop of its own, but gives the solvers' fixed point a row step (:func:`_row_step`: the row
pass into a given buffer, nothing once the solve is done, then the sweep's bookkeeping from
the sums of its output in one small kernel), cg a row product (:func:`_row_product`: the
sweep w = A u with its dot products w.u in the same kernel) and the other sweeps a row map
(:func:`_row_map`: the row pass with the graph checked and scheduled once per solve), plain
functions that only the solves call.
Each op checks shapes, dtypes and devices with the shared checks of :mod:`dignn_kernels.checks`
(for direct callers of ``torch.ops.dignn_triton``); the graph's data are checked once at the
op boundary (:mod:`dignn_kernels.ops`, the solve entry).

Triton runs on CUDA tensors; on CPU tensors only under the Triton interpreter
(``TRITON_INTERPRET=1`` in the environment before this module first launches a kernel), which
is how the test suite exercises every kernel on machines without a GPU. :func:`available`
says whether the backend can run on a device.

16-bit storage (``storage_dtypes``): the row pass takes y (and b) in bfloat16 or float16 and
returns its output in y's dtype; the edge weights and the gradient pass take p, q (and z, v)
in 16 bits too. The edge values ``a``, the row coefficients and the weights stay in the
compute dtype (float32 or float64), which is that of w, kappa and the gradients; the kernels
widen every 16-bit load to it (see :mod:`._triton_jit`).
"""
import importlib
import importlib.util
import os
import sys
import weakref
from dataclasses import dataclass
from typing import Callable, Optional, Tuple

import torch
from torch import Tensor

from ..checks import (check_compute_dtype, check_csr_fma_args, check_edge_values,
                      check_features, check_neural_edge_weights_args,
                      check_neural_edge_weights_backward_args, check_neural_weight_grad_args,
                      check_same_device, check_values)
from .interface import FIXED_POINT_STATE, FP_DONE, ROW_STEP_SUMS, STORAGE_DTYPES, Backend
from .registration import register_edge_weights_autograd, run_without_autocast
from .schedule import TRITON_SEGMENT_EDGES

__all__ = ["TRITON", "available", "interpreted", "build_schedule", "schedule_for",
           "SEGMENT_EDGES"]

# Edges per segment (see .schedule); read when a schedule is built, so a test may lower it to
# exercise heavy rows on small graphs.
SEGMENT_EDGES = TRITON_SEGMENT_EDGES

_TRUTHY = ("1", "true", "on", "yes", "y")


# ---------------------------------------------------------------- availability --

# Looked up once: torch.compile traces available() inside the layer's forward, and Dynamo of
# torch 2.11 (the GPU machine's) refuses to trace importlib.util.find_spec: a graph break, an
# error under fullgraph=True (torch 2.14.1 traces it).
_TRITON_INSTALLED = importlib.util.find_spec("triton") is not None


def _triton_installed() -> bool:
    return _TRITON_INSTALLED


def _jit():
    """The kernel module, imported (and its kernels defined) on first use."""
    try:
        jit = importlib.import_module(f"{__package__}._triton_jit")
    except ImportError as err:
        raise RuntimeError(f"the triton backend needs the `triton` package ({err}); install it "
                           f"(`pip install triton`) or use backend='cuda', 'cpu' or 'torch'"
                           ) from None
    return jit


def interpreted() -> bool:
    """Whether the kernels run in the Triton interpreter (TRITON_INTERPRET=1 when they were
    defined; before that, whether it is set now)."""
    mod = sys.modules.get(__package__ + "._triton_jit")
    if mod is not None:
        return mod.INTERPRETED
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in _TRUTHY


def available(device=None) -> bool:
    """True when the Triton kernels can run on ``device`` (default: the current CUDA device):
    on CUDA when a GPU and the ``triton`` package are present, on the CPU only under the
    Triton interpreter (TRITON_INTERPRET=1)."""
    device = torch.device("cuda" if device is None else device)
    if not _triton_installed():
        return False
    if device.type == "cuda":
        return torch.cuda.is_available()
    if device.type == "cpu":
        return interpreted()
    return False


def _require_device(t: Tensor) -> None:
    if t.device.type == "cuda":
        if torch.cuda.is_available():
            return
    elif t.device.type == "cpu" and interpreted():
        return
    raise RuntimeError(
        f"the triton backend cannot run on {t.device}: Triton kernels run on CUDA tensors, and "
        f"on CPU tensors only in the Triton interpreter (set TRITON_INTERPRET=1 before the "
        f"kernels are first used). Use backend='cpu' or 'torch' on this device.")


def _checked_graph(rowptr: Tensor, col: Tensor, values: Tensor, values_name: str) -> int:
    """The shared CSR checks, then the device check; returns the number of nodes."""
    n = check_edge_values(rowptr, col, values, values_name)
    _require_device(rowptr)
    return n


# -------------------------------------------------------------------- schedules --

@dataclass
class Schedule:
    """The segments of one CSR (see _triton_jit), sorted by length, longest first, and its
    heavy rows with their scratch slots. Sizes are bounds known from n and m, so building it
    needs no host sync; padding segments and padding heavy-row entries have row -1."""
    segment_row: Tensor  # int64 [num_segments], -1 = padding
    segment_start: Tensor  # int64 [num_segments], first edge
    segment_len: Tensor  # int32 [num_segments], <= segment_edges
    segment_slot: Tensor  # int64 [num_segments], scratch slot, -1: the segment is the row
    num_segments: int
    heavy_row: Tensor  # int64 [num_heavy], -1 = padding
    heavy_first: Tensor  # int64 [num_heavy], the row's first slot
    heavy_count: Tensor  # int64 [num_heavy], the row's number of slots
    num_heavy: int
    num_slots: int

    def segment_args(self) -> tuple:
        """The segment arrays and count, in the order the kernels take them."""
        return (self.segment_row, self.segment_start, self.segment_len, self.segment_slot,
                self.num_segments)


def build_schedule(rowptr: Tensor, num_edges: int, length: int) -> Schedule:
    """Cuts every row into segments of at most ``length`` edges (one segment for an empty
    row) and sorts them by length, with device ops only."""
    n = rowptr.numel() - 1
    dev = rowptr.device
    deg = rowptr[1:] - rowptr[:-1]
    pieces = torch.clamp_min(torch.div(deg + (length - 1), length, rounding_mode="floor"), 1)
    # sum_i max(1, ceil(deg_i / length)) <= n + ceil(m / length): the padded count.
    num_segments = n + -(-num_edges // length)
    total = pieces.sum()
    first = torch.cumsum(pieces, 0) - pieces
    reps = torch.cat([pieces, (num_segments - total).reshape(1)])
    owner = torch.repeat_interleave(torch.arange(n + 1, device=dev), reps,
                                    output_size=num_segments)
    piece = torch.arange(num_segments, device=dev) - torch.cat([first, total.reshape(1)])[owner]
    zero = deg.new_zeros(1)
    segment_start = rowptr[owner] + piece * length
    segment_len = (torch.cat([deg, zero])[owner] - piece * length).clamp(0, length)
    split = pieces > 1
    split_pieces = torch.where(split, pieces, 0)
    slot_base = torch.cumsum(split_pieces, 0) - split_pieces
    segment_slot = torch.where(torch.cat([split, split.new_zeros(1)])[owner],
                            torch.cat([slot_base, zero])[owner] + piece, -1)
    segment_row = torch.where(owner < n, owner, -1)
    order = torch.argsort(segment_len, descending=True, stable=True)
    # at most m / (length + 1) rows have more than length edges; their slots number at most
    # sum (deg + length - 1) / length <= ceil(m / length) + that count
    num_heavy = min(n, num_edges // (length + 1))
    if num_heavy:
        by_split = torch.argsort(split.to(torch.int8), descending=True, stable=True)[:num_heavy]
        is_split = split[by_split]
        heavy_row = torch.where(is_split, by_split, -1)
        heavy_first = slot_base[by_split]
        heavy_count = torch.where(is_split, pieces[by_split], 0)
    else:
        heavy_row = heavy_first = heavy_count = deg.new_zeros(0)
    return Schedule(segment_row=segment_row[order].contiguous(),
                    segment_start=segment_start[order].contiguous(),
                    segment_len=segment_len[order].to(torch.int32).contiguous(),
                    segment_slot=segment_slot[order].contiguous(), num_segments=num_segments,
                    heavy_row=heavy_row.contiguous(), heavy_first=heavy_first.contiguous(),
                    heavy_count=heavy_count.contiguous(), num_heavy=num_heavy,
                    num_slots=-(-num_edges // length) + num_heavy)


def _capturing(t: Tensor) -> bool:
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


# Schedules of the CSR structures seen recently, keyed by the rowptr tensor (its identity and
# version): the layer's cached graphs keep theirs alive, so a static graph is scheduled once.
_SCHEDULES: "dict[tuple, tuple]" = {}


def schedule_for(rowptr: Tensor, num_edges: int) -> Schedule:
    segment_edges = int(SEGMENT_EDGES)
    if segment_edges < 1:
        raise RuntimeError(f"SEGMENT_EDGES must be >= 1, got {segment_edges}")
    key = (id(rowptr), segment_edges)
    entry = _SCHEDULES.get(key)
    if entry is not None:
        ref, version, m, sched = entry
        if ref() is rowptr and version == rowptr._version and m == num_edges:
            return sched
        del _SCHEDULES[key]
    sched = build_schedule(rowptr, num_edges, segment_edges)
    # Tensors made while a CUDA graph is captured hold values only during its replays.
    if not _capturing(rowptr):
        try:
            ref = weakref.ref(rowptr, lambda _, k=key: _SCHEDULES.pop(k, None))
        except TypeError:
            return sched
        _SCHEDULES[key] = (ref, rowptr._version, num_edges, sched)
    return sched


_CONSTS: "dict[tuple, Tensor]" = {}


def _consts(values: Tuple[float, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
    """A small device tensor of scalars for the kernels (Triton passes Python floats as
    float32; these keep float64 exact). Filled on the device, so it is safe to make while a
    CUDA graph is captured (and then not cached)."""
    key = (values, dtype, device)
    t = _CONSTS.get(key)
    if t is None:
        t = torch.empty(len(values), dtype=dtype, device=device)
        for i, v in enumerate(values):
            t[i].fill_(v)
        if not (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
            if len(_CONSTS) > 64:
                _CONSTS.clear()
            _CONSTS[key] = t
    return t


# ------------------------------------------------------------------ custom ops --
# Each op: the implementation (checks, then launches), then its fake kernel.

_LIB = "dignn_triton"


def _one_device(op: str, **tensors) -> None:
    """The fake kernels' check (see dignn_kernels/ops.py): one meta tensor among real ones
    makes the dispatcher pick the fake kernel, whose empty outputs would be the results."""
    check_same_device(f"{_LIB}::{op}", **tensors)


@torch.library.custom_op(f"{_LIB}::neural_edge_weights", mutates_args=())
def _neural_edge_weights(rowptr: Tensor, col: Tensor, a: Tensor, p: Tensor, q: Tensor,
                         eps: float) -> Tuple[Tensor, Tensor]:
    n = check_neural_edge_weights_args(rowptr, col, a, p, q, eps)  # the compiled op's checks
    _require_device(rowptr)
    w = a.new_empty(col.numel())
    kappa = a.new_empty(n)
    if n:
        _jit().neural_edge_weights(schedule_for(rowptr, col.numel()), col.contiguous(),
                                   a.contiguous(), p.contiguous(), q.contiguous(),
                                   _consts((eps,), a.dtype, a.device), w, kappa)
    return w, kappa


@_neural_edge_weights.register_fake
def _(rowptr, col, a, p, q, eps):
    _one_device("neural_edge_weights", rowptr=rowptr, col=col, a=a, p=p, q=q)
    return a.new_empty(col.shape[0]), a.new_empty(rowptr.shape[0] - 1)


def _edge_weights_backward_impl(rowptr, col, a, p, q, eps, grad_w, t_rowptr, t_col, t_perm):
    jit = _jit()
    n, h = p.shape
    grad_p = torch.empty_like(p, memory_format=torch.contiguous_format)
    grad_q = torch.empty_like(q, memory_format=torch.contiguous_format)
    if n == 0:
        return grad_p, grad_q
    consts = _consts((eps,), p.dtype, p.device)
    pc, qc, ac, gw = p.contiguous(), q.contiguous(), a.contiguous(), grad_w.contiguous()
    jit.neural_weight_grad(schedule_for(rowptr, col.numel()), col.contiguous(), ac, pc, qc,
                           consts, grad_p, grad_q, jit.GRAD_GIVEN, False, gw=gw)
    jit.neural_weight_grad(schedule_for(t_rowptr, t_col.numel()), t_col.contiguous(),
                           ac[t_perm], pc, qc, consts, grad_p, grad_q, jit.GRAD_GIVEN, True,
                           gw=gw[t_perm])
    return grad_p, grad_q


@torch.library.custom_op(f"{_LIB}::neural_edge_weights_backward", mutates_args=())
def _neural_edge_weights_backward(rowptr: Tensor, col: Tensor, a: Tensor, p: Tensor, q: Tensor,
                                  eps: float, grad_w: Tensor, t_rowptr: Tensor, t_col: Tensor,
                                  t_perm: Tensor) -> Tuple[Tensor, Tensor]:
    check_neural_edge_weights_backward_args(rowptr, col, a, p, q, eps, grad_w, t_rowptr, t_col,
                                            t_perm)
    _require_device(rowptr)
    return _edge_weights_backward_impl(rowptr, col, a, p, q, eps, grad_w, t_rowptr, t_col,
                                       t_perm)


@_neural_edge_weights_backward.register_fake
def _(rowptr, col, a, p, q, eps, grad_w, t_rowptr, t_col, t_perm):
    _one_device("neural_edge_weights_backward", rowptr=rowptr, col=col, a=a, p=p, q=q,
                grad_w=grad_w, t_rowptr=t_rowptr, t_col=t_col, t_perm=t_perm)
    return torch.empty_like(p), torch.empty_like(q)


register_edge_weights_autograd(f"{_LIB}::neural_edge_weights",
                               _neural_edge_weights_backward)


@torch.library.custom_op(f"{_LIB}::csr_fma", mutates_args=())
def _csr_fma(rowptr: Tensor, col: Tensor, w: Tensor, y: Tensor, b: Tensor, cy: Tensor,
             rs: Tensor) -> Tensor:
    check_csr_fma_args(rowptr, col, w, y, b, cy, rs)  # the compiled op's checks
    _require_device(rowptr)
    out = torch.empty_like(y, memory_format=torch.contiguous_format)
    if y.shape[0]:  # the plain pass: no done flag, no sums (compiled out of the kernel)
        _jit().csr_fma(schedule_for(rowptr, col.numel()), col.contiguous(), w.contiguous(),
                       y.contiguous(), b.contiguous(), cy.contiguous(), rs.contiguous(), out)
    return out


@_csr_fma.register_fake
def _(rowptr, col, w, y, b, cy, rs):
    _one_device("csr_fma", rowptr=rowptr, col=col, w=w, y=y, b=b, cy=cy, rs=rs)
    return torch.empty_like(y)


def _prepared_coefficients(rowptr: Tensor, col: Tensor, w: Tensor, cy: Tensor, rs: Tensor
                           ) -> tuple:
    """(n, schedule, col, w, cy, rs) of a row pass prepared for a solve (the row map's and
    the row product's): the graph, its weights (float32 or float64) and the row coefficients
    checked once, made contiguous, and the CSR scheduled (None without nodes)."""
    n = _checked_graph(rowptr, col, w, "w")
    check_compute_dtype(w, "w")
    check_values(cy, "cy", [n], w, rowptr)
    check_values(rs, "rs", [n], w, rowptr)
    sched = schedule_for(rowptr, col.numel()) if n else None
    return (n, sched) + tuple(t.contiguous() for t in (col, w, cy, rs))


def _row_map(rowptr: Tensor, col: Tensor, w: Tensor, cy: Tensor, rs: Tensor
             ) -> Callable[[Tensor, Tensor], Tensor]:
    """The row pass b + cy.y + rs.(W y) of one graph and its coefficients prepared for a solve
    (see :class:`~dignn_kernels.backends.interface.RowMap`): the graph, weights and
    coefficients checked, made contiguous and scheduled once, so a sweep (anderson's, a
    partitioned solve's) costs the checks of y and b and the row kernels' launches, where
    the ``csr_fma`` op checks the graph, looks its schedule up and goes through the
    dispatcher on every call. Its output is the op's, bit for bit; with ``out_dtype`` w's
    dtype from 16-bit y (a 16-bit fixed point's wide last iteration) the kernel reads y in 16
    bits and writes the compute dtype, the op's output on y widened, bit for bit."""
    n, sched, col, w, cy, rs = _prepared_coefficients(rowptr, col, w, cy, rs)
    jit = _jit()

    def row_map(y: Tensor, b: Tensor, out_dtype: Optional[torch.dtype] = None) -> Tensor:
        check_features(y, "y", n, rowptr, storage_ok=True)
        check_values(y, "y", y.shape, w, rowptr, storage_ok=True)  # w's dtype, or 16 bits
        check_values(b, "b", y.shape, w, rowptr, storage_ok=True)
        if out_dtype not in (None, y.dtype, w.dtype):
            raise ValueError(f"out_dtype must be y's dtype {y.dtype} or w's {w.dtype} (the "
                             f"compute dtype), got {out_dtype}")
        out = torch.empty_like(y, dtype=out_dtype, memory_format=torch.contiguous_format)
        if n:
            jit.csr_fma(sched, col, w, y.contiguous(), b.contiguous(), cy, rs, out)
        return out

    return row_map


def _row_step(rowptr: Tensor, col: Tensor, w: Tensor, b: Tensor, cy: Tensor, rs: Tensor,
              c: Tensor) -> Callable[[Tensor, Tensor, Tensor, Tensor, int], None]:
    """The row step of one fixed-point map (see :class:`~dignn_kernels.backends.interface.
    RowStep`): the graph, weights, coefficients and schedule checked and prepared once per
    solve, so a sweep costs the row pass's launch, a sum of its partial sums and one launch of
    the loop's bookkeeping (no dispatcher op: it runs inside the solve's op, below its one
    autograd registration)."""
    n = _checked_graph(rowptr, col, w, "w")
    check_features(b, "b", n, rowptr)
    check_values(w, "w", [col.numel()], b, rowptr)
    for t, name in ((cy, "cy"), (rs, "rs"), (c, "c")):
        check_values(t, name, [n], b, rowptr)
    sched = schedule_for(rowptr, col.numel()) if n else None
    jit = _jit()
    col, w, b, cy, rs, c = (t.contiguous() for t in (col, w, b, cy, rs, c))
    dtypes = (b.dtype,) + STORAGE_DTYPES

    def step(y: Tensor, out: Tensor, state: Tensor, history: Tensor, k: int) -> None:
        if y.shape != b.shape or y.dtype not in dtypes or y.device != b.device:
            raise RuntimeError(f"y must have b's shape {list(b.shape)} and device {b.device} "
                               f"and dtype {b.dtype} or a 16-bit storage dtype, got "
                               f"{list(y.shape)}, {y.device}, {y.dtype}")
        _check_out(y, out)
        for t, name, size in ((state, "state", FIXED_POINT_STATE), (history, "history", k)):
            if t.dtype != torch.float64 or t.dim() != 1 or t.numel() < size or \
                    t.device != y.device or not t.is_contiguous():
                raise RuntimeError(f"{name} must be a contiguous 1-D float64 tensor of at least "
                                   f"{size} entries on {y.device} (the fixed point's state "
                                   f"and history, dignn_kernels.solvers.fixed_point), got "
                                   f"{t.dtype} of shape {list(t.shape)} on {t.device}")
        if n:  # the row kernels read the state's first element, FP_DONE, as their done flag
            part = jit.csr_fma(sched, col, w, y, b, cy, rs, out, done=state[FP_DONE:], c=c,
                               sums=jit.SUMS_NORMS)
            sums = part.view(-1, ROW_STEP_SUMS).sum(dim=0)
        else:
            sums = state.new_zeros(ROW_STEP_SUMS)
        jit.fixed_point_update(sums, state, history, k)

    return step


def _check_out(y: Tensor, out: Tensor) -> None:
    """The output buffer of a prepared sweep: like y, contiguous, and not y itself (empty
    tensors aside: they may share an address and hold nothing)."""
    if out.shape != y.shape or out.dtype != y.dtype or out.device != y.device or \
            not (out.is_contiguous() and y.is_contiguous()):
        raise RuntimeError(f"out must be a contiguous buffer like y ({list(y.shape)}, "
                           f"{y.dtype}, {y.device}; y contiguous too), got "
                           f"{list(out.shape)}, {out.dtype}, {out.device}: pass "
                           f"torch.empty_like(y)")
    if y.numel() and out.data_ptr() == y.data_ptr():
        raise RuntimeError("out must not be y: the sweep reads y's neighbour rows while it "
                           "writes out; pass a second buffer")


def _row_product(rowptr: Tensor, col: Tensor, w: Tensor, cy: Tensor, rs: Tensor
                 ) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
    """The row product cy.y + rs.(W y) with its per-channel dots out.y (see :class:`~dignn_
    kernels.backends.interface.RowProduct`), prepared once per solve: a cg sweep costs the
    row pass's launch (no right-hand side read; the dots in its epilogue instead of a
    second pass over w and u) and a sum of its partial dots."""
    n, sched, col, w, cy, rs = _prepared_coefficients(rowptr, col, w, cy, rs)
    jit = _jit()

    def product(y: Tensor, out: Tensor, done: Tensor) -> Tensor:
        if y.dim() != 2 or y.shape[0] != n or y.dtype != w.dtype or y.device != w.device:
            raise RuntimeError(f"y must be a [{n}, d] tensor of w's dtype {w.dtype} on "
                               f"{w.device}, got {list(y.shape)}, {y.dtype}, {y.device}")
        _check_out(y, out)
        if done.numel() < 1 or done.device != y.device:
            raise RuntimeError(f"done must be a flag tensor on {y.device} (its first element "
                               f"nonzero once the solve is done), got {list(done.shape)} on "
                               f"{done.device}")
        if not (n and y.shape[1]):
            return y.new_zeros(y.shape[1])
        return jit.csr_fma(sched, col, w, y, None, cy, rs, out, done=done,
                           sums=jit.SUMS_DOTS).sum(dim=0)

    return product


def _neural_weight_grad_impl(rowptr, col, a, p, q, z, v, eps, transposed):
    """dl/dp, dl/dq with G_ij = v_i . (z_j - z_i): one pass over the rows on a symmetric
    graph (transposed None), else the CSR's pass and the transposed CSR's pass, added. The
    gradients have a's dtype (the compute dtype, also for 16-bit p, q, z, v)."""
    jit = _jit()
    grad_p = p.new_empty(p.shape, dtype=a.dtype)
    grad_q = q.new_empty(q.shape, dtype=a.dtype)
    if p.shape[0] == 0:
        return grad_p, grad_q
    consts = _consts((eps,), a.dtype, p.device)
    ac, pc, qc, zc, vc = (t.contiguous() for t in (a, p, q, z, v))
    sched = schedule_for(rowptr, col.numel())
    if transposed is None:
        jit.neural_weight_grad(sched, col.contiguous(), ac, pc, qc, consts, grad_p, grad_q,
                               jit.GRAD_SYMMETRIC, False, z=zc, v=vc)
    else:
        t_rowptr, t_col, t_perm = transposed
        jit.neural_weight_grad(sched, col.contiguous(), ac, pc, qc, consts, grad_p, grad_q,
                               jit.GRAD_OUT, False, z=zc, v=vc)
        jit.neural_weight_grad(schedule_for(t_rowptr, t_col.numel()), t_col.contiguous(),
                               ac[t_perm], pc, qc, consts, grad_p, grad_q, jit.GRAD_IN, True,
                               z=zc, v=vc)
    return grad_p, grad_q


@torch.library.custom_op(f"{_LIB}::neural_weight_grad", mutates_args=())
def _neural_weight_grad(rowptr: Tensor, col: Tensor, a: Tensor, p: Tensor, q: Tensor, z: Tensor,
                        v: Tensor, eps: float, t_rowptr: Optional[Tensor] = None,
                        t_col: Optional[Tensor] = None,
                        t_perm: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    # the compiled op's checks (a 16-bit z: a and the gradients in the compute dtype)
    directed = check_neural_weight_grad_args(rowptr, col, a, p, q, z, v, eps, t_rowptr, t_col,
                                             t_perm)
    _require_device(rowptr)
    return _neural_weight_grad_impl(rowptr, col, a, p, q, z, v, eps,
                             (t_rowptr, t_col, t_perm) if directed else None)


@_neural_weight_grad.register_fake
def _(rowptr, col, a, p, q, z, v, eps, t_rowptr=None, t_col=None, t_perm=None):
    _one_device("neural_weight_grad", rowptr=rowptr, col=col, a=a, p=p, q=q, z=z, v=v,
                t_rowptr=t_rowptr, t_col=t_col, t_perm=t_perm)
    return p.new_empty(p.shape, dtype=a.dtype), q.new_empty(q.shape, dtype=a.dtype)


_ops = torch.ops.dignn_triton

for _name in ("neural_edge_weights", "neural_edge_weights_backward", "csr_fma",
              "neural_weight_grad"):
    run_without_autocast(f"{_LIB}::{_name}")

TRITON = Backend(name="triton", available=available,
                 neural_edge_weights=_ops.neural_edge_weights, csr_fma=_ops.csr_fma,
                 neural_weight_grad=_ops.neural_weight_grad, row_map=_row_map,
                 row_step=_row_step, row_product=_row_product, storage_dtypes=STORAGE_DTYPES,
                 vector_kernels="triton")
