"""The vector work of one conjugate-gradient iteration (:func:`.cg_solver.conjugate_gradient`),
after its sweep w = A u: written once in PyTorch and once as fused Triton kernels.

The iteration is CG in the single-reduction form of Chronopoulos and Gear (1989). Per
channel, with gamma = r.u (u = M^-1 r, M the Jacobi preconditioner) and delta = w.u:

    restart = gamma_prev <= 0 or alpha_prev <= 0          (first iteration, or a breakdown)
    beta    = 0 if restart else gamma / gamma_prev
    alpha   = gamma / (delta - beta gamma / alpha_prev)    (0 where that is not > 0)
    p = u + beta p,  s = w + beta s,  z += alpha p,  r -= alpha s,  u = M^-1 r

(p.A p = delta - beta^2 p_prev.A p_prev and p_prev.A p_prev = gamma_prev / alpha_prev give the
denominator). A finished solve (its ``done`` flag set) takes alpha = beta = 0: z and r stay.

- :class:`TorchCGUpdate`: PyTorch ops, any device (each op one kernel on a GPU);
- :class:`TritonCGUpdate`: on a GPU the dot product w.u is one kernel (+ a sum of its block
  partials; none where the backend's row product took it in the sweep), the whole update
  (coefficients; five vectors written from five read, u = M^-1 r taken from r rather than
  read; the partial sums of the next r.u and ||scale r||^2) another
  (+ a sum), and the iteration's bookkeeping (residual, history, flags, stopping test) a
  third: three to five launches where the PyTorch ops take about thirty. Its kernels are in
  :mod:`._triton_cg`; on the CPU they run only in the Triton interpreter (the tests).

Both leave the same state: :class:`CGState` holds the vectors and the per-channel scalars.
"""
from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from ..solver_state import (CG_STATE, DIVERGED, DONE, REF_SAFE, RESIDUAL, SWEEPS, TARGET,
                            record_iteration, state_of)

__all__ = ["CGState", "TorchCGUpdate", "TritonCGUpdate", "cg_update_for",
           "resolve_vector_kernels", "VECTOR_KERNELS", "cg_flags"]

VECTOR_KERNELS = ("torch", "triton")


def cg_flags(residual: Tensor, target: Tensor, ref_safe: Tensor) -> Tensor:
    """The solve's state (dignn_kernels.solver_state, CG_STATE) before the first iteration:
    done where the start's residual already meets the target (rhs = 0 included)."""
    zero = torch.zeros_like(residual)
    fields = {DONE: (residual <= target).double(), DIVERGED: zero, SWEEPS: zero,
              RESIDUAL: residual, TARGET: target, REF_SAFE: ref_safe}
    return state_of(fields, CG_STATE)


def _residual_norm(sums: Tensor) -> Tensor:
    """||scale * r||_F (float64) from the [2, d] sums r.u and ||scale r||^2 per channel."""
    return sums[1].double().sum().clamp_min(0.0).sqrt()


@dataclass
class CGState:
    """The iterate z, residual r, preconditioned residual u, directions p and s = A p, and
    per channel gamma = r.u, the previous gamma and step length; ``weights`` = [M^-1,
    scale^2] (2 x n) give r.u and ||scale * r||^2 of a residual in one product."""

    z: Tensor
    r: Tensor
    u: Tensor
    p: Tensor
    s: Tensor
    inv_diagonal: Tensor  # [n]
    weights: Tensor  # [2, n]
    gamma: Tensor  # [d]
    gamma_prev: Tensor  # [d]
    alpha_prev: Tensor  # [d]
    pending: Optional[Tensor] = None  # [2, d] local sums of the current r, if computed
    scratch: Optional[Tensor] = None  # n x d temporary of the PyTorch update's products

    @classmethod
    def start(cls, rhs: Tensor, inv_diagonal: Tensor, residual_scale: Optional[Tensor],
              decoupled: Optional[Tensor], apply=None) -> "CGState":
        """z = 0 and r = rhs, except decoupled rows: z_i = rhs_i / A_ii, r_i = 0. With
        ``apply`` (the product y -> A y), decoupled rows that other rows still read (A_ji != 0:
        a guard row with edges) are eliminated: their known z_i moves to the right-hand side,
        r_j = rhs_j - sum_i A_ji z_i (one product), so that the Krylov space stays in the
        other rows, where A is symmetric positive definite."""
        inv = inv_diagonal.unsqueeze(1)
        if decoupled is None:
            z = torch.zeros_like(rhs)
            r = rhs.clone()
        else:
            known = decoupled.unsqueeze(1)
            z = torch.where(known, rhs * inv, 0.0)
            r = torch.where(known, 0.0, rhs if apply is None else rhs - apply(z))
        scale_sq = residual_scale.square() if residual_scale is not None else \
            torch.ones_like(inv_diagonal)
        weights = torch.stack([inv_diagonal, scale_sq]).to(rhs.dtype)
        zeros = rhs.new_zeros(rhs.shape[1])
        return cls(z=z, r=r, u=r * inv, p=torch.zeros_like(rhs), s=torch.zeros_like(rhs),
                   inv_diagonal=inv_diagonal.to(rhs.dtype).contiguous(),
                   weights=weights.contiguous(), gamma=zeros, gamma_prev=zeros.clone(),
                   alpha_prev=zeros.clone())

    def products(self, a: Tensor, b: Tensor) -> Tensor:
        """a * b in the state's one n x d temporary (allocated on first use)."""
        if self.scratch is None:
            self.scratch = torch.empty_like(self.r)
        return torch.mul(a, b, out=self.scratch)

    def reduction(self) -> Tensor:
        """[2, d]: this process's sums r.u and ||scale * r||^2 per channel."""
        if self.pending is not None:
            return self.pending
        return torch.mm(self.weights, self.products(self.r, self.r))

    def finish_reduction(self, sums: Tensor) -> Tensor:
        """Takes the (global) sums of :meth:`reduction`: the new gamma; returns the residual
        ||scale * r||_F (float64)."""
        self.take_gamma(sums)
        return _residual_norm(sums)

    def take_gamma(self, sums: Tensor) -> None:
        """The new gamma = r.u from the (global) sums of :meth:`reduction`."""
        self.pending = None
        self.gamma_prev, self.gamma = self.gamma, sums[0].contiguous()


