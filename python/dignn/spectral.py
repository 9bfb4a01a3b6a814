"""The spectral check: lambda_max(Delta) by power iteration on the fused kernels, and a clear
warning when mu <= lambda_max.

The paper's well-posedness corollary ("Tractable Well-Posedness Condition and Convergence
Rate", section 5) guarantees a unique equilibrium of Z = X - (1/mu) Delta Z, reached by the
iteration Z_{t+1} = X - (1/mu) Delta Z_t from Z_0 = 0, when mu > lambda_max(Delta); the error
then shrinks like (lambda_max / mu)^t. With mu <= lambda_max the iteration need not converge
and the layer's output need not be the fixed point.

How Delta is applied: ``torch.ops.dignn.diffusion_step(rowptr, col, w, chi, kappa, x=0, z=v,
mu)`` returns x - (1/mu) Delta v, so Delta v = -mu * diffusion_step(..., x=0, z=v, mu).

Delta = C^-1 (K - W) with C = diag(chi), K = diag(kappa) (eq. 6) is not symmetric, but on a
graph with symmetric edge values W is symmetric and Delta is self-adjoint in the vertex inner
product <u, v>_chi = sum_i chi_i u_i v_i (def. "Inner Product on the Vertex Space"): its
eigenvalues are real, >= 0, and the Rayleigh quotient <v, Delta v>_chi / <v, v>_chi of any v
is a lower bound of lambda_max that power iteration drives up to it. Rows with chi_i = 0 are
guarded (they do not diffuse) and carry no weight. On a directed graph Delta need not be
diagonalizable with real eigenvalues; there the estimate is the growth rate ||Delta v|| /
||v|| of plain power iteration, which tends to the spectral radius.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from dignn_kernels import FusedImplicitDiffusion, ops
from dignn_kernels.graph import cached_graph

__all__ = ["MuBelowSpectrumWarning", "SpectralEstimate", "laplacian_operator",
           "apply_laplacian", "estimate_lambda_max", "check_mu", "fixed_point_residuals"]

CHI_FLOOR = 1e-30  # the kernels' guard (csrc/dignn/laplacian_math.h, kChiFloor)


class MuBelowSpectrumWarning(UserWarning):
    """mu <= lambda_max(Delta): the fixed-point iteration is not guaranteed to converge
    (the paper's well-posedness corollary needs mu > lambda_max). A ``UserWarning``, given by
    :func:`check_mu`.

    Example:
        >>> import warnings
        >>> from dignn import MuBelowSpectrumWarning, check_mu
        >>> import torch
        >>> from dignn_kernels import FusedImplicitDiffusion
        >>> edge_index = torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]])  # path: rw spectrum 0, 1, 2
        >>> layer = FusedImplicitDiffusion(2, mu=1.5, laplacian="rw")
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     _ = check_mu(layer, torch.ones(3, 2), edge_index)
        >>> [w.category is MuBelowSpectrumWarning for w in caught]
        [True]
    """


@dataclass
class LaplacianOperator:
    """Delta in the kernels' form (eq. 6): (Delta Z)_i = (kappa_i z_i - (W Z)_i) / chi_i."""

    rowptr: Tensor
    col: Tensor
    w: Tensor
    chi: Tensor
    kappa: Tensor
    symmetric: bool
    # whose passes apply Delta (a name of dignn_kernels.backends.BACKENDS): the backend the
    # layer runs on the input's device, so a GPU without the compiled CUDA kernels takes
    # Triton's here as the layer does
    backend: Optional[str] = None

    @property
    def num_nodes(self) -> int:
        return self.chi.numel()


@dataclass
class SpectralEstimate:
    lambda_max: float
    iterations: int
    symmetric: bool  # True: Rayleigh quotient in the chi inner product (a lower bound)


