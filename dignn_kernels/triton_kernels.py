"""The ``triton`` backend: the dignn passes as Triton kernels, registered as ``torch.library``
custom ops in namespace ``torch.ops.dignn_triton``.

The functions here have the signatures and semantics of their compiled twins in
:mod:`dignn_kernels.ops` (math in ``csrc/dignn/laplacian_math.h``; kernels and their work
decomposition in :mod:`dignn_kernels._triton_jit`):

- :func:`neural_edge_weights` (differentiable in p, q), :func:`neural_diffusion_step`,
  :func:`diffusion_step`, :func:`adjoint_step`, :func:`csr_fma`, :func:`neural_weight_grad`,
- :func:`implicit_diffusion` (differentiable in x, chi, p, q; returns ``(z, stats)``) and its
  backward :func:`implicit_diffusion_backward`.

The solve loops launch their steps without waiting for the device: residual norms are reduced
on the device, a device flag records convergence and the steps after it only copy, and the
stats ``[iterations, residual, relative residual]`` stay on the device. The host reads the
flag only once every CHECK_EVERY (16) iterations, to stop launching a long solve that has
converged, and never while a CUDA graph is captured: a solve of up to 17 iterations (the
layer's default is 10) never syncs, and a solve can be captured in a CUDA graph (build the
graph's schedule once before capturing, as any warm-up does). Under ``torch.compile`` each op
is seen through its fake kernel.

Triton runs on CUDA tensors; on CPU tensors only under the Triton interpreter
(``TRITON_INTERPRET=1`` in the environment before this module first launches a kernel), which
is how the test suite exercises every kernel on machines without a GPU. :func:`available`
says whether the backend can run on a device.
"""
import importlib.util
import os
import sys
import weakref
from dataclasses import dataclass
from typing import Optional, Tuple

import torch
from torch import Tensor

from .graph import transpose_csr
from .ops import _check_graph, _file_backward_stats, backward_stats

__all__ = [
    "available", "interpreted", "neural_edge_weights", "neural_edge_weights_backward",
    "neural_diffusion_step", "diffusion_step", "adjoint_step", "csr_fma", "neural_weight_grad",
    "implicit_diffusion", "implicit_diffusion_backward", "backward_stats", "EDGE_CHUNK",
    "CHECK_EVERY",
]

name = "triton"

# Edges per work item: rows with more edges are split into items of EDGE_CHUNK edges whose
# partial sums are added in a fixed order (see _triton_jit). Read when a schedule is built.
EDGE_CHUNK = 64

# The solve loops never wait for the device within CHECK_EVERY iterations: the convergence
# test runs on the device, and the steps after it only copy. Every CHECK_EVERY iterations
# (not at all while a CUDA graph is captured; 0: never) the host reads the convergence flag
# once, so that a solve with a large max_iter that converges early stops launching steps.
CHECK_EVERY = 16

_TRUTHY = ("1", "true", "on", "yes", "y")


# ---------------------------------------------------------------- availability --

def _triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def _jit():
    """The kernel module, imported (and its kernels defined) on first use."""
    try:
        from . import _triton_jit
    except ImportError as err:
        raise RuntimeError(f"the triton backend needs the `triton` package ({err}); install it "
                           f"(`pip install triton`) or use backend='cuda', 'cpu' or 'torch'"
                           ) from None
    return _triton_jit


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


# ---------------------------------------------------------------- argument checks --
# The messages of csrc/ops/checks.h, so every backend names a bad argument the same way.

def _check_csr(rowptr: Tensor, col: Tensor, rowptr_name="rowptr", col_name="col") -> None:
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


def _check_values(t: Tensor, t_name: str, shape, like: Tensor, rowptr: Tensor) -> None:
    if list(t.shape) != list(shape):
        raise RuntimeError(f"{t_name} must have shape {list(shape)}, got {list(t.shape)}")
    if t.dtype != like.dtype:
        raise RuntimeError(f"{t_name} must have dtype {like.dtype} like the features, got "
                           f"{t.dtype}")
    if t.device != rowptr.device:
        raise RuntimeError(f"{t_name} is on {t.device} but the graph is on {rowptr.device}")


def _check_features(x: Tensor, x_name: str, n: int, rowptr: Tensor,
                    rowptr_name: str = "rowptr") -> None:
    if x.dim() != 2:
        raise RuntimeError(f"{x_name} must be 2-D (nodes x channels), got shape "
                           f"{list(x.shape)}")
    if x.shape[0] != n:
        raise RuntimeError(f"{rowptr_name} has {n} + 1 entries for {n} rows but {x_name} has "
                           f"{x.shape[0]} rows ({x_name} has {x.shape[0]} rows but the graph "
                           f"has {n} nodes): {rowptr_name} must hold num_nodes + 1 row offsets "
                           f"and {x_name} one row per node")
    if x.dtype not in (torch.float32, torch.float64):
        raise RuntimeError(f"{x_name} must be float32 or float64, got {x.dtype}; the layer "
                           f"computes float16/bfloat16 features in float32")
    if x.device != rowptr.device:
        raise RuntimeError(f"{x_name} is on {x.device} but the graph is on {rowptr.device}")


