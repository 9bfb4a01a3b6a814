"""The differentiable solve: one custom op, ``dignn::implicit_solve``, with one autograd
registration, for every backend and solver, and its entry :func:`implicit_diffusion`.

The op runs the equilibrium Z = X - (1/mu) Delta Z (paper eq. 17) with the chosen solver on
the chosen backend's passes; a backend with a fused solve
(:class:`~dignn_kernels.backends.interface.FusedSolve`) runs the fixed point in its own loop
instead. Its backward is implicit differentiation (appendix "Training for DIGNNs"): the
adjoint solve with the same solver, then dl/dx = u, dl/dchi_i = u_i . (x_i - z_i) / chi_i
and, for the neural Laplacian, dl/dp and dl/dq from the backend's gradient pass with
v = rs.u. Following PyTorch's extension-cpp example, the op is a ``torch.library`` custom op
with a fake kernel (so ``torch.compile`` traces the layer whole) and its backward is a second
custom op, so that it is traced too.

Beyond the first-order backward (issue 43), everything is more calls of the same solve:

- second derivatives: a backward that is itself differentiated (``create_graph=True``,
  ``torch.func``) does not run the backward op (its adjoint solve and gradient pass are not
  differentiable) but composes differentiable calls: the adjoint as the solve op on W^T
  (:func:`_transposed_adjoint`) and the gradient formulas as torch ops
  (:func:`_weight_gradients`, eq. 13-14 through
  :func:`~dignn_kernels.backends.pytorch.edge_weights_vjp`); the op is differentiable in the
  fixed edge values and kappa for that. A plain backward runs the backward op as before;
- forward-mode AD (``torch.func.jvp``, ``torch.autograd.forward_ad``): the tangent
  dZ = (I + Delta/mu)^-1 (dX - (1/mu) dDelta Z) is one more solve (:func:`_solve_jvp`).
  A ``torch.library`` op has no forward-mode formula, so eager calls go through an
  ``autograd.Function`` around it (:class:`_Solve`); ``torch.compile`` (whose Dynamo traces
  no Function with a jvp) calls the op itself and has no forward mode;
- ``torch.func.vmap`` (and ``jacrev``, ``jacfwd``, ``hessian``, which batch the solves of
  the backward and of the tangents): the op's batching rule solves each batch entry.

With a 16-bit ``storage_dtype`` (fixed point, on a backend whose
:attr:`~dignn_kernels.backends.interface.Backend.storage_dtypes` has it) the iterates of both
solves, and the z and v the gradient pass gathers, are stored in that dtype (:func:`_stored`);
the op returns z and the gradients in x's dtype. A fused solve whose ``storage_dtypes`` has
it runs such a solve with float32 x in its own loop, with the solvers' loop's results. The
projections p, q stay in x's dtype: the edge weights' derivatives in them (tanh(|p_i . p_j|),
with its kink at 0 and its saturation) turn a 16-bit rounding of p into errors of 2 %
(float16) to 55 % (bfloat16) on the Θ gradients (bench/results/storage_dtype_cpu.json,
"p_q_16bit_too"), and only two passes of a step read them, against some 18 row passes over
the iterates.
"""
import math
import warnings
import weakref
from typing import Optional, Tuple

import torch
from torch import Tensor

from ..backends import (BACKENDS, available_backends, check_backend_storage,
                        check_storage_dtype, get_backend)
from ..backends import pytorch as torch_passes
from ..backends.registration import differentiable_backward, run_without_autocast
from ..checks import (check_backend_device, check_flag, check_graph_data, check_int,
                      check_projection_range, check_same_device, check_scalars,
                      check_solve_args, check_tensors)
from .loops import (ANDERSON_WINDOW, DivergenceWarning, check_every_arg, default_check_every,
                    fixed_point_diverged, solve_adjoint, solve_forward)
from ..csr import csr_rows, transpose_csr
from ..laplacian import (check_inverse_mu, coefficient_overflow_message, guard_rows,
                         row_coefficients)
from .registry import check_solver_storage, get_solver
from .system import EquilibriumSystem

__all__ = ["implicit_diffusion", "resolve_solver", "host_reads_allowed", "backward_stats"]


# ------------------------------------------------------------ the adjoint's stats --
# The adjoint solve's stats, filed by the eager backward under the forward's stats tensor
# (an op may not change its outputs afterwards; under torch.compile nothing is filed).
# Keyed by id, dropped when that tensor dies.
_BACKWARD_STATS: "dict[int, tuple]" = {}


def _file_backward_stats(forward_stats: Tensor, stats: Tensor) -> None:
    key = id(forward_stats)
    ref = weakref.ref(forward_stats, lambda _, k=key: _BACKWARD_STATS.pop(k, None))
    _BACKWARD_STATS[key] = (ref, stats)


def backward_stats(forward_stats: Tensor) -> Optional[Tensor]:
    """The stats of the adjoint solve of a backward.

    Args:
        forward_stats: the stats tensor a forward returned (:func:`implicit_diffusion`'s
            second output).

    Returns:
        [iterations, residual, relative residual, diverged] (float64) of the adjoint solve of
        the backward that followed that forward; None before it ran (and under
        ``torch.compile``, where nothing is filed).

    Example:
        >>> import torch, dignn_kernels as dk
        >>> g = dk.build_graph(torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]]), 3)
        >>> w, chi, kappa = g.fixed_laplacian("rw", torch.float64)
        >>> x = torch.ones(3, 2, dtype=torch.float64, requires_grad=True)
        >>> z, stats = dk.implicit_diffusion(g.rowptr, g.col, w, x, chi, kappa=kappa, mu=2.2,
        ...                                  solver="cg", max_iter=50)
        >>> dk.backward_stats(stats) is None
        True
        >>> z.sum().backward()
        >>> dk.backward_stats(stats).shape
        torch.Size([4])
    """
    entry = _BACKWARD_STATS.get(id(forward_stats))
    if entry is None or entry[0]() is not forward_stats:
        return None
    return entry[1]


# ------------------------------------------------------------------ the custom op --

def _system(backend, rowptr, col, edge_value, chi, p, q, kappa, mu, eps, t_rowptr, t_col,
            t_perm, diag_index, w=None, symmetric=None):
    if p is not None:
        if w is None:
            w, kappa = backend.neural_edge_weights(rowptr, col, edge_value, p, q, eps)
    else:
        w = edge_value
        if kappa is None:  # row sums of the fixed weights, W 1 by the row pass (deterministic)
            n = chi.shape[0]
            ones = chi.new_ones(n)
            kappa = backend.csr_fma(rowptr, col, w, ones.view(n, 1), chi.new_zeros(n, 1),
                                     chi.new_zeros(n), ones).view(n)
    return EquilibriumSystem(backend, rowptr, col, w, chi, kappa, mu, t_rowptr=t_rowptr,
                             t_col=t_col, t_perm=t_perm, diag_index=diag_index,
                             symmetric=symmetric), w, kappa


