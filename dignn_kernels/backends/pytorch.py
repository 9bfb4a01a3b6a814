"""The ``"torch"`` backend: the passes in plain PyTorch, on any device PyTorch supports.

Gathers, ``index_add_`` and torch.sparse CSR products, with the formulas of
:mod:`dignn_kernels.laplacian`. It builds the m x h edge tensors that the fused passes never
build: the baseline the kernels are measured against and the fallback where none of them
runs, not a fast path. The edge partials are written out (no autograd inside), because the
solvers call the passes below the solve's autograd registration.

16-bit storage (:attr:`Backend.storage_dtypes <dignn_kernels.backends.interface.Backend>`):
the iterates and projections may come in bfloat16 or float16; every pass converts them to the
dtype of the edge values (float32 or float64) and computes there, and the row pass rounds its
output to ``y``'s dtype. This is the semantic reference of 16-bit storage.

The chain rule of the edge weights (eq. 13-14) in both directions, :func:`edge_weights_vjp`
(dl/dW -> dl/da, dl/dp, dl/dq) and :func:`edge_weights_jvp` (da, dp, dq -> dW), is written here
once in torch ops, which torch can differentiate again: the solve's and the edge-weights op's
second derivatives and tangents (forward-mode AD) are built from them
(:mod:`dignn_kernels.solvers.op`, :mod:`dignn_kernels.backends.registration`).
"""
import warnings
from typing import Optional, Tuple

import torch
from torch import Tensor

from ..csr import csr_rows
from ..laplacian import edge_terms, neural_edge_weight, neural_edge_weight_partials
from .interface import STORAGE_DTYPES, Backend

__all__ = ["TORCH", "edge_weights_vjp", "edge_weights_jvp"]


def _edges(rowptr: Tensor, col: Tensor, p: Tensor, q: Tensor):
    rows, cols = csr_rows(rowptr, col.numel()), col.long()
    return (rows, cols) + edge_terms(rows, cols, p, q)


def neural_edge_weights(rowptr: Tensor, col: Tensor, a: Tensor, p: Tensor, q: Tensor,
                        eps: float) -> Tuple[Tensor, Tensor]:
    p, q = p.to(a.dtype), q.to(a.dtype)  # 16-bit stored projections: computed in a's dtype
    rows, _, pi, _, rho = _edges(rowptr, col, p, q)
    w = neural_edge_weight(a, pi, rho, eps)
    kappa = w.new_zeros(p.size(0)).index_add(0, rows, w)
    return w, kappa


def csr_fma(rowptr: Tensor, col: Tensor, w: Tensor, y: Tensor, b: Tensor, cy: Tensor,
             rs: Tensor) -> Tensor:
    n = rowptr.numel() - 1
    stored = y.dtype
    y = y.to(w.dtype)  # a 16-bit stored iterate: computed in the weights' dtype
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Sparse CSR tensor support is in beta")
        mat = torch.sparse_csr_tensor(rowptr, col.long(), w, (n, n), check_invariants=False)
        wy = mat @ y
    return (b.to(w.dtype) + cy.unsqueeze(1) * y + rs.unsqueeze(1) * wy).to(stored)


def edge_weights_vjp(rowptr: Tensor, col: Tensor, a: Tensor, p: Tensor, q: Tensor, eps: float,
                     grad_w: Tensor, with_a: bool = True
                     ) -> Tuple[Optional[Tensor], Tensor, Tensor]:
    """(dl/da, dl/dp, dl/dq) from dl/dW per CSR entry (``grad_w``), through
    W_ij = a_ij tanh(1/(rho_ij + eps)) tanh(|pi_ij|) (eq. 13-14): each edge adds to both of its
    ends. In a's dtype (16-bit p, q computed in it); differentiable again. dl/da is None
    unless ``with_a``."""
    p, q = p.to(a.dtype), q.to(a.dtype)
    return _edges_vjp(_edges(rowptr, col, p, q), a, p, eps, grad_w, with_a)


