"""The pass interface of :mod:`dignn_kernels.backends` in plain PyTorch (``backend="torch"``).

Same signatures and semantics as the compiled ops (formulas in csrc/dignn/laplacian_math.h),
built from gathers, ``index_add_`` and torch.sparse CSR products, so the solvers of
:mod:`dignn_kernels.solvers` run on any device PyTorch supports. It builds m x h edge tensors
that the fused passes never build: a baseline and a fallback, not a fast path. The edge
partials are written out (no autograd inside), because the solvers call the passes below the
autograd dispatch key, where no graph would be recorded.
"""
import warnings
from typing import Optional, Tuple

import torch
from torch import Tensor

from .ops import _check_graph

__all__ = ["neural_edge_weights", "csr_fma", "neural_weight_grad", "implicit_diffusion"]


def _rows(rowptr: Tensor, m: int) -> Tensor:
    n = rowptr.numel() - 1
    return torch.repeat_interleave(torch.arange(n, device=rowptr.device),
                                   rowptr[1:] - rowptr[:-1], output_size=m)


def _tanh_sech2(x: Tensor) -> Tuple[Tensor, Tensor]:
    """tanh(x) and 1 - tanh(x)^2 for x >= 0, both to full relative precision
    (laplacian_math.h: tanh_sech2)."""
    em = torch.expm1(-2.0 * x)
    e = torch.exp(-2.0 * x)
    return -em / (2.0 + em), 4.0 * e / (1.0 + e).square()


def _edge_terms(rowptr, col, p, q, eps):
    rows, cols = _rows(rowptr, col.numel()), col.long()
    pi = (p[rows] * p[cols]).sum(dim=1)  # eq. 13
    dq = q[rows] - q[cols]
    rho = torch.linalg.vector_norm(dq, dim=1)  # eq. 14
    return rows, cols, pi, dq, rho


def neural_edge_weights(rowptr: Tensor, col: Tensor, a: Tensor, p: Tensor, q: Tensor,
                        eps: float = 1e-6, *, trusted: bool = False) -> Tuple[Tensor, Tensor]:
    """W = a tanh(1/(||q_i - q_j|| + eps)) tanh(|p_i . p_j|) (eq. 13-14) and row sums kappa."""
    _check_graph(trusted, rowptr, col, p)
    rows, _, pi, _, rho = _edge_terms(rowptr, col, p, q, eps)
    w = a * torch.tanh(1.0 / (rho + eps)) * torch.tanh(pi.abs())
    kappa = torch.zeros(p.size(0), dtype=p.dtype, device=p.device).index_add_(0, rows, w)
    return w, kappa


def csr_fma(rowptr: Tensor, col: Tensor, w: Tensor, y: Tensor, b: Tensor, cy: Tensor,
            rs: Tensor, *, trusted: bool = False) -> Tensor:
    """out = b + cy * y + rs * (W y), W the CSR (rowptr, col, w)."""
    _check_graph(trusted, rowptr, col, y)
    n = rowptr.numel() - 1
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Sparse CSR tensor support is in beta")
        mat = torch.sparse_csr_tensor(rowptr, col.long(), w, (n, n), check_invariants=False)
        wy = mat @ y
    return b + cy.unsqueeze(1) * y + rs.unsqueeze(1) * wy


def neural_weight_grad(rowptr: Tensor, col: Tensor, a: Tensor, p: Tensor, q: Tensor, z: Tensor,
                       v: Tensor, eps: float = 1e-6, t_rowptr: Optional[Tensor] = None,
                       t_col: Optional[Tensor] = None,
                       t_perm: Optional[Tensor] = None, *,
                       trusted: bool = False) -> Tuple[Tensor, Tensor]:
    """dl/dp, dl/dq with dl/dW_ij = G_ij = v_i . (z_j - z_i) (laplacian_math.h). Each edge
    adds to both of its ends, so no transposed CSR is needed (the t_* arguments are accepted
    for the common signature)."""
    _check_graph(trusted, rowptr, col, z, t_rowptr, t_col, t_perm)
    rows, cols, pi, dq, rho = _edge_terms(rowptr, col, p, q, eps)
    s = 1.0 / (rho + eps)
    t, t_s2 = _tanh_sech2(s)
    phi, phi_s2 = _tanh_sech2(pi.abs())
    g = (v[rows] * (z[cols] - z[rows])).sum(dim=1)
    dw_dpi = g * a * t * phi_s2 * torch.sign(pi)
    dw_drho = g * (-a * phi * t_s2 * s * s)
    radial = torch.where(rho > 0, dw_drho / rho.clamp_min(torch.finfo(rho.dtype).tiny),
                         torch.zeros_like(rho))  # d rho/dq = 0 at rho = 0
    grad_p = torch.zeros_like(p)
    grad_p.index_add_(0, rows, dw_dpi.unsqueeze(1) * p[cols])
    grad_p.index_add_(0, cols, dw_dpi.unsqueeze(1) * p[rows])
    gq = radial.unsqueeze(1) * dq
    grad_q = torch.zeros_like(q).index_add_(0, rows, gq).index_add_(0, cols, -gq)
    return grad_p, grad_q


def implicit_diffusion(rowptr, col, edge_value, x, chi, p=None, q=None, kappa=None, *, mu,
                       eps=1e-6, max_iter=10, tol=1e-6, t_rowptr=None, t_col=None,
                       t_perm=None, trusted=False):
    """The differentiable fixed-point layer on these passes (``solver="fixed_point"`` of
    :func:`dignn_kernels.solvers.implicit_diffusion`)."""
    from .solvers import implicit_diffusion as solve
    return solve(rowptr, col, edge_value, x, chi, p, q, kappa, mu=mu, eps=eps,
                 max_iter=max_iter, tol=tol, solver="fixed_point", backend="torch",
                 t_rowptr=t_rowptr, t_col=t_col, t_perm=t_perm, trusted=trusted)
