"""Plain-PyTorch DIGNN written straight from the paper: the oracle for tests and the baseline
for benchmarks. Nothing here is fast, on purpose.

- :func:`reference_implicit_diffusion` is the paper's algorithm as the authors' PyTorch
  Geometric code runs it: every fixed-point iteration (eq. iter) gathers the features of both
  ends of every edge and recomputes chi, phi and varphi (eq. 12-14) from them, O(m (h^2 + hd))
  per iteration; the backward is implicit differentiation (appendix "Training for DIGNNs")
  with one autograd vector-Jacobian product per adjoint iteration.
- :func:`dense_laplacian` and :func:`dense_solve` build Delta as a dense float64 matrix and
  solve (I + Delta / mu) Z = X directly: the exact equilibrium for small graphs.

Graph convention as in :mod:`dignn_kernels.graph`: edge ``(j, i) = edge_index[:, k]`` sends a
message from ``j`` to ``i``, so ``a_ij = edge_weight[k]`` and ``D_i = sum_j a_ij``. Rows whose
chi is 0 (isolated nodes, all-zero features) do not diffuse: their Delta row is 0 (the
documented guard, see csrc/dignn/laplacian_math.h).
"""
from typing import Optional, Tuple

import torch
from torch import Tensor

__all__ = ["graph_neural_laplacian", "laplacian_apply", "reference_implicit_diffusion",
           "dense_laplacian", "dense_solve", "CHI_FLOOR"]

CHI_FLOOR = 1e-30  # rows with chi <= CHI_FLOOR are guarded (Delta row = 0)


def _edges(x: Tensor, edge_index: Tensor, edge_weight: Optional[Tensor]):
    src, dst = edge_index[0].long(), edge_index[1].long()
    a = (edge_weight if edge_weight is not None else
         torch.ones(src.numel(), dtype=x.dtype, device=x.device)).to(x.dtype)
    deg = torch.zeros(x.size(0), dtype=x.dtype, device=x.device).index_add_(0, dst, a)
    return dst, src, a, deg


def graph_neural_laplacian(x: Tensor, edge_index: Tensor, edge_weight: Optional[Tensor],
                           theta_chi: Tensor, theta_phi: Tensor, theta_varphi: Tensor,
                           eps: float = 1e-6):
    """Per edge (i <- j): the weight varphi_ij^2 phi_ij, and per node chi_i (eq. 12-14),
    computed as the paper writes them, from the gathered features x_i, x_j of every edge.
    Returns (i, j, w, chi)."""
    i, j, a, deg = _edges(x, edge_index, edge_weight)
    chi = deg * torch.tanh(torch.linalg.vector_norm(x @ theta_chi.T, dim=1))  # eq. 12
    x_i, x_j = x[i], x[j]
    p_i = (x_i @ theta_chi.T) @ theta_phi.T  # Θφ Θχ x_i
    p_j = (x_j @ theta_chi.T) @ theta_phi.T
    phi = torch.tanh(torch.abs((p_i * p_j).sum(dim=1)))  # eq. 13
    dist = torch.linalg.vector_norm((x_i - x_j) @ theta_varphi.T, dim=1)
    varphi_sq = a * torch.tanh(1.0 / (dist + eps))  # eq. 14, squared
    return i, j, varphi_sq * phi, chi


def _fixed_weights(x, edge_index, edge_weight, laplacian):
    """(i, j, w, chi, self_weight) of a canonical Laplacian: (Delta z)_i =
    (self_weight_i z_i - sum_j w_ij z_j) / chi_i (the paper's appendix)."""
    i, j, a, deg = _edges(x, edge_index, edge_weight)
    ones = torch.ones_like(deg)
    if laplacian == "rw":
        return i, j, a, deg, deg
    if laplacian == "unnormalized":
        return i, j, a, ones, deg
    if laplacian == "sym":
        inv_sqrt = torch.where(deg > 0, deg.clamp_min(1e-300).rsqrt(), torch.zeros_like(deg))
        return i, j, inv_sqrt[i] * a * inv_sqrt[j], ones, (deg > 0).to(x.dtype)
    raise ValueError(f"unknown laplacian {laplacian!r}")


def laplacian_apply(z: Tensor, i: Tensor, j: Tensor, w: Tensor, chi: Tensor,
                    self_weight: Optional[Tensor] = None) -> Tensor:
    """(Delta z)_i = (1/chi_i) sum_j w_ij (z_i - z_j) (eq. 6), or with a separate diagonal
    (self_weight_i z_i - sum_j w_ij z_j) / chi_i; 0 on rows with chi_i = 0."""
    n = z.size(0)
    if self_weight is None:
        self_weight = torch.zeros(n, dtype=z.dtype, device=z.device).index_add_(0, i, w)
    agg = torch.zeros_like(z).index_add_(0, i, w.unsqueeze(1) * z[j])
    inv_chi = torch.where(chi > CHI_FLOOR, 1.0 / chi.clamp_min(CHI_FLOOR), torch.zeros_like(chi))
    return inv_chi.unsqueeze(1) * (self_weight.unsqueeze(1) * z - agg)