def chi_gradient(u: Tensor, x: Tensor, z: Tensor, rs: Tensor, mu: float) -> Tensor:
    """dl/dchi_i = u_i . (x_i - z_i) / chi_i (= mu ca_i u_i . (x_i - z_i); 0 on guard rows)
    from the adjoint solution u."""
    return (u * (x - z)).sum(dim=1) * rs * mu


def edge_gradient_weights(u: Tensor, rs: Tensor) -> Tensor:
    """v = rs.u: the gradient pass's weights, dl/dW_ij = v_i . (z_j - z_i)."""
    return u * rs.unsqueeze(1)


def _effective_check_every(check_every: int, device: torch.device, solver: str) -> int:
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return 0  # no host reads inside a CUDA graph: a fixed max_iter sweeps
    return check_every if check_every >= 0 else default_check_every(device, solver)


def _fused(backend_name: str, solver: str, storage_dtype: Optional[torch.dtype], x: Tensor):
    """The backend's own fixed-point loop, where it runs this solve: fixed point, with
    iterates in the compute dtype or in a 16-bit dtype the loop stores (float32 x only); else
    None, the solvers' loop over the passes."""
    fused = get_backend(backend_name).fused_solve
    if solver != "fixed_point" or fused is None:
        return None
    if storage_dtype is not None and (storage_dtype not in fused.storage_dtypes
                                      or x.dtype != torch.float32):
        return None
    return fused


def _stored(t: Optional[Tensor], storage_dtype: Optional[torch.dtype]) -> Optional[Tensor]:
    """``t`` as the passes take it: in ``storage_dtype`` when one is given."""
    return t if t is None or storage_dtype is None else t.to(storage_dtype)


# A right-hand side whose largest magnitude lies in this range is solved as it is: no squared
# norm, dot product or Gram sum of a solve (all in x's dtype, some summed in float64) can then
# overflow or lose its terms to underflow in float32 (2^40 n d < 3.4e38; 2^-40 * 2^-40 is far
# above float32's smallest normal 2^-126 for the differences of a converged solve).
_UNSCALED = (2.0 ** -20, 2.0 ** 20)
# With float16 storage the iterates themselves must fit float16 (largest 65504, smallest
# normal 2^-14): the right-hand side is always brought to max|t| in [1, 2), which leaves the
# iterates 2^15-fold growth before they overflow and keeps its entries down to 2^-14 max|t|
# normal. (bfloat16 has float32's exponent range: _UNSCALED holds for it.)
_UNSCALED_FLOAT16 = (1.0, 2.0)


def _rescaling(t: Tensor, storage_dtype: Optional[torch.dtype] = None):
    """(scale, unscale) for a solve with right-hand side ``t``, or None: powers of two with
    max|t| * scale in [1, 2). The equilibrium (paper eq. 17) and its adjoint are linear in
    their right-hand side, and a power of two scales every iterate, norm and dot product
    exactly, so the solve of t * scale times unscale is the solve of t, bit for bit, except
    that nothing overflows (features near 1e30 in float32: 1e60 squares; float16 iterates
    past 65504) or underflows.
    On the CPU max|t| is read on the host (free there) and t in the range of ``_UNSCALED``
    (``_UNSCALED_FLOAT16`` with float16 storage) is left as it is; on a device it stays there
    (0-dim tensors, no sync)."""
    if t.numel() == 0 or t.dtype not in (torch.float32, torch.float64):
        return None
    low, high = torch.aminmax(t)  # (a twentieth of vector_norm(ord=inf)'s time on the CPU)
    amax = torch.maximum(-low, high)
    limit = 126 if t.dtype == torch.float32 else 1022  # 2^-limit and 2^limit both normal
    if t.device.type == "cpu":
        m = float(amax)
        unscaled = _UNSCALED_FLOAT16 if storage_dtype == torch.float16 else _UNSCALED
        if not math.isfinite(m) or m == 0.0 or unscaled[0] <= m <= unscaled[1]:
            return None
        k = max(-limit, min(limit, math.frexp(m)[1] - 1))
        return 2.0 ** -k, 2.0 ** k
    exponent = torch.frexp(amax).exponent - 1
    k = torch.where(torch.isfinite(amax) & (amax > 0), exponent, 0).clamp(-limit, limit)
    one = torch.ones((), dtype=t.dtype, device=t.device)
    return torch.ldexp(one, -k), torch.ldexp(one, k)


def _unscaled_stats(stats: Tensor, unscale) -> Tensor:
    """A solve's stats with its residual (entry 1) back in the right-hand side's units."""
    factor = torch.ones_like(stats)
    factor[1] = unscale if isinstance(unscale, float) else unscale.double()
    return stats * factor


def _with_flag(stats: Tensor, flag: Tensor) -> Tensor:
    """A fused loop's [iterations, residual, relative] with the diverged flag appended."""
    return torch.cat([stats, flag.reshape(1).to(stats.dtype)])


def _forward(rowptr, col, edge_value, x, chi, p, q, kappa, t_rowptr, t_col, t_perm, diag_index,
             mu, eps, max_iter, tol, solver, backend, check_every, window, storage_dtype):
    """The forward solve of :func:`_implicit_solve` (x rescaled there where needed)."""
    fused = _fused(backend, solver, storage_dtype, x)
    if fused is not None:
        z, w, kappa_out, stats = fused.forward(rowptr, col, edge_value, x, chi, p, q, kappa, mu,
                                               eps, max_iter, tol, t_rowptr, t_col, t_perm,
                                               storage_dtype)
        diverged = fixed_point_diverged(x, z, chi, rowptr, t_rowptr is None, storage_dtype)
        return z, (w if p is not None else x.new_empty(0)), kappa_out, \
            _with_flag(stats, diverged)
    system, w, kappa_out = _system(get_backend(backend), rowptr, col, edge_value, chi, p, q,
                                   kappa, mu, eps, t_rowptr, t_col, t_perm, diag_index)
    out = solve_forward(system, x, solver, max_iter=max_iter, tol=tol,
                        check_every=_effective_check_every(check_every, x.device, solver),
                        window=window, storage_dtype=storage_dtype)
    w_out = w if p is not None else x.new_empty(0)
    return out.solution.to(x.dtype), w_out, \
        kappa_out.clone() if kappa_out is kappa else kappa_out, out.stats()


