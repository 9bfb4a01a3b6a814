"""The whole Python face of the C++/CUDA operators in namespace ``torch.ops.dignn``.

Each function here calls one registered op; this module adds the fake (meta) kernels that let
``torch.compile`` trace them and the autograd formulas of the two differentiable ones
(``implicit_diffusion`` and ``neural_edge_weights``). The math of every op is written out in
``csrc/dignn/laplacian_math.h``.

Graph arguments are CSR: ``rowptr`` (int64, n + 1), ``col`` (int32 or int64, m) and per-edge
values. ``t_rowptr, t_col, t_perm`` are the transposed CSR and, for each of its entries, the
position of the same edge in the CSR; pass them for graphs whose edge values are not
symmetric (:meth:`dignn_kernels.graph.CSRGraph.transposed` makes them).

Every function that takes a CSR first runs :func:`check_graph` on it, an O(nodes + edges)
pass that proves the kernels will not index out of bounds (rowptr starts at 0, never
decreases and ends at the number of edges; every column is a node index; ``t_perm`` is a
permutation). Callers that built the CSR themselves (:mod:`dignn_kernels.graph`, whose graphs
are valid by construction; the layer and the solvers) pass ``trusted=True`` to skip it. The
ops check shapes, dtypes and devices always (csrc/ops/checks.h). Bad graphs raise RuntimeError
naming the argument, on every backend.
"""
import math
import re
import weakref
from typing import Optional, Tuple

import torch
from torch import Tensor

__all__ = [
    "neural_edge_weights", "neural_edge_weights_backward", "diffusion_step", "csr_fma",
    "neural_weight_grad", "implicit_diffusion", "implicit_diffusion_backward", "backward_stats",
    "check_graph",
]

_ops = torch.ops.dignn


def _check_scalars(mu=None, eps=None, max_iter=None, tol=None) -> None:
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
    _ops.check_graph(rowptr, col, num_nodes, t_rowptr, t_col, t_perm)


_CSR_NAMES = re.compile(r"(?<![\w])(rowptr|col)(?![\w])")


def _check_graph(trusted: bool, rowptr, col, nodes, t_rowptr=None, t_col=None, t_perm=None, *,
                 transposed: bool = False) -> None:
    """:func:`check_graph` for an op whose node signal (n x d) is ``nodes``, unless the caller
    vouches for the graph (``trusted``) or torch.compile traces (the graph's values are not
    known then). Shared by every backend's Python face (this module, triton_kernels,
    torch_passes, the solvers). When rowptr's length does not match ``nodes`` the data are not
    checked: the op's own shape check then names rowptr and the node signal. ``transposed``:
    the op's CSR is the arguments t_rowptr, t_col (adjoint_step), so messages name those."""
    if trusted or torch.compiler.is_compiling():
        return
    if not (isinstance(rowptr, Tensor) and isinstance(nodes, Tensor) and rowptr.dim() == 1
            and nodes.dim() >= 1 and rowptr.shape[0] == nodes.shape[0] + 1):
        return
    try:
        check_graph(rowptr, col, nodes.shape[0], t_rowptr, t_col, t_perm)
    except RuntimeError as err:
        if not transposed:
            raise
        raise RuntimeError(_CSR_NAMES.sub(r"t_\1", str(err))) from None


def neural_edge_weights(rowptr: Tensor, col: Tensor, a: Tensor, p: Tensor, q: Tensor,
                        eps: float = 1e-6, *, trusted: bool = False) -> Tuple[Tensor, Tensor]:
    """Edge weights W = a tanh(1/(||q_i - q_j|| + eps)) tanh(|p_i . p_j|) (eq. 13-14) and
    their row sums kappa. Differentiable in p and q."""
    _check_scalars(eps=eps)
    _check_graph(trusted, rowptr, col, p)
    return _ops.neural_edge_weights(rowptr, col, a, p, q, eps)