def _edges_vjp(edges, a: Tensor, p: Tensor, eps: float, grad_w: Tensor, with_a: bool):
    """:func:`edge_weights_vjp` on the edge terms of :func:`_edges`."""
    rows, cols, pi, dq, rho = edges
    dw_dpi, dw_drho = neural_edge_weight_partials(a, pi, rho, eps)
    grad_a = grad_w * neural_edge_weight(torch.ones_like(a), pi, rho, eps) if with_a else None
    dw_dpi, dw_drho = grad_w * dw_dpi, grad_w * dw_drho
    radial = torch.where(rho > 0, dw_drho / rho.clamp_min(torch.finfo(rho.dtype).tiny),
                         torch.zeros_like(rho))  # d rho/dq = 0 at rho = 0
    # (out of place: under torch.func.vmap the sums may be batched where the zeros are not)
    grad_p = torch.zeros_like(p).index_add(0, rows, dw_dpi.unsqueeze(1) * p[cols])
    grad_p = grad_p.index_add(0, cols, dw_dpi.unsqueeze(1) * p[rows])
    gq = radial.unsqueeze(1) * dq
    grad_q = dq.new_zeros(p.shape[0], dq.shape[1]).index_add(0, rows, gq) \
        .index_add(0, cols, -gq)
    return grad_a, grad_p, grad_q


def edge_weights_jvp(rowptr: Tensor, col: Tensor, a: Tensor, p: Tensor, q: Tensor, eps: float,
                     da: Optional[Tensor], dp: Optional[Tensor], dq: Optional[Tensor]
                     ) -> Tensor:
    """dW per CSR entry for the tangents ``da``, ``dp``, ``dq`` (None: zero) of the edge
    values and the projections, through eq. 13-14: dpi_ij = dp_i . p_j + p_i . dp_j and
    drho_ij = (q_i - q_j) . (dq_i - dq_j) / rho_ij (0 at rho = 0). Differentiable again."""
    p, q = p.to(a.dtype), q.to(a.dtype)
    rows, cols, pi, diff, rho = _edges(rowptr, col, p, q)
    dw_dpi, dw_drho = neural_edge_weight_partials(a, pi, rho, eps)
    dw = torch.zeros_like(a)
    if da is not None:
        dw = dw + da * neural_edge_weight(torch.ones_like(a), pi, rho, eps)
    if dp is not None:
        dp = dp.to(a.dtype)
        dw = dw + dw_dpi * ((dp[rows] * p[cols]).sum(dim=1) + (p[rows] * dp[cols]).sum(dim=1))
    if dq is not None:
        dq = dq.to(a.dtype)
        drho = (diff * (dq[rows] - dq[cols])).sum(dim=1)
        dw = dw + torch.where(rho > 0, dw_drho * drho
                              / rho.clamp_min(torch.finfo(rho.dtype).tiny),
                              torch.zeros_like(rho))
    return dw


def neural_weight_grad(rowptr: Tensor, col: Tensor, a: Tensor, p: Tensor, q: Tensor, z: Tensor,
                  v: Tensor, eps: float, t_rowptr: Optional[Tensor] = None,
                  t_col: Optional[Tensor] = None,
                  t_perm: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """Each edge adds to both of its ends, so no transposed CSR is needed (the t_* arguments
    are accepted for the common signature). 16-bit p, q, z, v are computed in a's dtype, the
    dtype of the gradients."""
    p, q, z, v = (t.to(a.dtype) for t in (p, q, z, v))
    edges = _edges(rowptr, col, p, q)
    rows, cols = edges[0], edges[1]
    g = (v[rows] * (z[cols] - z[rows])).sum(dim=1)  # dl/dW_ij
    _, grad_p, grad_q = _edges_vjp(edges, a, p, eps, g, with_a=False)
    return grad_p, grad_q


TORCH = Backend(name="torch", available=lambda device: True,
                neural_edge_weights=neural_edge_weights, csr_fma=csr_fma,
                neural_weight_grad=neural_weight_grad, storage_dtypes=STORAGE_DTYPES,
                vector_kernels="torch")