@torch.library.custom_op("dignn::implicit_solve", mutates_args=())
def _implicit_solve(rowptr: Tensor, col: Tensor, edge_value: Tensor, x: Tensor, chi: Tensor,
                    p: Optional[Tensor], q: Optional[Tensor], kappa: Optional[Tensor],
                    t_rowptr: Optional[Tensor], t_col: Optional[Tensor],
                    t_perm: Optional[Tensor], diag_index: Optional[Tensor], mu: float,
                    eps: float, max_iter: int, tol: float, solver: str, backend: str,
                    check_every: int, window: int, storage_dtype: Optional[torch.dtype] = None
                    ) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """The equilibrium with ``solver`` on the passes of ``backend``. Returns (z, w, kappa,
    stats): w the neural edge weights (empty for fixed weights), kappa the diagonal of L,
    stats = [iterations, residual, relative residual, diverged] (float64, on x's device)."""
    if storage_dtype is not None:
        check_backend_storage(backend, storage_dtype)
    rescaling = _rescaling(x, storage_dtype)
    if rescaling is None:
        return _forward(rowptr, col, edge_value, x, chi, p, q, kappa, t_rowptr, t_col, t_perm,
                        diag_index, mu, eps, max_iter, tol, solver, backend, check_every,
                        window, storage_dtype)
    scale, unscale = rescaling  # features whose squares would overflow (or underflow)
    z, w, kappa_out, stats = _forward(rowptr, col, edge_value, x * scale, chi, p, q, kappa,
                                      t_rowptr, t_col, t_perm, diag_index, mu, eps, max_iter,
                                      tol, solver, backend, check_every, window, storage_dtype)
    return z * unscale, w, kappa_out, _unscaled_stats(stats, unscale)


@_implicit_solve.register_fake
def _(rowptr, col, edge_value, x, chi, p, q, kappa, t_rowptr, t_col, t_perm, diag_index, mu,
      eps, max_iter, tol, solver, backend, check_every, window, storage_dtype=None):
    # one stray meta tensor among real ones makes the dispatcher pick this kernel
    check_same_device("dignn::implicit_solve", rowptr=rowptr, col=col, edge_value=edge_value,
                      x=x, chi=chi, p=p, q=q, kappa=kappa, t_rowptr=t_rowptr, t_col=t_col,
                      t_perm=t_perm, diag_index=diag_index)
    w = x.new_empty(col.shape[0]) if p is not None else x.new_empty(0)
    stats = torch.empty(4, dtype=torch.float64, device=x.device)
    return torch.empty_like(x), w, x.new_empty(rowptr.shape[0] - 1), stats


def _backward(rowptr, col, edge_value, w, kappa, t_rowptr, t_col, t_perm, diag_index, x, chi,
              p, q, z, grad_z, mu, eps, max_iter, tol, solver, backend, check_every, window,
              storage_dtype):
    """The backward of :func:`_implicit_solve_backward` (grad_z rescaled there where
    needed)."""
    fused = _fused(backend, solver, storage_dtype, x)
    neural = p is not None
    if fused is not None:
        grad_x, grad_chi, grad_p, grad_q, stats = fused.backward(
            rowptr, col, edge_value, w if neural else edge_value, kappa, t_rowptr, t_col,
            t_perm, x, chi, p, q, z, grad_z.contiguous(), mu, eps, max_iter, tol, storage_dtype)
        return grad_x, grad_chi, grad_p, grad_q, _with_flag(stats, ~torch.isfinite(stats[1]))
    passes = get_backend(backend)
    system, _, _ = _system(passes, rowptr, col, edge_value, chi, p, q, kappa, mu, eps,
                           t_rowptr, t_col, t_perm, diag_index, w=w if neural else None)
    out = solve_adjoint(system, grad_z.contiguous(), solver, max_iter=max_iter, tol=tol,
                        check_every=_effective_check_every(check_every, x.device, solver),
                        window=window, storage_dtype=storage_dtype)
    u = out.solution
    grad_chi = chi_gradient(u.to(x.dtype), x, z, system.rs, mu)
    if neural:
        v = _stored(edge_gradient_weights(u, system.rs), storage_dtype)
        grad_p, grad_q = passes.neural_weight_grad(rowptr, col, edge_value, p, q,
                                              _stored(z, storage_dtype), v, eps, t_rowptr,
                                              t_col, t_perm)
    else:
        grad_p, grad_q = x.new_empty(0), x.new_empty(0)
    return u.to(x.dtype), grad_chi, grad_p, grad_q, out.stats()


@torch.library.custom_op("dignn::implicit_solve_backward", mutates_args=())
def _implicit_solve_backward(rowptr: Tensor, col: Tensor, edge_value: Tensor, w: Tensor,
                             kappa: Tensor, t_rowptr: Optional[Tensor],
                             t_col: Optional[Tensor], t_perm: Optional[Tensor],
                             diag_index: Optional[Tensor], x: Tensor, chi: Tensor,
                             p: Optional[Tensor], q: Optional[Tensor], z: Tensor,
                             grad_z: Tensor, mu: float, eps: float, max_iter: int, tol: float,
                             solver: str, backend: str, check_every: int, window: int,
                             storage_dtype: Optional[torch.dtype] = None
                             ) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Implicit differentiation: the adjoint solve with the same solver, then dl/dx = u,
    dl/dchi_i = u_i . (x_i - z_i) / chi_i, and for the neural Laplacian dl/dp, dl/dq from the
    gradient pass with v = rs.u. Returns (grad_x, grad_chi, grad_p, grad_q, stats); grad_p
    and grad_q are empty for fixed weights. With ``storage_dtype`` the adjoint iterates and
    the z, v the gradient pass reads are in that dtype, the results in x's."""
    if storage_dtype is not None:
        check_backend_storage(backend, storage_dtype)
    rescaling = _rescaling(grad_z, storage_dtype)
    # float16 storage: the gradient pass reads z in float16 too, so z (and x, with the same
    # power of two, for x - z) is brought into its range; dl/dchi, dl/dp and dl/dq are linear
    # in (x, z) jointly, dl/dx = u does not depend on them
    z_rescaling = _rescaling(z, storage_dtype) if storage_dtype == torch.float16 else None
    if rescaling is None and z_rescaling is None:
        return _backward(rowptr, col, edge_value, w, kappa, t_rowptr, t_col, t_perm,
                         diag_index, x, chi, p, q, z, grad_z, mu, eps, max_iter, tol, solver,
                         backend, check_every, window, storage_dtype)
    scale, unscale = rescaling if rescaling is not None else (1.0, 1.0)  # linear in grad_z
    z_scale, z_unscale = z_rescaling if z_rescaling is not None else (1.0, 1.0)
    grad_x, *grads, stats = _backward(
        rowptr, col, edge_value, w, kappa, t_rowptr, t_col, t_perm, diag_index, x * z_scale,
        chi, p, q, z * z_scale, grad_z * scale, mu, eps, max_iter, tol, solver, backend,
        check_every, window, storage_dtype)
    return (grad_x * unscale, *(g * (unscale * z_unscale) for g in grads),
            _unscaled_stats(stats, unscale))