def neural_edge_weights_backward(rowptr, col, a, p, q, eps, grad_w, t_rowptr, t_col,
                                 t_perm, *, trusted: bool = False) -> Tuple[Tensor, Tensor]:
    """dl/dp and dl/dq from dl/dW."""
    _check_graph(trusted, rowptr, col, p, t_rowptr, t_col, t_perm)
    return _ops.neural_edge_weights_backward(rowptr, col, a, p, q, eps, grad_w, t_rowptr,
                                             t_col, t_perm)


def diffusion_step(rowptr, col, w, chi, kappa, x, z, mu: float, *,
                   trusted: bool = False) -> Tensor:
    """One forward iteration with cached weights: ``x - (1/mu) Delta z``,
    Delta z = (kappa z - W z) / chi (rows with chi = 0 keep x)."""
    _check_scalars(mu=mu)
    _check_graph(trusted, rowptr, col, x)
    return _ops.diffusion_step(rowptr, col, w, chi, kappa, x, z, mu)


def csr_fma(rowptr, col, w, y, b, cy, rs, *, trusted: bool = False) -> Tensor:
    """The row pass under every iteration: ``out = b + cy * y + rs * (W y)`` with per-row
    ``cy`` and ``rs`` (n). With b = x, cy = -kappa/(mu chi), rs = 1/(mu chi) it is the forward
    step; on the CSR of W^T with weights W_ij rs_i, the adjoint step; with
    cy = -(chi + kappa/mu), rs = 1/mu, b = chi x, the residual of (C + L/mu) Z = C X."""
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
    """Solves Z = X - (1/mu) Delta Z by fixed-point iteration from Z_0 = 0.

    Neural Laplacian when ``p`` and ``q`` are given (``edge_value`` = a); otherwise
    ``edge_value`` holds fixed weights W and ``kappa`` their diagonal. Differentiable in x,
    chi, p and q by implicit differentiation. Returns ``(z, stats)`` with
    stats = [iterations, ||Z_t - Z_{t-1}||_F, that over ||Z_t||_F] of the solve;
    ``backward_stats(stats)`` gives the same three of the adjoint solve once a backward ran.
    """
    _check_scalars(mu=mu, eps=eps, max_iter=max_iter, tol=tol)
    _check_graph(trusted, rowptr, col, x, t_rowptr, t_col, t_perm)
    z, _, _, stats = _ops.implicit_diffusion(rowptr, col, edge_value, x, chi, p, q, kappa, mu,
                                             eps, max_iter, tol, t_rowptr, t_col, t_perm)
    return z, stats


def implicit_diffusion_backward(*args):
    return _ops.implicit_diffusion_backward(*args)


# The adjoint solve's stats, filed by the eager backward under the forward's stats tensor
# (an op may not change its outputs afterwards; under torch.compile nothing is filed).
# Keyed by id, dropped when that tensor dies.
_BACKWARD_STATS: "dict[int, tuple]" = {}


def _file_backward_stats(forward_stats: Tensor, stats: Tensor) -> None:
    key = id(forward_stats)
    ref = weakref.ref(forward_stats, lambda _, k=key: _BACKWARD_STATS.pop(k, None))
    _BACKWARD_STATS[key] = (ref, stats)


def backward_stats(forward_stats: Tensor) -> Optional[Tensor]:
    """[iterations, residual, relative residual] of the adjoint solve of the backward that
    followed the forward which returned ``forward_stats``; None before it has run."""
    entry = _BACKWARD_STATS.get(id(forward_stats))
    if entry is None or entry[0]() is not forward_stats:
        return None
    return entry[1]


# ------------------------------------------------------------------ fake kernels --

def _num_nodes(rowptr: Tensor):
    return rowptr.shape[0] - 1


@torch.library.register_fake("dignn::check_graph")
def _(rowptr, col, num_nodes, t_rowptr=None, t_col=None, t_perm=None):
    return None


@torch.library.register_fake("dignn::neural_edge_weights")
def _(rowptr, col, a, p, q, eps):
    return p.new_empty(col.shape[0]), p.new_empty(_num_nodes(rowptr))


