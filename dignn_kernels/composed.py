"""The best plain-PyTorch composition of the implicit layer: ``backend="torch"``.

Node projections once, edge weights once per forward (from m x h gathers of p and q, so
autograd can differentiate them), torch.sparse CSR products for the fixed-point iterations and
for the adjoint iterations of the implicit backward. It runs on any device PyTorch supports
and is the baseline the fused kernels are measured against; it builds the m x h edge tensors
that the fused passes never build.
"""
import warnings
from typing import Optional

import torch
from torch import Tensor

from .graph import CSRGraph
from .ops import _file_backward_stats
from .reference import CHI_FLOOR

__all__ = ["composed_edge_weights", "composed_implicit_diffusion"]


def composed_edge_weights(graph: CSRGraph, a: Tensor, p: Tensor, q: Tensor,
                          eps: float) -> Tensor:
    """W_ij = a_ij tanh(1/(||q_i - q_j|| + eps)) tanh(|p_i . p_j|) with torch ops."""
    rows, cols = graph.rows(), graph.col.long()
    pi = (p[rows] * p[cols]).sum(dim=1)
    rho = torch.linalg.vector_norm(q[rows] - q[cols], dim=1)
    return a * torch.tanh(1.0 / (rho + eps)) * torch.tanh(torch.abs(pi))


def _csr(graph: CSRGraph, values: Tensor, transposed: bool) -> Tensor:
    n = graph.num_nodes
    t = graph.transposed() if transposed else None
    rowptr, col = (graph.rowptr, graph.col) if t is None else (t[0], t[1])
    vals = values if t is None else values[t[2]]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Sparse CSR tensor support is in beta")
        return torch.sparse_csr_tensor(rowptr, col.long(), vals, (n, n),
                                       check_invariants=False)


class _SparseFixedPoint(torch.autograd.Function):
    """Z = X + cy.Z + ca.(W Z) by fixed-point iteration; implicit backward."""

    @staticmethod
    def forward(ctx, x, w, chi, kappa, graph, mu, max_iter, tol, stats):
        if kappa is None:  # neural: kappa = row sums of W, a function of W
            kappa_v = torch.zeros_like(chi).index_add_(0, graph.rows(), w)
        else:
            kappa_v = kappa
        ca = torch.where(chi > CHI_FLOOR, 1.0 / (mu * chi.clamp_min(CHI_FLOOR)),
                         torch.zeros_like(chi))
        cy = -kappa_v * ca
        mat = _csr(graph, w, transposed=False)
        z = x.clone()
        iters, res, rel = 1, x.norm(), torch.ones((), dtype=x.dtype, device=x.device)
        for iters in range(2, max_iter + 1):
            z_next = x + cy.unsqueeze(1) * z + ca.unsqueeze(1) * (mat @ z)
            res = (z_next - z).norm()
            rel = res / z_next.norm().clamp_min(torch.finfo(x.dtype).tiny)
            z = z_next
            if rel <= tol:
                break
        stats.copy_(torch.stack([torch.tensor(float(iters), dtype=res.dtype), res.cpu(),
                                 rel.cpu()]).double())
        ctx.save_for_backward(x, w, chi, z, ca, cy)
        ctx.graph, ctx.mu, ctx.max_iter, ctx.tol = graph, mu, max_iter, tol
        ctx.kappa_from_w = kappa is None
        ctx.stats = stats
        return z

    @staticmethod
    def backward(ctx, g):
        x, w, chi, z, ca, cy = ctx.saved_tensors
        graph = ctx.graph
        mat_t = _csr(graph, w, transposed=True)
        u = g.clone()
        iters, res, rel = 1, g.norm(), torch.ones((), dtype=g.dtype)
        for iters in range(2, ctx.max_iter + 1):  # u = g + cy.u + W^T (ca.u)
            u_next = g + cy.unsqueeze(1) * u + mat_t @ (ca.unsqueeze(1) * u)
            res = (u_next - u).norm()
            rel = res / u_next.norm().clamp_min(torch.finfo(g.dtype).tiny)
            u = u_next
            if rel <= ctx.tol:
                break
        _file_backward_stats(ctx.stats, torch.stack(
            [torch.tensor(float(iters), dtype=res.dtype), res.cpu(), rel.cpu()]).double())
        grad_chi = (u * (x - z)).sum(dim=1) * ca * ctx.mu
        grad_w = None
        if ctx.needs_input_grad[1]:
            v = ca.unsqueeze(1) * u
            rows, cols = graph.rows(), graph.col.long()
            if ctx.kappa_from_w:  # dF_i/dW_ij = ca_i (z_j - z_i)
                grad_w = (v[rows] * (z[cols] - z[rows])).sum(dim=1)
            else:  # fixed diagonal: dF_i/dW_ij = ca_i z_j
                grad_w = (v[rows] * z[cols]).sum(dim=1)
        return u, grad_w, grad_chi, None, None, None, None, None, None


def composed_implicit_diffusion(graph: CSRGraph, x: Tensor, w: Tensor, chi: Tensor,
                                kappa: Optional[Tensor], *, mu: float, max_iter: int,
                                tol: float, stats: Tensor) -> Tensor:
    """Solve with torch.sparse products; ``kappa=None`` means kappa = row sums of ``w``.
    Writes [iterations, residual, relative residual] of the solve into ``stats`` (float64,
    3); ``ops.backward_stats(stats)`` has those of the adjoint solve after a backward."""
    return _SparseFixedPoint.apply(x, w, chi, kappa, graph, mu, max_iter, tol, stats)