@_implicit_solve_backward.register_fake
def _(rowptr, col, edge_value, w, kappa, t_rowptr, t_col, t_perm, diag_index, x, chi, p, q, z,
      grad_z, mu, eps, max_iter, tol, solver, backend, check_every, window,
      storage_dtype=None):
    check_same_device("dignn::implicit_solve_backward", rowptr=rowptr, col=col,
                      edge_value=edge_value, w=w, kappa=kappa, t_rowptr=t_rowptr, t_col=t_col,
                      t_perm=t_perm, diag_index=diag_index, x=x, chi=chi, p=p, q=q, z=z,
                      grad_z=grad_z)
    grad_p = torch.empty_like(p) if p is not None else x.new_empty(0)
    grad_q = torch.empty_like(q) if q is not None else x.new_empty(0)
    return (torch.empty_like(x), torch.empty_like(chi), grad_p, grad_q,
            torch.empty(4, dtype=torch.float64, device=x.device))


# ------------------------------------------------------------------ derivatives --
# Positions of the op's differentiable inputs (the backward's gradients, the jvp's tangents);
# the op takes _OP_ARGS arguments, the eager Function (_Solve) host_checks after them.
_EDGE_VALUE, _X, _CHI, _P, _Q, _KAPPA = 2, 3, 4, 5, 6, 7
_OP_ARGS = 21


def _solve_setup_context(ctx, inputs, output):
    """Saves what the backward and the jvp read; returns it."""
    (rowptr, col, edge_value, x, chi, p, q, kappa_in, t_rowptr, t_col, t_perm, diag_index, mu,
     eps, max_iter, tol, solver, backend, check_every, window,
     storage_dtype) = inputs[:_OP_ARGS]
    z, w, kappa, stats = output
    ctx.mark_non_differentiable(w, kappa, stats)
    saved = (rowptr, col, edge_value, w, kappa, t_rowptr, t_col, t_perm, diag_index, x, chi, p,
             q, z, kappa_in)
    ctx.save_for_backward(*saved)
    ctx.config = (mu, eps, max_iter, tol, solver, backend, check_every, window, storage_dtype)
    ctx.stats_key = weakref.ref(stats) if type(stats) is torch.Tensor else None
    ctx.neural = p is not None
    ctx.host_checks = False
    return saved


def _differentiable_weights(rowptr: Tensor, col: Tensor, edge_value: Tensor,
                            p: Optional[Tensor], q: Optional[Tensor],
                            kappa_in: Optional[Tensor], eps: float) -> Tuple[Tensor, Tensor]:
    """(W, kappa) of the solve as torch ops, differentiable in the edge values, p, q and
    kappa: eq. 13-14 for the neural Laplacian (the plain-PyTorch backend's), else the fixed
    W with the given kappa or its row sums."""
    if p is not None:
        return torch_passes.neural_edge_weights(rowptr, col, edge_value, p, q, eps)
    if kappa_in is not None:
        return edge_value, kappa_in
    rows = csr_rows(rowptr, col.shape[0])
    return edge_value, edge_value.new_zeros(rowptr.shape[0] - 1).index_add(0, rows, edge_value)


def _weight_gradients(rowptr: Tensor, col: Tensor, edge_value: Tensor, p: Optional[Tensor],
                      q: Optional[Tensor], kappa_in: Optional[Tensor], z: Tensor, u: Tensor,
                      rs: Tensor, eps: float, with_edge_value: bool):
    """(dl/d edge_value, dl/dp, dl/dq, dl/dkappa) from the adjoint solution u = dl/dx, as torch
    ops (differentiable again). With v = rs.u, Z = X + cy.Z + rs.(W Z) (eq. iter) gives
    dl/dW_ij = v_i . z_j and dl/dkappa_i = -v_i . z_i; where kappa = W 1 (neural, or fixed
    weights without kappa) dl/dW_ij = v_i . (z_j - z_i), and for the neural Laplacian that
    goes through eq. 13-14 to a, p and q. None for what does not apply."""
    rows, cols = csr_rows(rowptr, col.shape[0]), col.long()
    v = edge_gradient_weights(u, rs)
    grad_w = (v[rows] * z[cols]).sum(dim=1)
    grad_kappa = -(v * z).sum(dim=1)
    if p is not None or kappa_in is None:
        grad_w = grad_w + grad_kappa[rows]
    if p is not None:
        grad_a, grad_p, grad_q = torch_passes.edge_weights_vjp(rowptr, col, edge_value, p, q,
                                                               eps, grad_w, with_edge_value)
        return grad_a, grad_p, grad_q, None
    return grad_w, None, None, grad_kappa if kappa_in is not None else None


def _transposed_adjoint(rowptr: Tensor, col: Tensor, w: Tensor, kappa: Tensor, chi: Tensor,
                        g: Tensor, t_rowptr: Optional[Tensor], t_col: Optional[Tensor],
                        t_perm: Optional[Tensor], config: tuple) -> Tuple[Tensor, Tensor]:
    """The adjoint u = (I + Delta^T/mu)^-1 g as a differentiable call of the same solve, and
    its stats. Delta^T = (K - W^T) R with R = C^-1 (0 on guard rows), so v = R u solves
    v = R g - (1/mu) R (K - W^T) v: the equilibrium of eq. 17 on W^T with right-hand side
    R g (guard rows: R g = 0, kept, so v_i = 0), and u = g - (1/mu) (K - W^T) v on every row
    (on a diffusing row that is chi_i v_i). W^T is the transposed CSR with the values
    W[t_perm] (also on a symmetric graph, so that each entry's derivative reaches its own
    edge); its own transpose is the CSR of W."""
    n, m = chi.shape[0], col.shape[0]
    if t_rowptr is None:  # a symmetric W: W^T in the CSR of the transpose, itself symmetric
        t_rowptr, t_col, t_perm = transpose_csr(rowptr, col, n)
        back = (None, None, None)
    else:
        inverse = torch.empty_like(t_perm).scatter_(
            0, t_perm, torch.arange(m, dtype=t_perm.dtype, device=t_perm.device))
        back = (rowptr, col, inverse)
    guard = guard_rows(chi)
    inv_chi = torch.where(guard, torch.zeros_like(chi),
                          1.0 / torch.where(guard, torch.ones_like(chi), chi))
    v, _, _, stats = _Solve.apply(t_rowptr, t_col, w[t_perm], g * inv_chi.unsqueeze(1), chi,
                                  None, None, kappa, *back, None, *config, False)
    rows, cols = csr_rows(rowptr, m), col.long()
    wt_v = v.new_zeros(v.shape).index_add(0, cols, w.unsqueeze(1) * v[rows])  # W^T v
    return g - (kappa.unsqueeze(1) * v - wt_v) / config[0], stats