def coefficients(state: CGState, delta: Tensor, done: Tensor):
    """(alpha, beta) per channel (see the module docstring); ``done``: the solve's done flag
    (a tensor whose first element is nonzero once done, e.g. the flags of :func:`cg_flags`)."""
    live = done.reshape(-1)[0] == 0
    gamma = state.gamma
    keep = (state.gamma_prev > 0) & (state.alpha_prev > 0)
    beta = torch.where(live & keep, gamma / state.gamma_prev, 0.0)
    denominator = delta - torch.where(keep, beta * gamma / state.alpha_prev, 0.0)
    alpha = torch.where(live & (denominator > 0), gamma / denominator, 0.0)
    return alpha, beta


class TorchCGUpdate:
    """The update in PyTorch ops."""

    name = "torch"

    @staticmethod
    def finish(state: CGState, sums: Tensor, flags: Tensor, history: Tensor, k: int) -> None:
        """The bookkeeping of iteration k from the (global) sums of :meth:`CGState.reduction`,
        in place on the device: the new gamma, the relative residual into history[k] (the
        loop's :func:`~.common.history_slot` of k) and, if the solve was live, the iteration
        counted, the residual kept, a non-finite one flagged as divergence; then done once
        diverged or the residual meets the target."""
        state.take_gamma(sums)
        res = _residual_norm(sums)
        history[k] = res / flags[REF_SAFE]
        record_iteration(flags, res, ~torch.isfinite(res), res <= flags[TARGET])

    @staticmethod
    def dot(state: CGState, w: Tensor) -> Tensor:
        return state.products(w, state.u).sum(dim=0)

    @staticmethod
    def step(state: CGState, w: Tensor, delta: Tensor, done: Tensor) -> None:
        alpha, beta = coefficients(state, delta, done)
        state.p.mul_(beta).add_(state.u)
        state.s.mul_(beta).add_(w)
        state.z.addcmul_(state.p, alpha)
        state.r.addcmul_(state.s, alpha, value=-1.0)
        torch.mul(state.r, state.inv_diagonal.unsqueeze(1), out=state.u)
        state.alpha_prev = alpha


class TritonCGUpdate:
    """The update as two fused Triton kernels (:mod:`._triton_cg`)."""

    name = "triton"

    @staticmethod
    def dot(state: CGState, w: Tensor) -> Tensor:
        from ._triton_cg import column_dots
        return column_dots(w, state.u)

    @staticmethod
    def step(state: CGState, w: Tensor, delta: Tensor, done: Tensor) -> None:
        from ._triton_cg import cg_step
        state.alpha_prev, state.pending = cg_step(state, w, delta, done)

    @staticmethod
    def finish(state: CGState, sums: Tensor, flags: Tensor, history: Tensor, k: int) -> None:
        """:meth:`TorchCGUpdate.finish` in one kernel."""
        from ._triton_cg import cg_finish
        state.take_gamma(sums)
        cg_finish(sums, flags, history, k)


def _triton_runs(x: Tensor) -> bool:
    from ..backends import triton as triton_backend
    return triton_backend.available(x.device)


def resolve_vector_kernels(rhs: Tensor, vector_kernels: Optional[str] = None) -> str:
    """Which kernels run a solver's vector work on ``rhs``'s device.

    A solve on a backend passes the backend's choice (:attr:`Backend.vector_kernels
    <dignn_kernels.backends.interface.Backend>`, through its system's ``vector_kernels``), so
    that ``backend="torch"`` or ``"cuda"`` runs no Triton kernel; None is the choice of a
    solver called without one.

    Args:
        rhs: the right-hand side of the solve (its device decides None).
        vector_kernels: "torch" or "triton"; None picks Triton on a CUDA device where it is
            installed, else PyTorch.

    Returns:
        str: "torch" or "triton".

    Raises:
        ValueError: ``vector_kernels`` not one of :data:`VECTOR_KERNELS` or None.
        RuntimeError: "triton" where Triton cannot run on ``rhs``'s device.

    Example:
        >>> import torch
        >>> from dignn_kernels.solvers.cg_update import resolve_vector_kernels
        >>> resolve_vector_kernels(torch.zeros(3, 2), "torch")
        'torch'
    """
    if vector_kernels is None:
        vector_kernels = "triton" if rhs.is_cuda and _triton_runs(rhs) else "torch"
    if vector_kernels not in VECTOR_KERNELS:
        raise ValueError(f"vector_kernels must be one of {VECTOR_KERNELS} or None, got "
                         f"{vector_kernels!r}")
    if vector_kernels == "triton" and not _triton_runs(rhs):
        raise RuntimeError(f"vector_kernels='triton' cannot run on {rhs.device}: Triton needs "
                           f"a CUDA GPU (on the CPU its interpreter, TRITON_INTERPRET=1)")
    return vector_kernels


def cg_update_for(rhs: Tensor, vector_kernels: Optional[str] = None):
    """The update for ``rhs``'s device (:func:`resolve_vector_kernels`)."""
    if resolve_vector_kernels(rhs, vector_kernels) == "triton":
        return TritonCGUpdate
    return TorchCGUpdate