def _check_edge_values(rowptr, col, values, values_name, rowptr_name="rowptr",
                       col_name="col") -> int:
    _check_csr(rowptr, col, rowptr_name, col_name)
    if values.dim() != 1 or values.numel() != col.numel():
        raise RuntimeError(f"{values_name} must hold one value per edge ({col.numel()}), got "
                           f"shape {list(values.shape)}")
    _require_device(rowptr)
    return rowptr.numel() - 1


def _check_projections(p, q, like, n, rowptr) -> None:
    _check_features(p, "p", n, rowptr)
    _check_values(q, "q", p.shape, like, rowptr)
    _check_values(p, "p", q.shape, like, rowptr)


def _check_scalars(mu: float, eps: float) -> None:
    if not mu > 0.0:
        raise RuntimeError(f"mu must be > 0, got {mu}")
    if not eps > 0.0:
        raise RuntimeError(f"eps must be > 0, got {eps}")


def _check_transposed(t_rowptr, t_col, t_perm, rowptr, col) -> bool:
    given = [t is not None for t in (t_rowptr, t_col, t_perm)]
    if not any(given):
        return False
    if not all(given):
        raise RuntimeError("t_rowptr, t_col and t_perm go together: pass all three or none")
    _check_csr(t_rowptr, t_col, "t_rowptr", "t_col")
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


# -------------------------------------------------------------------- schedules --

@dataclass
class Schedule:
    """The work items of one CSR (see _triton_jit): items sorted by length, longest first;
    split rows with their scratch slots. Sizes are bounds known from n and m, so building it
    needs no host sync; padding items have row -1, padding split entries row -1."""
    item_row: Tensor  # int64 [num_items], -1 = padding
    item_start: Tensor  # int64 [num_items], first edge
    item_len: Tensor  # int32 [num_items], <= chunk
    item_slot: Tensor  # int64 [num_items], scratch slot, -1 = the item is the whole row
    num_items: int
    split_row: Tensor  # int64 [num_split], -1 = padding
    split_first: Tensor  # int64 [num_split], the row's first slot
    split_count: Tensor  # int64 [num_split], the row's number of slots
    num_split: int
    num_slots: int