@torch.no_grad()
def laplacian_operator(layer: FusedImplicitDiffusion, x: Tensor, edge_index,
                       edge_weight: Optional[Tensor] = None) -> LaplacianOperator:
    """Delta of ``layer`` for the layer input ``x`` (the graph neural Laplacian depends on
    x through chi, p, q: eq. 12-14; the canonical ones only on the graph)."""
    # the layer's own reading of edge_index (flow): Delta of the graph the layer solves on
    graph = cached_graph(edge_index, x.size(0), edge_weight, flow=layer.flow)
    backend = layer._resolve_backend(x.device, graph.num_edges)
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    x = x.detach().to(dtype)
    if layer.laplacian == "neural":
        a, degree = graph.values(dtype)
        c = x @ layer.theta_chi.weight.detach().to(dtype).t()           # c = X Θχᵀ
        chi = degree * torch.tanh(torch.linalg.vector_norm(c, dim=1))    # eq. 12
        p = c @ layer.theta_phi.weight.detach().to(dtype).t()            # p = c Θφᵀ
        q = x @ layer.theta_varphi.weight.detach().to(dtype).t()         # q = X Θϕᵀ
        w, kappa = ops.neural_edge_weights(graph.rowptr, graph.col, a, p.contiguous(),
                                           q.contiguous(), layer.eps, trusted=True,
                                           backend=backend)              # eq. 13-14
    else:
        w, chi, kappa = graph.fixed_laplacian(layer.laplacian, dtype)
    return LaplacianOperator(graph.rowptr, graph.col, w, chi, kappa, graph.symmetric, backend)


def apply_laplacian(op: LaplacianOperator, v: Tensor) -> Tensor:
    """Delta v through the fused forward step with x = 0 and mu = 1."""
    zeros = torch.zeros_like(v)
    return -ops.diffusion_step(op.rowptr, op.col, op.w, op.chi, op.kappa, zeros,
                               v.contiguous(), 1.0, trusted=True, backend=op.backend)


@torch.no_grad()
def estimate_lambda_max(op: LaplacianOperator, num_iter: int = 30, num_vectors: int = 4,
                        seed: int = 0) -> SpectralEstimate:
    """lambda_max(Delta) by ``num_iter`` power iterations on ``num_vectors`` random start
    vectors at once (the columns of one n x k block, one fused pass per iteration).

    Args:
        op: Delta of a layer at an input (:func:`laplacian_operator`).
        num_iter: power iterations, >= 1.
        num_vectors: start vectors iterated together.
        seed: the seed of the start vectors (CPU generator).

    Returns:
        SpectralEstimate: ``lambda_max``, the ``iterations`` run, and ``symmetric``: True
        when it is the Rayleigh quotient in the chi inner product (a lower bound, exact in
        the limit), False for a directed graph (the growth rate, tending to the spectral
        radius).

    Raises:
        ValueError: ``num_iter`` not a positive integer.

    Example:
        >>> from dignn import estimate_lambda_max
        >>> from dignn.spectral import laplacian_operator
        >>> import torch
        >>> from dignn_kernels import FusedImplicitDiffusion
        >>> edge_index = torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]])  # path: rw spectrum 0, 1, 2
        >>> layer = FusedImplicitDiffusion(2, mu=1.5, laplacian="rw")
        >>> est = estimate_lambda_max(laplacian_operator(layer, torch.ones(3, 2), edge_index))
        >>> round(est.lambda_max, 4), est.symmetric
        (2.0, True)
    """
    if isinstance(num_iter, bool) or not isinstance(num_iter, int) or num_iter < 1:
        raise ValueError(f"num_iter must be a positive integer, got {num_iter!r}")
    n = op.num_nodes
    active = op.chi > CHI_FLOOR
    if n == 0 or not bool(active.any()):
        return SpectralEstimate(0.0, 0, op.symmetric)
    dtype = op.chi.dtype
    gen = torch.Generator(device="cpu").manual_seed(seed)
    v = torch.randn(n, num_vectors, generator=gen, dtype=dtype).to(op.chi.device)
    v = v * active.unsqueeze(1)
    weight = torch.where(active, op.chi, torch.zeros_like(op.chi)).unsqueeze(1)
    estimate = 0.0
    for it in range(1, num_iter + 1):
        dv = apply_laplacian(op, v)
        if op.symmetric:
            # Rayleigh quotient in <u, v>_chi: v^T (K - W) v / v^T C v, a lower bound.
            num = (weight * v * dv).sum(0)
            den = (weight * v * v).sum(0).clamp_min(torch.finfo(dtype).tiny)
            estimate = max(estimate, float((num / den).max()))
            norms = torch.sqrt((weight * dv * dv).sum(0))
        else:
            norms = torch.linalg.vector_norm(dv, dim=0)
            ratio = norms / torch.linalg.vector_norm(v, dim=0).clamp_min(
                torch.finfo(dtype).tiny)
            estimate = float(ratio.max())
        if not bool((norms > 0).any()):  # Delta v = 0: v in the null space
            return SpectralEstimate(estimate, it, op.symmetric)
        v = dv / norms.clamp_min(torch.finfo(dtype).tiny)
    return SpectralEstimate(estimate, num_iter, op.symmetric)


