"""The math of the graph neural Laplacian in PyTorch: one statement of each formula for every
Python caller (the plain-PyTorch backend, the Triton backend's host side, the solvers).

The compiled kernels state the same formulas once in C++ (``csrc/dignn/laplacian_math.h``) and
the Triton kernels once in Triton (:mod:`dignn_kernels.backends._triton_jit`); the tests hold
all three to the oracle :mod:`dignn_kernels.reference`, which restates the paper independently.

Notation (paper section 4): node i aggregates from its CSR row's sources j with weights
W_ij; chi_i is the node's mass (eq. 12), kappa_i = sum_j W_ij the diagonal of L = K - W, and
Delta = C^-1 L with C = diag(chi). The neural edge weight (eq. 13-14) is

    W_ij = a_ij tanh(1 / (||q_i - q_j|| + eps)) tanh(|p_i . p_j|),

with p = Θφ Θχ x and q = Θϕ x the node projections.
"""
import math
from typing import Optional, Tuple

import torch
from torch import Tensor

__all__ = ["CHI_FLOOR", "guard_rows", "node_mass", "row_coefficients", "check_inverse_mu",
           "coefficient_overflow_message", "edge_terms",
           "neural_edge_weight", "neural_edge_weight_partials", "tanh_sech2"]

# Rows with chi_i <= CHI_FLOOR do not diffuse: their Delta row is 0 and z_i = x_i (0/0 := 0;
# laplacian_math.h kChiFloor).
CHI_FLOOR = 1e-30


def guard_rows(chi: Tensor) -> Tensor:
    """The rows that keep z_i = x_i (chi_i <= CHI_FLOOR)."""
    return chi <= CHI_FLOOR


def node_mass(chi: Tensor) -> Tensor:
    """diag(C) with 1 on guard rows: the weight of the norms in which the fixed-point map is
    self-adjoint, and the mass matrix of the SPD form (C + L/mu) Z = C X."""
    return torch.where(guard_rows(chi), torch.ones_like(chi), chi)


def check_inverse_mu(mu: float, dtype: torch.dtype) -> float:
    """1/mu, or a ValueError naming mu when 1/mu is not finite in ``dtype`` (the compute dtype
    of the solve): every coefficient of the map (eq. iter) and of the SPD form carries it."""
    inv_mu = 1.0 / mu if mu != 0.0 else math.inf
    bound = torch.finfo(dtype).max
    if not inv_mu <= bound:
        raise ValueError(
            f"mu={mu:g} is too small for {dtype}: 1/mu = {inv_mu:g} is not finite in {dtype} "
            f"(mu must be >= 1/{bound:.4g} = {1.0 / bound:.4g}), so the coefficients "
            f"1/(mu chi) of Z = X - (1/mu) Delta Z overflow. Compute in torch.float64 or "
            f"raise mu.")
    return inv_mu


def coefficient_overflow_message(chi: Tensor, kappa: Tensor, mu: float) -> Optional[str]:
    """Why the row coefficients 1/(mu chi_i) or kappa_i/(mu chi_i) are not finite in chi's
    dtype, or None where they are (reads chi and kappa on the host)."""
    dtype = chi.dtype
    chi, kappa = chi.detach(), kappa.detach()  # (read on the host: no graph to keep)
    # rows whose chi and kappa are finite: a NaN or Inf there is the input's (or the edge
    # weights') fault, which the solve's warning names, not an overflow of the coefficients
    diffuses = ~guard_rows(chi) & torch.isfinite(chi) & torch.isfinite(kappa)
    if not bool(diffuses.any()):
        return None
    chi_d = chi[diffuses].double()
    worst = torch.maximum(torch.ones_like(chi_d), kappa[diffuses].double().abs()) / chi_d / mu
    bound = torch.finfo(dtype).max
    largest = float(worst.max())
    if largest <= bound:
        return None
    return (f"mu={mu:g} is too small for these chi in {dtype}: max(1, kappa_i) / (mu chi_i) "
            f"reaches {largest:.4g} (the smallest chi of a diffusing row is "
            f"{float(chi_d.min()):.4g}), above {dtype}'s largest value {bound:.4g}, so the "
            f"coefficients of Z = X - (1/mu) Delta Z overflow. Compute in torch.float64, "
            f"raise mu, or raise the smallest chi.")


def row_coefficients(chi: Tensor, kappa: Tensor, mu: float, check: bool = False
                     ) -> Tuple[Tensor, Tensor]:
    """(cy, rs) of the fixed-point map Z <- X + cy.Z + rs.(W Z) (eq. iter, Delta = C^-1 (K - W)):
    rs = 1/(mu chi), cy = -kappa rs, both 0 on guard rows. A ValueError naming mu where 1/mu
    is not finite in chi's dtype; with ``check`` (a host read) also where a coefficient is
    not (:func:`coefficient_overflow_message`)."""
    inv = check_inverse_mu(mu, chi.dtype)
    if check:
        message = coefficient_overflow_message(chi, kappa, mu)
        if message is not None:
            raise ValueError(message)
    diffuses = ~guard_rows(chi)
    # 1/mu rounded to chi's dtype, then divided (not a reciprocal of chi times 1/mu, which
    # torch makes of `scalar / tensor`): the compiled kernels' row_coefficients to the bit
    inv_mu = torch.full_like(chi, inv)
    rs = torch.where(diffuses, inv_mu / torch.where(diffuses, chi, torch.ones_like(chi)),
                     torch.zeros_like(chi))
    return -kappa * rs, rs


def edge_terms(rows: Tensor, cols: Tensor, p: Tensor, q: Tensor
               ) -> Tuple[Tensor, Tensor, Tensor]:
    """Per edge (i = rows, j = cols): pi_ij = p_i . p_j (eq. 13), q_i - q_j and
    rho_ij = ||q_i - q_j|| (eq. 14)."""
    pi = (p[rows] * p[cols]).sum(dim=1)
    dq = q[rows] - q[cols]
    return pi, dq, torch.linalg.vector_norm(dq, dim=1)


def neural_edge_weight(a: Tensor, pi: Tensor, rho: Tensor, eps: float) -> Tensor:
    """W_ij = a_ij tanh(1/(rho_ij + eps)) tanh(|pi_ij|) (eq. 13-14); differentiable."""
    return a * torch.tanh(1.0 / (rho + eps)) * torch.tanh(pi.abs())


def tanh_sech2(x: Tensor) -> Tuple[Tensor, Tensor]:
    """tanh(x) and 1 - tanh(x)^2 for x >= 0, both to full relative precision (the form of
    laplacian_math.h tanh_sech2)."""
    em = torch.expm1(-2.0 * x)
    e = torch.exp(-2.0 * x)
    return -em / (2.0 + em), 4.0 * e / (1.0 + e).square()


def neural_edge_weight_partials(a: Tensor, pi: Tensor, rho: Tensor, eps: float
                                ) -> Tuple[Tensor, Tensor]:
    """dW/dpi and dW/drho of :func:`neural_edge_weight`: with s = 1/(rho + eps),
    dW/dpi = a tanh(s) sech^2(|pi|) sign(pi) and dW/drho = -a tanh(|pi|) sech^2(s) s^2."""
    s = 1.0 / (rho + eps)
    t, t_s2 = tanh_sech2(s)
    phi, phi_s2 = tanh_sech2(pi.abs())
    return a * t * phi_s2 * torch.sign(pi), -a * phi * t_s2 * s * s