def build_schedule(rowptr: Tensor, num_edges: int, chunk: int) -> Schedule:
    """Cuts every row into items of at most ``chunk`` edges (one item for an empty row) and
    sorts them by length, with device ops only."""
    n = rowptr.numel() - 1
    dev = rowptr.device
    deg = rowptr[1:] - rowptr[:-1]
    pieces = torch.clamp_min(torch.div(deg + (chunk - 1), chunk, rounding_mode="floor"), 1)
    # sum_i max(1, ceil(deg_i / chunk)) <= n + ceil(m / chunk): the padded item count.
    num_items = n + -(-num_edges // chunk)
    total = pieces.sum()
    first = torch.cumsum(pieces, 0) - pieces
    reps = torch.cat([pieces, (num_items - total).reshape(1)])
    owner = torch.repeat_interleave(torch.arange(n + 1, device=dev), reps,
                                    output_size=num_items)
    piece = torch.arange(num_items, device=dev) - torch.cat([first, total.reshape(1)])[owner]
    zero = deg.new_zeros(1)
    item_start = rowptr[owner] + piece * chunk
    item_len = (torch.cat([deg, zero])[owner] - piece * chunk).clamp(0, chunk)
    split = pieces > 1
    split_pieces = torch.where(split, pieces, 0)
    slot_base = torch.cumsum(split_pieces, 0) - split_pieces
    item_slot = torch.where(torch.cat([split, split.new_zeros(1)])[owner],
                            torch.cat([slot_base, zero])[owner] + piece, -1)
    item_row = torch.where(owner < n, owner, -1)
    order = torch.argsort(item_len, descending=True, stable=True)
    # at most m / (chunk + 1) rows have more than chunk edges; their slots number at most
    # sum (deg + chunk - 1) / chunk <= ceil(m / chunk) + that count
    num_split = min(n, num_edges // (chunk + 1))
    if num_split:
        by_split = torch.argsort(split.to(torch.int8), descending=True, stable=True)[:num_split]
        is_split = split[by_split]
        split_row = torch.where(is_split, by_split, -1)
        split_first = slot_base[by_split]
        split_count = torch.where(is_split, pieces[by_split], 0)
    else:
        split_row = split_first = split_count = deg.new_zeros(0)
    return Schedule(item_row=item_row[order].contiguous(),
                    item_start=item_start[order].contiguous(),
                    item_len=item_len[order].to(torch.int32).contiguous(),
                    item_slot=item_slot[order].contiguous(), num_items=num_items,
                    split_row=split_row.contiguous(), split_first=split_first.contiguous(),
                    split_count=split_count.contiguous(), num_split=num_split,
                    num_slots=-(-num_edges // chunk) + num_split)


def _capturing(t: Tensor) -> bool:
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


# Schedules of the CSR structures seen recently, keyed by the rowptr tensor (its identity and
# version): the layer's cached graphs keep theirs alive, so a static graph is scheduled once.
_SCHEDULES: "dict[tuple, tuple]" = {}


def schedule_for(rowptr: Tensor, num_edges: int) -> Schedule:
    chunk = int(EDGE_CHUNK)
    if chunk < 1:
        raise RuntimeError(f"EDGE_CHUNK must be >= 1, got {chunk}")
    key = (id(rowptr), chunk)
    entry = _SCHEDULES.get(key)
    if entry is not None:
        ref, version, m, sched = entry
        if ref() is rowptr and version == rowptr._version and m == num_edges:
            return sched
        del _SCHEDULES[key]
    sched = build_schedule(rowptr, num_edges, chunk)
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


def _flag(device: torch.device, value: int = 0) -> Tensor:
    return torch.full((1,), value, dtype=torch.int32, device=device)


def _row_coefficients(chi: Tensor, kappa: Tensor, mu: float) -> Tuple[Tensor, Tensor]:
    """(cy, ca) of laplacian_math.h row_coefficients: ca = 1/(mu chi), cy = -kappa ca, both 0
    on guarded rows (chi <= kChiFloor)."""
    diffuses = chi > _jit().CHI_FLOOR
    ca = torch.where(diffuses, (1.0 / mu) / torch.where(diffuses, chi, torch.ones_like(chi)),
                     torch.zeros_like(chi))
    return -kappa * ca, ca


def _row_sums(rowptr: Tensor, col: Tensor, values: Tensor) -> Tensor:
    """kappa_i = sum_j W_ij, by the row pass itself (W 1): deterministic, unlike index_add_."""
    n = rowptr.numel() - 1
    ones = values.new_ones(n, 1)
    zeros = values.new_zeros(n)
    out = values.new_empty(n, 1)
    _jit().csr_fma(schedule_for(rowptr, col.numel()), col, values, ones, values.new_zeros(n, 1),
                   zeros, values.new_ones(n), out, _flag(values.device))
    return out.view(n)


# ------------------------------------------------------------------ custom ops --
# Each op: the implementation (checks, then launches), then its fake kernel.

_LIB = "dignn_triton"


@torch.library.custom_op(f"{_LIB}::neural_edge_weights", mutates_args=())
def _neural_edge_weights(rowptr: Tensor, col: Tensor, a: Tensor, p: Tensor, q: Tensor,
                         eps: float) -> Tuple[Tensor, Tensor]:
    n = _check_edge_values(rowptr, col, a, "a")
    _check_projections(p, q, p, n, rowptr)
    _check_values(a, "a", [col.numel()], p, rowptr)
    if not eps > 0.0:
        raise RuntimeError(f"eps must be > 0, got {eps}")
    w = p.new_empty(col.numel())
    kappa = p.new_empty(n)
    if n:
        _jit().neural_step(schedule_for(rowptr, col.numel()), col.contiguous(), a.contiguous(),
                           p.contiguous(), q.contiguous(), _consts((1.0, eps), p.dtype,
                                                                   p.device),
                           p.new_zeros(n), None, None, w, kappa, None, None)
    return w, kappa


@_neural_edge_weights.register_fake
def _(rowptr, col, a, p, q, eps):
    return p.new_empty(col.shape[0]), p.new_empty(rowptr.shape[0] - 1)


def _edge_weights_backward_impl(rowptr, col, a, p, q, eps, grad_w, t_rowptr, t_col, t_perm):
    jit = _jit()
    n, h = p.shape
    grad_p = torch.empty_like(p, memory_format=torch.contiguous_format)
    grad_q = torch.empty_like(q, memory_format=torch.contiguous_format)
    if n == 0:
        return grad_p, grad_q
    consts = _consts((1.0, eps), p.dtype, p.device)
    pc, qc, ac, gw = p.contiguous(), q.contiguous(), a.contiguous(), grad_w.contiguous()
    jit.weight_grad(schedule_for(rowptr, col.numel()), col.contiguous(), ac, pc, qc, consts,
                    grad_p, grad_q, jit.GRAD_GIVEN, False, gw=gw)
    jit.weight_grad(schedule_for(t_rowptr, t_col.numel()), t_col.contiguous(), ac[t_perm], pc,
                    qc, consts, grad_p, grad_q, jit.GRAD_GIVEN, True, gw=gw[t_perm])
    return grad_p, grad_q


@torch.library.custom_op(f"{_LIB}::neural_edge_weights_backward", mutates_args=())
def _neural_edge_weights_backward(rowptr: Tensor, col: Tensor, a: Tensor, p: Tensor, q: Tensor,
                                  eps: float, grad_w: Tensor, t_rowptr: Tensor, t_col: Tensor,
                                  t_perm: Tensor) -> Tuple[Tensor, Tensor]:
    n = _check_edge_values(rowptr, col, a, "a")
    _check_projections(p, q, p, n, rowptr)
    _check_values(grad_w, "grad_w", [col.numel()], p, rowptr)
    _check_transposed(t_rowptr, t_col, t_perm, rowptr, col)
    return _edge_weights_backward_impl(rowptr, col, a, p, q, eps, grad_w, t_rowptr, t_col,
                                       t_perm)


@_neural_edge_weights_backward.register_fake
def _(rowptr, col, a, p, q, eps, grad_w, t_rowptr, t_col, t_perm):
    return torch.empty_like(p), torch.empty_like(q)


def _edge_weights_setup_context(ctx, inputs, output):
    rowptr, col, a, p, q, eps = inputs
    ctx.save_for_backward(rowptr, col, a, p, q)
    ctx.eps = eps


def _edge_weights_backward(ctx, grad_w, grad_kappa):
    rowptr, col, a, p, q = ctx.saved_tensors
    n = rowptr.shape[0] - 1
    g = grad_w if grad_w is not None else torch.zeros_like(a)
    if grad_kappa is not None:  # kappa_i = sum_k W_k over row i
        rows = torch.repeat_interleave(torch.arange(n, device=rowptr.device),
                                       rowptr[1:] - rowptr[:-1], output_size=col.shape[0])
        g = g + grad_kappa[rows]
    t_rowptr, t_col, t_perm = transpose_csr(rowptr, col, n)
    grad_p, grad_q = torch.ops.dignn_triton.neural_edge_weights_backward(
        rowptr, col, a, p, q, ctx.eps, g.contiguous(), t_rowptr, t_col, t_perm)
    return None, None, None, grad_p, grad_q, None


_neural_edge_weights.register_autograd(_edge_weights_backward,
                                       setup_context=_edge_weights_setup_context)


@torch.library.custom_op(f"{_LIB}::neural_diffusion_step", mutates_args=())
def _neural_diffusion_step(rowptr: Tensor, col: Tensor, a: Tensor, p: Tensor, q: Tensor,
                           chi: Tensor, x: Tensor, z: Tensor, mu: float,
                           eps: float) -> Tuple[Tensor, Tensor, Tensor]:
    n = _check_edge_values(rowptr, col, a, "a")
    _check_features(x, "x", n, rowptr)
    _check_values(z, "z", x.shape, x, rowptr)
    _check_projections(p, q, x, n, rowptr)
    _check_values(chi, "chi", [n], x, rowptr)
    _check_values(a, "a", [col.numel()], x, rowptr)
    _check_scalars(mu, eps)
    w = x.new_empty(col.numel())
    kappa = x.new_empty(n)
    z_next = torch.empty_like(x, memory_format=torch.contiguous_format)
    if n:
        _jit().neural_step(schedule_for(rowptr, col.numel()), col.contiguous(), a.contiguous(),
                           p.contiguous(), q.contiguous(),
                           _consts((1.0 / mu, eps), x.dtype, x.device), chi.contiguous(),
                           x.contiguous(), z.contiguous(), w, kappa, z_next, _flag(x.device))
    return z_next, w, kappa


@_neural_diffusion_step.register_fake
def _(rowptr, col, a, p, q, chi, x, z, mu, eps):
    return torch.empty_like(x), x.new_empty(col.shape[0]), x.new_empty(rowptr.shape[0] - 1)


def _fma(rowptr, col, w, y, b, cy, rs) -> Tensor:
    out = torch.empty_like(y, memory_format=torch.contiguous_format)
    if y.shape[0]:
        _jit().csr_fma(schedule_for(rowptr, col.numel()), col.contiguous(), w.contiguous(),
                       y.contiguous(), b.contiguous(), cy.contiguous(),
                       rs.contiguous() if rs is not None else None, out, _flag(y.device))
    return out


@torch.library.custom_op(f"{_LIB}::diffusion_step", mutates_args=())
def _diffusion_step(rowptr: Tensor, col: Tensor, w: Tensor, chi: Tensor, kappa: Tensor,
                    x: Tensor, z: Tensor, mu: float) -> Tensor:
    n = _check_edge_values(rowptr, col, w, "w")
    _check_features(x, "x", n, rowptr)
    _check_values(z, "z", x.shape, x, rowptr)
    _check_values(chi, "chi", [n], x, rowptr)
    _check_values(kappa, "kappa", [n], x, rowptr)
    _check_values(w, "w", [col.numel()], x, rowptr)
    _check_scalars(mu, 1.0)
    cy, ca = _row_coefficients(chi, kappa, mu)
    return _fma(rowptr, col, w, z, x, cy, ca)


@_diffusion_step.register_fake
def _(rowptr, col, w, chi, kappa, x, z, mu):
    return torch.empty_like(x)


@torch.library.custom_op(f"{_LIB}::adjoint_step", mutates_args=())
def _adjoint_step(t_rowptr: Tensor, t_col: Tensor, t_w: Tensor, chi: Tensor, kappa: Tensor,
                  g: Tensor, u: Tensor, mu: float) -> Tensor:
    n = _check_edge_values(t_rowptr, t_col, t_w, "t_w", "t_rowptr", "t_col")
    _check_features(g, "g", n, t_rowptr, "t_rowptr")
    _check_values(u, "u", g.shape, g, t_rowptr)
    _check_values(chi, "chi", [n], g, t_rowptr)
    _check_values(kappa, "kappa", [n], g, t_rowptr)
    _check_values(t_w, "t_w", [t_col.numel()], g, t_rowptr)
    _check_scalars(mu, 1.0)
    cy, ca = _row_coefficients(chi, kappa, mu)
    # entry (j, i) of W^T carries W_ij ca_i: u_j <- g_j + cy_j u_j + sum_i W_ij ca_i u_i
    return _fma(t_rowptr, t_col, t_w * ca[t_col.long()], u, g, cy, None)


@_adjoint_step.register_fake
def _(t_rowptr, t_col, t_w, chi, kappa, g, u, mu):
    return torch.empty_like(g)


@torch.library.custom_op(f"{_LIB}::csr_fma", mutates_args=())
def _csr_fma(rowptr: Tensor, col: Tensor, w: Tensor, y: Tensor, b: Tensor, cy: Tensor,
             rs: Tensor) -> Tensor:
    n = _check_edge_values(rowptr, col, w, "w")
    _check_features(y, "y", n, rowptr)
    _check_values(b, "b", y.shape, y, rowptr)
    _check_values(w, "w", [col.numel()], y, rowptr)
    _check_values(cy, "cy", [n], y, rowptr)
    _check_values(rs, "rs", [n], y, rowptr)
    return _fma(rowptr, col, w, y, b, cy, rs)


@_csr_fma.register_fake
def _(rowptr, col, w, y, b, cy, rs):
    return torch.empty_like(y)


def _weight_grad_impl(rowptr, col, a, p, q, z, v, eps, transposed):
    """dl/dp, dl/dq with G_ij = v_i . (z_j - z_i): one pass over the rows on a symmetric
    graph (transposed None), else the CSR's pass and the transposed CSR's pass, added."""
    jit = _jit()
    grad_p = torch.empty_like(p, memory_format=torch.contiguous_format)
    grad_q = torch.empty_like(q, memory_format=torch.contiguous_format)
    if p.shape[0] == 0:
        return grad_p, grad_q
    consts = _consts((1.0, eps), p.dtype, p.device)
    ac, pc, qc, zc, vc = (t.contiguous() for t in (a, p, q, z, v))
    sched = schedule_for(rowptr, col.numel())
    if transposed is None:
        jit.weight_grad(sched, col.contiguous(), ac, pc, qc, consts, grad_p, grad_q,
                        jit.GRAD_SYMMETRIC, False, z=zc, v=vc)
    else:
        t_rowptr, t_col, t_perm = transposed
        jit.weight_grad(sched, col.contiguous(), ac, pc, qc, consts, grad_p, grad_q,
                        jit.GRAD_OUT, False, z=zc, v=vc)
        jit.weight_grad(schedule_for(t_rowptr, t_col.numel()), t_col.contiguous(), ac[t_perm],
                        pc, qc, consts, grad_p, grad_q, jit.GRAD_IN, True, z=zc, v=vc)
    return grad_p, grad_q


@torch.library.custom_op(f"{_LIB}::neural_weight_grad", mutates_args=())
def _neural_weight_grad(rowptr: Tensor, col: Tensor, a: Tensor, p: Tensor, q: Tensor, z: Tensor,
                        v: Tensor, eps: float, t_rowptr: Optional[Tensor] = None,
                        t_col: Optional[Tensor] = None,
                        t_perm: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    n = _check_edge_values(rowptr, col, a, "a")
    _check_features(z, "z", n, rowptr)
    _check_values(v, "v", z.shape, z, rowptr)
    _check_projections(p, q, z, n, rowptr)
    _check_values(a, "a", [col.numel()], z, rowptr)
    directed = _check_transposed(t_rowptr, t_col, t_perm, rowptr, col)
    return _weight_grad_impl(rowptr, col, a, p, q, z, v, eps,
                             (t_rowptr, t_col, t_perm) if directed else None)


@_neural_weight_grad.register_fake
def _(rowptr, col, a, p, q, z, v, eps, t_rowptr=None, t_col=None, t_perm=None):
    return torch.empty_like(p), torch.empty_like(q)


# ------------------------------------------------------------------ the solves --

def _start_solve(x: Tensor, tol: float):
    """Iteration 1 from Z_0 = 0 gives Z_1 = X (eq. iter): stats [1, ||X||, 1 or 0] and the
    done flag (||X||^2 <= tol^2 ||X||^2), all on the device."""
    sq = torch.sum(x.square(), dtype=torch.float64)
    res = sq.sqrt()
    stats = torch.stack([torch.ones_like(res), res, (sq > 0).to(torch.float64)])
    done = (sq <= (tol * tol) * sq).to(torch.int32).reshape(1)
    return stats, done


class _Solve:
    """Row passes from y = start, ping-ponging two buffers; the device flag freezes the
    iterate once converged. :meth:`running` reads that flag on the host only every
    CHECK_EVERY steps (never while a CUDA graph is captured), so a long solve that converges
    early stops launching without a sync per iteration."""

    def __init__(self, start: Tensor, tol: float):
        self.y = start
        self.buf = torch.empty_like(start)
        self.stats, self.done = _start_solve(start, tol)
        self.tol_sq = _consts((tol * tol,), torch.float64, start.device)
        self.part = None
        self.steps = 0
        self.check_every = 0 if _capturing(start) else int(CHECK_EVERY)

    def step(self, launch) -> None:
        jit = _jit()
        self.part = launch(self.y, self.buf, self.done, self.part)
        jit.finish_step(self.part, self.stats, self.done, self.tol_sq)
        self.y, self.buf = self.buf, self.y
        self.steps += 1

    def running(self) -> bool:
        """False once the host has seen the flag set (read every check_every steps)."""
        if self.check_every <= 0 or self.steps == 0 or self.steps % self.check_every:
            return True
        return not bool(self.done)


def _implicit_diffusion_impl(rowptr, col, edge_value, x, chi, p, q, kappa, mu, eps, max_iter,
                             tol, t_rowptr, t_col, t_perm):
    n = _check_edge_values(rowptr, col, edge_value, "edge_value")
    _check_features(x, "x", n, rowptr)
    _check_transposed(t_rowptr, t_col, t_perm, rowptr, col)  # checked here, used by the backward
    _check_values(chi, "chi", [n], x, rowptr)
    _check_values(edge_value, "edge_value", [col.numel()], x, rowptr)
    _check_scalars(mu, eps)
    if max_iter < 1:
        raise RuntimeError(f"max_iter must be >= 1, got {max_iter}")
    if not tol >= 0.0:
        raise RuntimeError(f"tol must be >= 0, got {tol}")
    neural = p is not None or q is not None
    if neural and (p is None or q is None):
        raise RuntimeError("p and q go together: pass both (neural Laplacian) or neither")
    if neural and kappa is not None:
        raise RuntimeError("kappa is computed from the neural edge weights; pass it only for "
                           "fixed W")
    if neural:
        _check_projections(p, q, x, n, rowptr)
    elif kappa is not None:
        _check_values(kappa, "kappa", [n], x, rowptr)
    jit = _jit()
    xc = x.contiguous()
    solve = _Solve(xc.clone(), tol)
    if n == 0:
        return (solve.y, x.new_empty(col.numel()), x.new_empty(0), solve.stats)
    colc = col.contiguous()
    chic = chi.contiguous()
    sched = schedule_for(rowptr, col.numel())
    iters = 1
    if neural:
        w = x.new_empty(col.numel())
        kappa_out = x.new_empty(n)
        consts = _consts((1.0 / mu, eps), x.dtype, x.device)
        args = (sched, colc, edge_value.contiguous(), p.contiguous(), q.contiguous(), consts,
                chic)
        if max_iter >= 2:  # iteration 2: the fused pass makes W, kappa and the step together
            solve.step(lambda y, out, done, part: jit.neural_step(*args, xc, y, w, kappa_out,
                                                                  out, done))
            iters = 2
        else:  # stopped at iteration 1; the backward still needs W
            jit.neural_step(*args, None, None, w, kappa_out, None, None)
    else:
        w = edge_value.contiguous().clone()
        kappa_out = (kappa.contiguous().clone() if kappa is not None else
                     _row_sums(rowptr, colc, w))
    cy, ca = _row_coefficients(chic, kappa_out, mu)
    for _ in range(iters, max_iter):
        if not solve.running():
            break
        solve.step(lambda y, out, done, part: jit.csr_fma(sched, colc, w, y, xc, cy, ca, out,
                                                          done, part))
    return solve.y, w, kappa_out, solve.stats


@torch.library.custom_op(f"{_LIB}::implicit_diffusion", mutates_args=())
def _implicit_diffusion(rowptr: Tensor, col: Tensor, edge_value: Tensor, x: Tensor, chi: Tensor,
                        p: Optional[Tensor], q: Optional[Tensor], kappa: Optional[Tensor],
                        mu: float, eps: float, max_iter: int, tol: float,
                        t_rowptr: Optional[Tensor] = None, t_col: Optional[Tensor] = None,
                        t_perm: Optional[Tensor] = None
                        ) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    return _implicit_diffusion_impl(rowptr, col, edge_value, x, chi, p, q, kappa, mu, eps,
                                    max_iter, tol, t_rowptr, t_col, t_perm)


@_implicit_diffusion.register_fake
def _(rowptr, col, edge_value, x, chi, p, q, kappa, mu, eps, max_iter, tol, t_rowptr=None,
      t_col=None, t_perm=None):
    stats = torch.empty(3, dtype=torch.float64, device=x.device)
    return (torch.empty_like(x), x.new_empty(col.shape[0]), x.new_empty(rowptr.shape[0] - 1),
            stats)


def _implicit_backward_impl(rowptr, col, edge_value, w, kappa, t_rowptr, t_col, t_perm, x, chi,
                            p, q, z, grad_z, mu, eps, max_iter, tol):
    n = _check_edge_values(rowptr, col, edge_value, "edge_value")
    _check_features(x, "x", n, rowptr)
    _check_values(z, "z", x.shape, x, rowptr)
    _check_values(grad_z, "grad_z", x.shape, x, rowptr)
    _check_values(chi, "chi", [n], x, rowptr)
    _check_values(kappa, "kappa", [n], x, rowptr)
    _check_values(w, "w", [col.numel()], x, rowptr)
    _check_values(edge_value, "edge_value", [col.numel()], x, rowptr)
    _check_scalars(mu, eps)
    if max_iter < 1:
        raise RuntimeError(f"max_iter must be >= 1, got {max_iter}")
    neural = p is not None and q is not None
    directed = _check_transposed(t_rowptr, t_col, t_perm, rowptr, col)
    jit = _jit()
    g = grad_z.contiguous()
    solve = _Solve(g.clone(), tol)
    if n == 0:
        return (solve.y, torch.empty_like(chi), torch.empty_like(p) if neural else x.new_empty(0),
                torch.empty_like(q) if neural else x.new_empty(0), solve.stats)
    chic = chi.contiguous()
    cy, ca = _row_coefficients(chic, kappa.contiguous(), mu)
    # Adjoint u = g + cy.u + W^T (ca.u) from u_1 = g, on the transposed CSR (the CSR itself
    # on a symmetric graph) with entry (j, i) of W^T carrying W_ij ca_i.
    if directed:
        t_rp, t_cl, t_w = t_rowptr, t_col.contiguous(), w[t_perm]
    else:
        t_rp, t_cl, t_w = rowptr, col.contiguous(), w.contiguous()
    t_w = t_w * ca[t_cl.long()]
    t_sched = schedule_for(t_rp, t_cl.numel())
    for _ in range(1, max_iter):
        if not solve.running():
            break
        solve.step(lambda y, out, done, part: jit.csr_fma(t_sched, t_cl, t_w, y, g, cy, None,
                                                          out, done, part))
    u = solve.y
    # dl/dx = u; dl/dchi_i = u_i . (x_i - z_i) / chi_i = (u_i . (x_i - z_i)) ca_i mu
    grad_chi = (u * (x - z)).sum(1) * ca * mu
    if neural:
        _check_projections(p, q, x, n, rowptr)
        v = u * ca.unsqueeze(1)
        grad_p, grad_q = _weight_grad_impl(rowptr, col, edge_value, p, q, z, v, eps,
                                           (t_rowptr, t_col, t_perm) if directed else None)
    else:
        grad_p, grad_q = x.new_empty(0), x.new_empty(0)
    return u, grad_chi, grad_p, grad_q, solve.stats


@torch.library.custom_op(f"{_LIB}::implicit_diffusion_backward", mutates_args=())
def _implicit_diffusion_backward(rowptr: Tensor, col: Tensor, edge_value: Tensor, w: Tensor,
                                 kappa: Tensor, t_rowptr: Optional[Tensor],
                                 t_col: Optional[Tensor], t_perm: Optional[Tensor], x: Tensor,
                                 chi: Tensor, p: Optional[Tensor], q: Optional[Tensor],
                                 z: Tensor, grad_z: Tensor, mu: float, eps: float,
                                 max_iter: int, tol: float
                                 ) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    return _implicit_backward_impl(rowptr, col, edge_value, w, kappa, t_rowptr, t_col, t_perm,
                                   x, chi, p, q, z, grad_z, mu, eps, max_iter, tol)


@_implicit_diffusion_backward.register_fake
def _(rowptr, col, edge_value, w, kappa, t_rowptr, t_col, t_perm, x, chi, p, q, z, grad_z, mu,
      eps, max_iter, tol):
    grad_p = torch.empty_like(p) if p is not None else x.new_empty(0)
    grad_q = torch.empty_like(q) if q is not None else x.new_empty(0)
    return (torch.empty_like(x), torch.empty_like(chi), grad_p, grad_q,
            torch.empty(3, dtype=torch.float64, device=x.device))


def _implicit_setup_context(ctx, inputs, output):
    (rowptr, col, edge_value, x, chi, p, q, _kappa, mu, eps, max_iter, tol, t_rowptr, t_col,
     t_perm) = inputs
    z, w, kappa, stats = output
    ctx.mark_non_differentiable(w, kappa, stats)
    ctx.save_for_backward(rowptr, col, edge_value, w, kappa, t_rowptr, t_col, t_perm, x, chi, p,
                          q, z)
    ctx.solver = (mu, eps, max_iter, tol)
    ctx.stats_key = weakref.ref(stats) if type(stats) is torch.Tensor else None
    ctx.neural = p is not None


def _implicit_backward(ctx, grad_z, grad_w, grad_kappa, grad_stats):
    (rowptr, col, edge_value, w, kappa, t_rowptr, t_col, t_perm, x, chi, p, q,
     z) = ctx.saved_tensors
    mu, eps, max_iter, tol = ctx.solver
    grad_x, grad_chi, grad_p, grad_q, stats = torch.ops.dignn_triton.implicit_diffusion_backward(
        rowptr, col, edge_value, w, kappa, t_rowptr, t_col, t_perm, x, chi, p, q, z, grad_z, mu,
        eps, max_iter, tol)
    forward_stats = ctx.stats_key() if ctx.stats_key is not None else None
    if forward_stats is not None:
        _file_backward_stats(forward_stats, stats)
    if not ctx.neural:
        grad_p = grad_q = None
    return (None, None, None, grad_x, grad_chi, grad_p, grad_q) + (None,) * 8


_implicit_diffusion.register_autograd(_implicit_backward, setup_context=_implicit_setup_context)


# ------------------------------------------------------------ the Python face --
# Same signatures as dignn_kernels.ops, with the same data checks of the graph
# (dignn_kernels.ops.check_graph) unless trusted=True.

_ops = torch.ops.dignn_triton


def neural_edge_weights(rowptr: Tensor, col: Tensor, a: Tensor, p: Tensor, q: Tensor,
                        eps: float = 1e-6, *, trusted: bool = False) -> Tuple[Tensor, Tensor]:
    """Edge weights W = a tanh(1/(||q_i - q_j|| + eps)) tanh(|p_i . p_j|) (eq. 13-14) and
    their row sums kappa. Differentiable in p and q."""
    _check_graph(trusted, rowptr, col, p)
    return _ops.neural_edge_weights(rowptr, col, a, p, q, eps)


def neural_edge_weights_backward(rowptr, col, a, p, q, eps, grad_w, t_rowptr, t_col,
                                 t_perm, *, trusted: bool = False) -> Tuple[Tensor, Tensor]:
    """dl/dp and dl/dq from dl/dW."""
    _check_graph(trusted, rowptr, col, p, t_rowptr, t_col, t_perm)
    return _ops.neural_edge_weights_backward(rowptr, col, a, p, q, eps, grad_w, t_rowptr,
                                             t_col, t_perm)


def neural_diffusion_step(rowptr, col, a, p, q, chi, x, z, mu: float, eps: float = 1e-6, *,
                          trusted: bool = False) -> Tuple[Tensor, Tensor, Tensor]:
    """The fused forward pass: the neural edge weights and ``x - (1/mu) Delta z`` in one
    sweep. Returns (z_next, w, kappa)."""
    _check_graph(trusted, rowptr, col, x)
    return _ops.neural_diffusion_step(rowptr, col, a, p, q, chi, x, z, mu, eps)


def diffusion_step(rowptr, col, w, chi, kappa, x, z, mu: float, *,
                   trusted: bool = False) -> Tensor:
    """One forward iteration with cached weights: ``x - (1/mu) Delta z``."""
    _check_graph(trusted, rowptr, col, x)
    return _ops.diffusion_step(rowptr, col, w, chi, kappa, x, z, mu)


def adjoint_step(t_rowptr, t_col, t_w, chi, kappa, g, u, mu: float, *,
                 trusted: bool = False) -> Tensor:
    """One adjoint iteration ``g - (1/mu) Delta^T u`` on the CSR of W^T."""
    _check_graph(trusted, t_rowptr, t_col, g, transposed=True)
    return _ops.adjoint_step(t_rowptr, t_col, t_w, chi, kappa, g, u, mu)


def csr_fma(rowptr, col, w, y, b, cy, rs, *, trusted: bool = False) -> Tensor:
    """The row pass under every iteration: ``out = b + cy * y + rs * (W y)``."""
    _check_graph(trusted, rowptr, col, y)
    return _ops.csr_fma(rowptr, col, w, y, b, cy, rs)


def neural_weight_grad(rowptr, col, a, p, q, z, v, eps: float = 1e-6, t_rowptr=None,
                       t_col=None, t_perm=None, *, trusted: bool = False
                       ) -> Tuple[Tensor, Tensor]:
    """The fused gradient pass: dl/dp, dl/dq with dl/dW_ij = v_i . (z_j - z_i)."""
    _check_graph(trusted, rowptr, col, z, t_rowptr, t_col, t_perm)
    return _ops.neural_weight_grad(rowptr, col, a, p, q, z, v, eps, t_rowptr, t_col, t_perm)


def implicit_diffusion(rowptr: Tensor, col: Tensor, edge_value: Tensor, x: Tensor,
                       chi: Tensor, p: Optional[Tensor] = None, q: Optional[Tensor] = None,
                       kappa: Optional[Tensor] = None, *, mu: float, eps: float = 1e-6,
                       max_iter: int = 10, tol: float = 1e-6, t_rowptr=None, t_col=None,
                       t_perm=None, trusted: bool = False) -> Tuple[Tensor, Tensor]:
    """Solves Z = X - (1/mu) Delta Z by fixed-point iteration from Z_0 = 0 on the device, with
    no host sync (past the graph check, which trusted=True skips). Same contract as
    :func:`dignn_kernels.ops.implicit_diffusion`: returns ``(z, stats)``, stats on z's device;
    differentiable in x, chi, p and q."""
    _check_graph(trusted, rowptr, col, x, t_rowptr, t_col, t_perm)
    z, _, _, stats = _ops.implicit_diffusion(rowptr, col, edge_value, x, chi, p, q, kappa,
                                             float(mu), float(eps), int(max_iter), float(tol),
                                             t_rowptr, t_col, t_perm)
    return z, stats


def implicit_diffusion_backward(*args):
    return _ops.implicit_diffusion_backward(*args)

