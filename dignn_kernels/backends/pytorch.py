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
"""
import warnings
from typing import Optional, Tuple

import torch
from torch import Tensor

from ..csr import csr_rows
from ..laplacian import edge_terms, neural_edge_weight, neural_edge_weight_partials
from .interface import STORAGE_DTYPES, Backend

__all__ = ["TORCH"]


def _edges(rowptr: Tensor, col: Tensor, p: Tensor, q: Tensor):
    rows, cols = csr_rows(rowptr, col.numel()), col.long()
    return (rows, cols) + edge_terms(rows, cols, p, q)


def neural_edge_weights(rowptr: Tensor, col: Tensor, a: Tensor, p: Tensor, q: Tensor,
                        eps: float) -> Tuple[Tensor, Tensor]:
    p, q = p.to(a.dtype), q.to(a.dtype)  # 16-bit stored projections: computed in a's dtype
    rows, _, pi, _, rho = _edges(rowptr, col, p, q)
    w = neural_edge_weight(a, pi, rho, eps)
    kappa = torch.zeros(p.size(0), dtype=p.dtype, device=p.device).index_add_(0, rows, w)
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


def neural_weight_grad(rowptr: Tensor, col: Tensor, a: Tensor, p: Tensor, q: Tensor, z: Tensor,
                  v: Tensor, eps: float, t_rowptr: Optional[Tensor] = None,
                  t_col: Optional[Tensor] = None,
                  t_perm: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """Each edge adds to both of its ends, so no transposed CSR is needed (the t_* arguments
    are accepted for the common signature). 16-bit p, q, z, v are computed in a's dtype, the
    dtype of the gradients."""
    p, q, z, v = (t.to(a.dtype) for t in (p, q, z, v))
    rows, cols, pi, dq, rho = _edges(rowptr, col, p, q)
    g = (v[rows] * (z[cols] - z[rows])).sum(dim=1)  # dl/dW_ij
    dw_dpi, dw_drho = neural_edge_weight_partials(a, pi, rho, eps)
    dw_dpi, dw_drho = g * dw_dpi, g * dw_drho
    radial = torch.where(rho > 0, dw_drho / rho.clamp_min(torch.finfo(rho.dtype).tiny),
                         torch.zeros_like(rho))  # d rho/dq = 0 at rho = 0
    grad_p = torch.zeros_like(p)
    grad_p.index_add_(0, rows, dw_dpi.unsqueeze(1) * p[cols])
    grad_p.index_add_(0, cols, dw_dpi.unsqueeze(1) * p[rows])
    gq = radial.unsqueeze(1) * dq
    grad_q = torch.zeros_like(q).index_add_(0, rows, gq).index_add_(0, cols, -gq)
    return grad_p, grad_q


TORCH = Backend(name="torch", available=lambda device: True,
                neural_edge_weights=neural_edge_weights, csr_fma=csr_fma,
                neural_weight_grad=neural_weight_grad, storage_dtypes=STORAGE_DTYPES,
                vector_kernels="torch")