def reference_implicit_diffusion(x: Tensor, edge_index: Tensor,
                                 edge_weight: Optional[Tensor] = None, *,
                                 laplacian: str = "neural",
                                 theta_chi: Optional[Tensor] = None,
                                 theta_phi: Optional[Tensor] = None,
                                 theta_varphi: Optional[Tensor] = None, mu: float = 2.2,
                                 max_iter: int = 10, tol: float = 1e-6,
                                 eps: float = 1e-6) -> Tensor:
    """The paper's algorithm: Z_{t+1} = X - (1/mu) Delta(Z_t) from Z_0 = 0, stopping after
    ``max_iter`` iterations or when ||Z_t - Z_{t-1}||_F <= tol ||Z_t||_F, with Delta
    recomputed from gathered edge features at every iteration. Gradients flow to x and the
    Thetas by implicit differentiation: u = g + J^T u solved by ``max_iter`` iterations, one
    autograd call each."""

    def step(z, x_):
        if laplacian == "neural":
            i, j, w, chi = graph_neural_laplacian(x_, edge_index, edge_weight, theta_chi,
                                                  theta_phi, theta_varphi, eps)
            return x_ - laplacian_apply(z, i, j, w, chi) / mu
        i, j, w, chi, self_w = _fixed_weights(x_, edge_index, edge_weight, laplacian)
        return x_ - laplacian_apply(z, i, j, w, chi, self_w) / mu

    with torch.no_grad():
        z = torch.zeros_like(x)
        for _ in range(max_iter - 1):
            z_next = step(z, x)
            done = (z_next - z).norm() <= tol * z_next.norm()
            z = z_next
            if done:
                break
    if not torch.is_grad_enabled():
        return step(z, x)
    # One more step with autograd attaches the parameters; the hook replaces the gradient
    # flowing into it by the implicit one.
    z_star = z.detach().requires_grad_()
    out = step(z_star, x)
    if not out.requires_grad:
        return out
    f0 = step(z_star, x.detach())

    def implicit_grad(g):
        u = g
        for _ in range(max_iter - 1):
            u = torch.autograd.grad(f0, z_star, u, retain_graph=True)[0] + g
        return u

    out.register_hook(implicit_grad)
    return out


# ----------------------------------------------------------------------- dense solve --

def dense_laplacian(x: Tensor, edge_index: Tensor, edge_weight: Optional[Tensor] = None, *,
                    laplacian: str = "neural", theta_chi: Optional[Tensor] = None,
                    theta_phi: Optional[Tensor] = None, theta_varphi: Optional[Tensor] = None,
                    eps: float = 1e-6) -> Tensor:
    """Delta as a dense n x n matrix, in the dtype of x (pass float64 for an oracle)."""
    n = x.size(0)
    if laplacian == "neural":
        i, j, w, chi = graph_neural_laplacian(x, edge_index, edge_weight, theta_chi,
                                              theta_phi, theta_varphi, eps)
        self_w = torch.zeros(n, dtype=x.dtype, device=x.device).index_add_(0, i, w)
    else:
        i, j, w, chi, self_w = _fixed_weights(x, edge_index, edge_weight, laplacian)
    inv_chi = torch.where(chi > CHI_FLOOR, 1.0 / chi.clamp_min(CHI_FLOOR), torch.zeros_like(chi))
    delta = torch.diag(self_w * inv_chi)
    delta = delta.index_put((i, j), -w * inv_chi[i], accumulate=True)
    return delta


def dense_solve(x: Tensor, delta: Tensor, mu: float) -> Tensor:
    """The exact equilibrium: solves (I + Delta / mu) Z = X."""
    eye = torch.eye(x.size(0), dtype=delta.dtype, device=delta.device)
    return torch.linalg.solve(eye + delta / mu, x.to(delta.dtype))


def dense_equilibrium(x: Tensor, edge_index: Tensor, edge_weight: Optional[Tensor] = None,
                      **kwargs) -> Tuple[Tensor, Tensor]:
    """(Z*, Delta) in float64 for x and parameters given in any dtype."""
    mu = kwargs.pop("mu")
    cast = {k: (v.double() if isinstance(v, Tensor) else v) for k, v in kwargs.items()}
    xd = x.double()
    ew = edge_weight.double() if edge_weight is not None else None
    delta = dense_laplacian(xd, edge_index, ew, **cast)
    return dense_solve(xd, delta, mu), delta