def check_mu(layer: FusedImplicitDiffusion, x: Tensor, edge_index,
             edge_weight: Optional[Tensor] = None, num_iter: int = 30,
             where: str = "") -> SpectralEstimate:
    """Estimates lambda_max(Delta) of ``layer`` at input ``x`` and warns
    (:class:`MuBelowSpectrumWarning`) when ``layer.mu <= lambda_max``.

    Args:
        layer: the :class:`~dignn_kernels.FusedImplicitDiffusion` (its Laplacian and mu).
        x: float Tensor [num_nodes, in_channels], the layer's input X~ (the neural
            Laplacian depends on it through chi, p, q: eq. 12-14).
        edge_index: the graph, as the layer takes it (PyG's flow).
        edge_weight: optional float Tensor [num_edges].
        num_iter: power iterations.
        where: a note for the warning (e.g. ``"split 0, before training"``).

    Returns:
        SpectralEstimate: as :func:`estimate_lambda_max`.

    Example:
        >>> import warnings
        >>> from dignn import check_mu
        >>> import torch
        >>> from dignn_kernels import FusedImplicitDiffusion
        >>> edge_index = torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]])  # path: rw spectrum 0, 1, 2
        >>> layer = FusedImplicitDiffusion(2, mu=1.5, laplacian="rw")
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore")  # mu = 1.5 <= 2: it warns
        ...     est = check_mu(layer, torch.ones(3, 2), edge_index)
        >>> round(est.lambda_max, 4)
        2.0
    """
    est = estimate_lambda_max(laplacian_operator(layer, x, edge_index, edge_weight),
                              num_iter=num_iter)
    if math.isfinite(est.lambda_max) and layer.mu <= est.lambda_max:
        place = f" ({where})" if where else ""
        warnings.warn(
            f"mu = {layer.mu:g} <= lambda_max(Delta) ~ {est.lambda_max:.4g}{place}: the "
            f"fixed-point iteration Z <- X - (1/mu) Delta Z is not guaranteed to converge, "
            f"so the layer's output need not be the equilibrium (the paper's well-posedness "
            f"corollary needs mu > lambda_max). Raise mu above {est.lambda_max:.3g}, or keep "
            f"Delta's spectrum small (e.g. spectral normalization of Θχ and Θφ).",
            MuBelowSpectrumWarning, stacklevel=2)
    return est


@torch.no_grad()
def fixed_point_residuals(layer: FusedImplicitDiffusion, x: Tensor, edge_index,
                          num_iter: int, edge_weight: Optional[Tensor] = None,
                          mu: Optional[float] = None) -> list:
    """||Z_t - Z_{t-1}||_F for t = 1..num_iter of the iteration (eq. iter)
    Z_{t+1} = X - (1/mu) Delta Z_t from Z_0 = 0, one fused step per t (the paper's
    convergence figure). ``mu`` defaults to the layer's."""
    if isinstance(num_iter, bool) or not isinstance(num_iter, int) or num_iter < 1:
        raise ValueError(f"num_iter must be a positive integer, got {num_iter!r}")
    op = laplacian_operator(layer, x, edge_index, edge_weight)
    mu = layer.mu if mu is None else float(mu)
    xc = x.detach().to(op.chi.dtype).contiguous()
    z = torch.zeros_like(xc)
    out = []
    for _ in range(num_iter):
        z_next = ops.diffusion_step(op.rowptr, op.col, op.w, op.chi, op.kappa, xc, z, mu,
                                    trusted=True, backend=op.backend)
        out.append(float(torch.linalg.vector_norm(z_next - z)))
        z = z_next
    return out