@torch.library.register_fake("dignn::neural_edge_weights_backward")
def _(rowptr, col, a, p, q, eps, grad_w, t_rowptr, t_col, t_perm):
    return torch.empty_like(p), torch.empty_like(q)


@torch.library.register_fake("dignn::diffusion_step")
def _(rowptr, col, w, chi, kappa, x, z, mu):
    return torch.empty_like(x)


@torch.library.register_fake("dignn::csr_fma")
def _(rowptr, col, w, y, b, cy, rs):
    return torch.empty_like(y)


@torch.library.register_fake("dignn::neural_weight_grad")
def _(rowptr, col, a, p, q, z, v, eps, t_rowptr=None, t_col=None, t_perm=None):
    return torch.empty_like(p), torch.empty_like(q)


@torch.library.register_fake("dignn::implicit_diffusion")
def _(rowptr, col, edge_value, x, chi, p, q, kappa, mu, eps, max_iter, tol, t_rowptr=None,
      t_col=None, t_perm=None):
    stats = torch.empty(3, dtype=torch.float64, device=x.device)
    return (torch.empty_like(x), x.new_empty(col.shape[0]), x.new_empty(_num_nodes(rowptr)),
            stats)


@torch.library.register_fake("dignn::implicit_diffusion_backward")
def _(rowptr, col, edge_value, w, kappa, t_rowptr, t_col, t_perm, x, chi, p, q, z, grad_z, mu,
      eps, max_iter, tol):
    grad_p = torch.empty_like(p) if p is not None else x.new_empty(0)
    grad_q = torch.empty_like(q) if q is not None else x.new_empty(0)
    return (torch.empty_like(x), torch.empty_like(chi), grad_p, grad_q,
            torch.empty(3, dtype=torch.float64, device=x.device))


# ---------------------------------------------------------------------- autograd --

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
    saved = ctx.saved_tensors
    (rowptr, col, edge_value, w, kappa, t_rowptr, t_col, t_perm, x, chi, p, q, z) = saved
    mu, eps, max_iter, tol = ctx.solver
    grad_x, grad_chi, grad_p, grad_q, stats = _ops.implicit_diffusion_backward(
        rowptr, col, edge_value, w, kappa, t_rowptr, t_col, t_perm, x, chi, p, q, z,
        grad_z, mu, eps, max_iter, tol)
    forward_stats = ctx.stats_key() if ctx.stats_key is not None else None
    if forward_stats is not None:
        _file_backward_stats(forward_stats, stats)
    if not ctx.neural:
        grad_p = grad_q = None
    return (None, None, None, grad_x, grad_chi, grad_p, grad_q) + (None,) * 8


torch.library.register_autograd("dignn::implicit_diffusion", _implicit_backward,
                                setup_context=_implicit_setup_context)


def _edge_weights_setup_context(ctx, inputs, output):
    rowptr, col, a, p, q, eps = inputs
    w, kappa = output
    ctx.save_for_backward(rowptr, col, a, p, q)
    ctx.eps = eps


def _edge_weights_backward(ctx, grad_w, grad_kappa):
    rowptr, col, a, p, q = ctx.saved_tensors
    n = rowptr.shape[0] - 1
    rows = torch.repeat_interleave(torch.arange(n, device=rowptr.device),
                                   rowptr[1:] - rowptr[:-1], output_size=col.shape[0])
    g = grad_w if grad_w is not None else torch.zeros_like(a)
    if grad_kappa is not None:  # kappa_i = sum_k W_k over row i
        g = g + grad_kappa[rows]
    from .graph import transpose_csr
    t_rowptr, t_col, t_perm = transpose_csr(rowptr, col, n)
    grad_p, grad_q = _ops.neural_edge_weights_backward(rowptr, col, a, p, q, ctx.eps,
                                                       g.contiguous(), t_rowptr, t_col, t_perm)
    return None, None, None, grad_p, grad_q, None


torch.library.register_autograd("dignn::neural_edge_weights", _edge_weights_backward,
                                setup_context=_edge_weights_setup_context)