def _solve_backward(ctx, grad_z, grad_w=None, grad_kappa=None, grad_stats=None):
    """The backward of the solve (the op's registered formula and the eager Function's): the
    adjoint solve u = (I + Delta^T/mu)^-1 grad_z and the gradient formulas. A plain backward
    runs the backward op (the backend's adjoint solve and gradient pass, not
    differentiable); one that is differentiated again (``create_graph=True``, torch.func, or
    forward-mode AD through it) composes differentiable calls instead: the adjoint as a solve
    of the same op on W^T (:func:`_transposed_adjoint`) and the gradient formulas as torch
    ops (:func:`_weight_gradients`), which gives exact second derivatives."""
    if grad_z is None:
        return (None,) * _OP_ARGS
    saved = ctx.saved_tensors
    (rowptr, col, edge_value, w, kappa, t_rowptr, t_col, t_perm, diag_index, x, chi, p, q, z,
     kappa_in) = saved
    mu, eps, storage_dtype = ctx.config[0], ctx.config[1], ctx.config[-1]
    needs = ctx.needs_input_grad
    with_edge = needs[_EDGE_VALUE]
    with_kappa = needs[_KAPPA] and not ctx.neural and kappa_in is not None
    if differentiable_backward():
        w_d, kappa_d = _differentiable_weights(rowptr, col, edge_value, p, q, kappa_in, eps)
        grad_x, stats = _transposed_adjoint(rowptr, col, w_d, kappa_d, chi, grad_z, t_rowptr,
                                            t_col, t_perm, ctx.config)
        rs = row_coefficients(chi, kappa_d, mu)[1]
        grad_chi = chi_gradient(grad_x, x, z, rs, mu)
        grad_edge, grad_p, grad_q, grad_kappa_in = _weight_gradients(
            rowptr, col, edge_value, p, q, kappa_in, z, grad_x, rs, eps, with_edge)
    else:
        grad_x, grad_chi, grad_p, grad_q, stats = torch.ops.dignn.implicit_solve_backward(
            *saved[:14], grad_z, *ctx.config)
        grad_edge = grad_kappa_in = None
        if with_edge or with_kappa:  # (only for a caller whose edge values need gradients)
            rs = row_coefficients(chi, kappa, mu)[1]
            grad_edge, _, _, grad_kappa_in = _weight_gradients(
                rowptr, col, edge_value, p, q, kappa_in, z, grad_x, rs, eps, with_edge)
    forward_stats = ctx.stats_key() if ctx.stats_key is not None else None
    if forward_stats is not None:
        _file_backward_stats(forward_stats, stats)
    if ctx.host_checks and storage_dtype == torch.float16:
        _check_storage_overflow(stats, storage_dtype, "the adjoint solve of the backward",
                                dict(grad_z=grad_z, x=x, z=z, chi=chi, edge_value=edge_value,
                                     p=p, q=q, kappa=kappa))
    grads = [None] * _OP_ARGS
    grads[_EDGE_VALUE] = grad_edge if with_edge else None
    grads[_X], grads[_CHI] = grad_x, grad_chi
    if ctx.neural:
        grads[_P], grads[_Q] = grad_p, grad_q
    grads[_KAPPA] = grad_kappa_in if with_kappa else None
    return tuple(grads)


def _solve_jvp(ctx, *tangents):
    """The tangent of z (forward-mode AD): differentiating (I + Delta/mu) Z = X gives
    (I + Delta/mu) dZ = dX - (1/mu) dDelta Z, one more solve of the same op. With
    Delta Z = mu (X - Z) on diffusing rows and Delta = C^-1 (K - W),
    -(1/mu) dDelta Z = (dchi/chi) (X - Z) - rs.(dkappa Z - dW Z) (rs = 1/(mu chi), 0 on guard
    rows, whose z_i = x_i gives dz_i = dx_i); dW from the tangents of a, p, q through
    eq. 13-14 (dkappa = dW 1) or of the fixed W and kappa. All of it differentiable calls, so
    the tangent can be differentiated again (torch.func.hessian)."""
    (rowptr, col, edge_value, w, kappa, t_rowptr, t_col, t_perm, diag_index, x, chi, p, q, z,
     kappa_in) = ctx.saved_tensors
    mu, eps = ctx.config[0], ctx.config[1]
    d_edge, dx, dchi, dp, dq, dkappa = (tangents[i] for i in
                                        (_EDGE_VALUE, _X, _CHI, _P, _Q, _KAPPA))
    n, m = chi.shape[0], col.shape[0]
    rows, cols = csr_rows(rowptr, m), col.long()
    w_d, kappa_d = _differentiable_weights(rowptr, col, edge_value, p, q, kappa_in, eps)
    rs = row_coefficients(chi, kappa_d, mu)[1]
    if p is not None:
        dw = None if d_edge is None and dp is None and dq is None else \
            torch_passes.edge_weights_jvp(rowptr, col, edge_value, p, q, eps, d_edge, dp, dq)
        dk = None
    else:
        dw, dk = d_edge, dkappa if kappa_in is not None else None
    if dk is None and dw is not None and (p is not None or kappa_in is None):
        dk = dw.new_zeros(n).index_add(0, rows, dw)  # kappa = W 1
    rhs = dx if dx is not None else torch.zeros_like(z)
    if dchi is not None:
        rhs = rhs + (mu * rs * dchi).unsqueeze(1) * (x - z)
    if dw is not None:
        dw_z = z.new_zeros(z.shape).index_add(0, rows, dw.unsqueeze(1) * z[cols])
        rhs = rhs + rs.unsqueeze(1) * dw_z
    if dk is not None:
        rhs = rhs - (rs * dk).unsqueeze(1) * z
    dz = _Solve.apply(rowptr, col, w_d, rhs, chi, None, None, kappa_d, t_rowptr, t_col, t_perm,
                      diag_index, *ctx.config, False)[0]
    return dz, None, None, None


torch.library.register_autograd("dignn::implicit_solve", _solve_backward,
                                setup_context=_solve_setup_context)
run_without_autocast("dignn::implicit_solve")
run_without_autocast("dignn::implicit_solve_backward")


class _Solve(torch.autograd.Function):
    """``dignn::implicit_solve`` as eager calls take it (:func:`implicit_diffusion` outside
    ``torch.compile``): the op's backward (:func:`_solve_backward`), plus the tangent of
    forward-mode AD (:func:`_solve_jvp`; a ``torch.library`` op has no forward-mode formula,
    and Dynamo traces no Function with one, so compiled graphs call the op itself) and the
    torch.func transforms (vmap through the op's batching rule). Takes the op's arguments and
    ``host_checks`` (whether the backward may read its stats on the host)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(*args):
        return torch.ops.dignn.implicit_solve(*args[:_OP_ARGS])

    @staticmethod
    def setup_context(ctx, inputs, output):
        saved = _solve_setup_context(ctx, inputs, output)
        ctx.save_for_forward(*saved)
        ctx.host_checks = inputs[_OP_ARGS]

    @staticmethod
    def backward(ctx, grad_z, grad_w, grad_kappa, grad_stats):
        return _solve_backward(ctx, grad_z) + (None,)

    @staticmethod
    def jvp(ctx, *tangents):
        return _solve_jvp(ctx, *tangents)


def _batch_by_loop(op_name: str, depends: dict) -> None:
    """Registers the op's batching rule (torch.func.vmap, and jacrev / jacfwd / hessian,
    which batch the backward's and the jvp's solves): one solve per batch entry, so each
    keeps its own stopping test, and the outputs stacked. Output k of ``depends`` depends only
    on the inputs it lists: unbatched when they are (the edge weights of a batch of
    right-hand sides; nested transforms take them unbatched); the stats (the last output) are
    those of the worst entry, [most iterations, largest residual, largest relative residual,
    any diverged], unbatched, so that a caller may still read them on the host."""
    op = getattr(torch.ops.dignn, op_name)

    def rule(info, in_dims, *args):
        outs = [op(*(a.select(d, b) if d is not None else a for a, d in zip(args, in_dims)))
                for b in range(info.batch_size)]
        *fields, stats = zip(*outs)
        shared = [k in depends and all(in_dims[i] is None for i in depends[k])
                  for k in range(len(fields))]
        return (tuple(f[0] if one else torch.stack(f) for f, one in zip(fields, shared))
                + (torch.stack(stats).amax(0),),
                tuple(None if one else 0 for one in shared) + (None,))

    torch.library.register_vmap(f"dignn::{op_name}", rule)


# (w and kappa: of the edge values, p, q and the given kappa alone)
_batch_by_loop("implicit_solve", {1: (_EDGE_VALUE, _P, _Q),
                                  2: (_EDGE_VALUE, _P, _Q, _KAPPA)})
_batch_by_loop("implicit_solve_backward", {})


# ------------------------------------------------------------------ the entry point --

def resolve_solver(solver: str, symmetric: bool) -> str:
    """The solver that will run.

    A solver of the SPD form (``cg``, registered with ``spd=True``) needs a symmetric W: on a
    directed graph or with asymmetric edge values ``anderson`` runs instead, with a warning.

    Args:
        solver: a registered solver's name.
        symmetric: whether the graph's W is symmetric.

    Returns:
        The name of the solver that runs.

    Raises:
        ValueError: ``solver`` is not registered.

    Example:
        >>> import warnings
        >>> from dignn_kernels.solvers import resolve_solver
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore")
        ...     resolve_solver("cg", symmetric=False)
        'anderson'
    """
    if get_solver(solver).spd and not symmetric:
        warnings.warn(
            f"solver={solver!r} needs a symmetric W (an undirected graph with a_ij == a_ji): "
            f"only then is (C + L/mu) Z = C X a symmetric positive definite system. This graph "
            f"is directed or has asymmetric edge values, so solver='anderson' runs instead. "
            f"Symmetrize the graph (torch_geometric.utils.to_undirected) to use {solver}, or "
            f"pass solver='anderson' to silence this.", UserWarning, stacklevel=3)
        return "anderson"
    return solver


def _vmapped(t: Tensor) -> bool:
    """Whether ``t`` is batched by torch.func.vmap at some level of the functorch wrappers
    around it (its values then differ per batch entry: none can be read as one)."""
    functorch = torch._C._functorch
    while functorch.is_functorch_wrapped_tensor(t):
        if functorch.is_batchedtensor(t):
            return True
        t = functorch.get_unwrapped(t)
    return False


def host_reads_allowed(x: Tensor) -> bool:
    """Whether a value of ``x``'s device may be read on the host now: not while tracing for
    torch.compile, not while a CUDA graph is being captured, not of a tensor batched by
    torch.func.vmap. ``is_compiling`` comes first, so that Dynamo never traces the capture
    query (it cannot, and fullgraph=True would fail)."""
    if torch.compiler.is_compiling():
        return False
    return not (x.is_cuda and torch.cuda.is_current_stream_capturing()) and not _vmapped(x)


def _nonfinite_inputs(inputs: dict) -> list:
    """'name (k of N entries)' of each tensor in ``inputs`` that holds NaN or Inf."""
    found = []
    for name, t in inputs.items():
        if t is None or not t.is_floating_point() or t.numel() == 0:
            continue
        bad = int((~torch.isfinite(t)).sum())
        if bad:
            found.append(f"{name} ({bad} of {t.numel()} entries)")
    return found


def _storage_overflow_message(storage_dtype: torch.dtype, what: str) -> str:
    big = torch.finfo(storage_dtype).max
    return (f"storage_dtype={storage_dtype} overflowed in {what}: its iterates, stored in "
            f"{storage_dtype} (largest value {big:g}), are not finite although every input "
            f"is. The solve first scales its right-hand side by a power of two to a largest "
            f"magnitude in [1, 2) (exact: the equilibrium is linear in it), so the iterates "
            f"grew more than {big / 2:g}-fold: a fixed point that diverges (mu below "
            f"lambda_max(Delta)) or a solution beyond {storage_dtype}'s range. Use "
            f"storage_dtype=torch.bfloat16 (float32's range) or None, or raise mu.")


def _check_storage_overflow(stats: Tensor, storage_dtype: Optional[torch.dtype], what: str,
                            inputs: dict) -> None:
    """A ValueError naming ``storage_dtype`` where a solve whose iterates it stores ended
    with a residual that is not finite from finite ``inputs`` (name -> tensor, read only
    then): the iterates overflowed the storage dtype (float16; bfloat16 has float32's range).
    Reads the stats on the host."""
    if storage_dtype != torch.float16 or math.isfinite(float(stats[1])):
        return
    if not _nonfinite_inputs(inputs):
        raise ValueError(_storage_overflow_message(storage_dtype, what))


def warn_if_diverged(stats: Tensor, solver: str, mu: float, tol: float,
                     stacklevel: int = 3, inputs: Optional[dict] = None,
                     coefficients: Optional[Tuple[Tensor, Tensor]] = None,
                     storage_dtype: Optional[torch.dtype] = None) -> None:
    """Reads a solve's stats on the host and warns (:class:`DivergenceWarning`) when it
    diverged or ended no better than it started: naming the inputs that hold NaN or Inf
    (``inputs``: name -> tensor, read only then), else naming mu. With ``coefficients``
    (chi, kappa) a ValueError names mu where the row coefficients 1/(mu chi), kappa/(mu chi)
    overflow the compute dtype; a residual that overflowed from finite inputs names x, or,
    with float16 ``storage_dtype``, is a ValueError naming the storage dtype."""
    iterations, residual, relative, diverged = stats.tolist()
    failed = (diverged and solver == "fixed_point") or (
        solver != "fixed_point" and (diverged or (relative > 1.0 and relative > tol))) or \
        not (math.isfinite(residual) and math.isfinite(relative))  # (an Inf in x: inf / inf)
    if not failed:
        return
    if inputs is not None:
        bad = _nonfinite_inputs(inputs)
        if bad:
            warnings.warn(
                f"solver={solver!r} gave no finite equilibrium because its input holds NaN or "
                f"Inf: {', '.join(bad)}. The output is not the equilibrium; mu={mu:g} is not "
                f"the cause. Replace the non-finite values (torch.nan_to_num, or find where "
                f"they come from).", DivergenceWarning, stacklevel=stacklevel + 1)
            return
    if coefficients is not None:
        message = coefficient_overflow_message(*coefficients, mu)
        if message is not None:
            raise ValueError(message)
    if storage_dtype == torch.float16 and not math.isfinite(residual):
        raise ValueError(_storage_overflow_message(storage_dtype, f"the {solver} solve"))
    # cg's SPD system converges for every mu > 0: a residual that is not finite from finite
    # inputs is an overflow (the fixed point and Anderson may also have diverged: mu is named)
    if solver == "cg" and not math.isfinite(residual) and inputs is not None and "x" in inputs:
        x = inputs["x"]
        warnings.warn(
            f"solver={solver!r} overflowed in {x.dtype}: its residual or dot products are not "
            f"finite although every input is (max|x| = "
            f"{float(torch.linalg.vector_norm(x.detach().double(), ord=math.inf)):.3g}; the "
            f"squared norms of the residual of the SPD form (C + L/mu) Z = C X, chi and the "
            f"edge values times x, exceed {x.dtype}'s range). The output is not the equilibrium. "
            f"Compute in torch.float64, or rescale x and the edge values.", DivergenceWarning,
            stacklevel=stacklevel + 1)
        return
    if diverged and solver == "fixed_point":
        warnings.warn(
            f"solver='fixed_point' diverged at mu={mu:g}: the iteration Z <- X - (1/mu) Delta Z "
            f"only converges when mu > lambda_max(Delta) (the paper's well-posedness "
            f"corollary), and mu={mu:g} is below lambda_max here, so the output is not the "
            f"equilibrium. Use solver='cg' (converges for every mu > 0 on undirected graphs) or "
            f"solver='anderson', or raise mu.", DivergenceWarning, stacklevel=stacklevel + 1)
    else:
        warnings.warn(
            f"solver={solver!r} did not converge at mu={mu:g}: relative residual "
            f"{relative:.3g} after {int(iterations)} sweeps (no better than the start). "
            f"Raise max_iter" + (", or use solver='cg' on an undirected graph"
                                 if solver == "anderson" else "") + ".",
            DivergenceWarning, stacklevel=stacklevel + 1)


def implicit_diffusion(rowptr: Tensor, col: Tensor, edge_value: Tensor, x: Tensor, chi: Tensor,
                       p: Optional[Tensor] = None, q: Optional[Tensor] = None,
                       kappa: Optional[Tensor] = None, *, mu: float, eps: float = 1e-6,
                       max_iter: int = 10, tol: float = 1e-6, solver: str = "fixed_point",
                       backend: Optional[str] = None, check_every: Optional[int] = None,
                       window: int = ANDERSON_WINDOW, t_rowptr: Optional[Tensor] = None,
                       t_col: Optional[Tensor] = None, t_perm: Optional[Tensor] = None,
                       diag_index: Optional[Tensor] = None,
                       host_checks: Optional[bool] = None,
                       trusted: bool = False,
                       storage_dtype: Optional[torch.dtype] = None) -> Tuple[Tensor, Tensor]:
    """The differentiable equilibrium Z = X - (1/mu) Delta Z (paper eq. 17), differentiable in
    x, chi, p and q (and in fixed edge values and kappa) by implicit differentiation: in
    reverse mode to any order (``create_graph=True``: second derivatives, Hessian-vector
    products), in forward mode (``torch.func.jvp``, ``torch.autograd.forward_ad``; not
    under ``torch.compile``) and under ``torch.func.vmap`` / ``jacrev`` / ``jacfwd`` /
    ``hessian``.

    The fixed point stops once ||Z_t - Z_{t-1}||_F <= tol ||Z_t||_F; ``cg`` and ``anderson``
    once ||X - Z - Delta Z/mu||_F <= tol ||X||_F (the backward: the adjoint's residual
    relative to ||g||_F). A diverging or non-converging solve gives a
    :class:`DivergenceWarning` naming mu.

    Args:
        rowptr: the CSR row pointers of the graph (n + 1).
        col: the CSR column indices.
        edge_value: the neural Laplacian's edge values a when ``p`` and ``q`` are given, else
            the fixed weights W.
        x: the features X (n x d, float32 or float64).
        chi: the node weights chi (n).
        p: the neural Laplacian's projections p (n x h), or None for fixed weights.
        q: its projections q (n x h), or None.
        kappa: the diagonal of L for fixed weights (None: the row sums of W).
        mu: the source-constraint strength, > 0.
        eps: the epsilon of eq. 14.
        max_iter: the most iterations: the fixed point counts its iterations (Z_1 = X the
            first), the other solvers their CSR sweeps.
        tol: the relative stopping tolerance (above).
        solver: a registered solver (:data:`dignn_kernels.solvers.SOLVERS`):
            ``"fixed_point"`` (the paper's iteration from Z_0 = 0), ``"cg"`` (symmetric W
            only: pass no t_*; directed graphs fall back to ``"anderson"`` with a warning) or
            ``"anderson"``.
        backend: whose passes run it, a name of :data:`dignn_kernels.backends.BACKENDS`
            (default: ``"cuda"`` for CUDA tensors, else ``"cpu"``).
        check_every: host reads of the convergence flag (None: every sweep on the CPU, see
            :func:`~dignn_kernels.solvers.default_check_every`; 0: always ``max_iter``).
        window: Anderson's history.
        t_rowptr: the transposed CSR's row pointers, for a W that is not symmetric.
        t_col: the transposed CSR's column indices.
        t_perm: the positions of the transposed CSR's entries in the CSR.
        diag_index: self-loop positions (:meth:`CSRGraph.diagonal_index`), else computed.
        host_checks: read the stats on the host to warn (None: whenever
            :func:`host_reads_allowed`; False: never, so the call does not synchronize).
        trusted: skip the O(edges) graph check (:func:`dignn_kernels.ops.check_graph`, run
            once here, never per sweep) for a CSR built by :mod:`dignn_kernels.graph`.
        storage_dtype: None (everything in x's dtype) or ``torch.bfloat16`` /
            ``torch.float16``: the iterates of the solve and of its adjoint are stored in that
            dtype (the last iteration, computed from the last stored iterate, is kept wide)
            while every sum accumulates in x's dtype (float32 or float64); p, q, w, kappa,
            chi, the row coefficients and the convergence norms stay wide, and z and the
            gradients come back in x's dtype. With float16 (largest value 65504) the
            right-hand side of each solve is scaled by a power of two to a largest magnitude
            in [1, 2) (exact), and iterates that overflow float16 all the same raise a
            ValueError naming storage_dtype (where the host may be read). Fixed point only,
            on a backend that supports it (:func:`dignn_kernels.backends.storage_backends`:
            all four built in); with ``backend=None`` the first of them available on x's
            device.

    Returns:
        (z, stats): Z in x's dtype, and stats = [iterations, residual, relative residual,
        diverged] (float64, on the device); :func:`backward_stats` gives the same of the
        adjoint solve once a backward ran.

    Raises:
        ValueError: a bad argument, named with the fix (an unknown solver or backend, a
            storage_dtype the solver or backend does not take, a bad scalar, a graph that
            fails its check, mu whose 1/mu overflows x's dtype); float16 storage whose
            iterates overflow it (also from the backward).
        TypeError: an argument that is not a tensor where one is needed.
        RuntimeError: a backend that does not run on x's device.

    Example:
        >>> import torch, dignn_kernels as dk
        >>> g = dk.build_graph(torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]]), 3)
        >>> w, chi, kappa = g.fixed_laplacian("rw", torch.float64)
        >>> x = torch.eye(3, dtype=torch.float64)
        >>> z, stats = dk.implicit_diffusion(g.rowptr, g.col, w, x, chi, kappa=kappa, mu=2.2,
        ...                                  solver="cg", max_iter=50, tol=1e-12)
        >>> z.shape, bool(stats[2] <= 1e-12)
        (torch.Size([3, 3]), True)

        Second derivatives: a Hessian-vector product by double backward.

        >>> xr = x.clone().requires_grad_()
        >>> z, _ = dk.implicit_diffusion(g.rowptr, g.col, w, xr, chi, kappa=kappa, mu=2.2,
        ...                              solver="cg", max_iter=50, tol=1e-12)
        >>> (gx,) = torch.autograd.grad(z.square().sum(), xr, create_graph=True)
        >>> (hv,) = torch.autograd.grad(gx.sum(), xr)
        >>> hv.shape
        torch.Size([3, 3])
    """
    check_tensors(rowptr=rowptr, col=col, edge_value=edge_value, x=x, chi=chi)
    check_flag("trusted", trusted)
    check_flag("host_checks", host_checks, none_ok=True)
    storage_dtype = check_storage_dtype(storage_dtype)
    check_solver_storage(solver, storage_dtype)
    if backend is None:
        if storage_dtype is None:
            backend = "cuda" if x.is_cuda else "cpu"
        else:
            backend = available_backends(x.device, col.numel(), storage_dtype)[0]
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    check_backend_storage(backend, storage_dtype)
    check_scalars(mu=mu, eps=eps, max_iter=max_iter, tol=tol)
    if check_every is not None:
        check_every_arg(check_every)
    check_int("window", window, 1)
    if not torch.compiler.is_compiling():
        check_solve_args(rowptr, col, edge_value, x, chi, p, q, kappa, t_rowptr, t_col, t_perm,
                         diag_index)
        check_backend_device(get_backend(backend), backend, x.device)
    check_graph_data(trusted, rowptr, col, x, t_rowptr, t_col, t_perm, diag_index)
    solver = resolve_solver(solver, t_rowptr is None)
    host_checks = host_reads_allowed(x) if host_checks is None else \
        bool(host_checks) and host_reads_allowed(x)
    check_inverse_mu(float(mu), x.dtype)  # (the ValueError naming mu; no host read)
    if host_checks and p is not None:
        check_projection_range(p)  # (one read of max|p|, where the host may be read)
    args = (rowptr, col, edge_value, x, chi, p, q, kappa, t_rowptr, t_col, t_perm, diag_index,
            float(mu), float(eps), max_iter, float(tol), solver, backend,
            -1 if check_every is None else check_every, window, storage_dtype)
    if torch.compiler.is_compiling():
        z, _, kappa_out, stats = torch.ops.dignn.implicit_solve(*args)
    else:  # the op with forward-mode AD and the torch.func transforms (see _Solve)
        z, _, kappa_out, stats = _Solve.apply(*args, host_checks)
    if host_checks:  # (the inputs are read only where the solve failed)
        warn_if_diverged(stats, solver, mu, tol,
                         inputs=dict(x=x, chi=chi, edge_value=edge_value, p=p, q=q,
                                     kappa=kappa),
                         coefficients=(chi, kappa_out), storage_dtype=storage_dtype)
    return z, stats
