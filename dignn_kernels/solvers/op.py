"""The differentiable solve: one custom op, ``dignn::implicit_solve``, with one autograd
registration, for every backend and solver, and its entry :func:`implicit_diffusion`.

The op runs the equilibrium Z = X - (1/mu) Delta Z (paper eq. 10) with the chosen solver on
the chosen backend's passes; a backend with a fused solve
(:class:`~dignn_kernels.backends.interface.FusedSolve`) runs the fixed point in its own loop
instead. Its backward is implicit differentiation (appendix "Training for DIGNNs"): the
adjoint solve with the same solver, then dl/dx = u, dl/dchi_i = u_i . (x_i - z_i) / chi_i
and, for the neural Laplacian, dl/dp and dl/dq from the backend's gradient pass with
v = rs.u. Following PyTorch's extension-cpp example, the op is a ``torch.library`` custom op
with a fake kernel (so ``torch.compile`` traces the layer whole) and its backward is a second
custom op, so that it is traced too.

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
from ..checks import (check_backend_device, check_flag, check_graph_data, check_int,
                      check_projection_range, check_same_device, check_scalars,
                      check_solve_args, check_tensors)
from .loops import (ANDERSON_WINDOW, DivergenceWarning, check_every_arg, default_check_every,
                    fixed_point_diverged, solve_adjoint, solve_forward)
from ..laplacian import check_inverse_mu, coefficient_overflow_message
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


def _rescaling(t: Tensor):
    """(scale, unscale) for a solve with right-hand side ``t``, or None: powers of two with
    max|t| * scale in [1, 2). The equilibrium (paper eq. 10) and its adjoint are linear in
    their right-hand side, and a power of two scales every iterate, norm and dot product
    exactly, so the solve of t * scale times unscale is the solve of t, bit for bit, except
    that nothing overflows (features near 1e30 in float32: 1e60 squares) or underflows.
    On the CPU max|t| is read on the host (free there) and t in the range of ``_UNSCALED``
    is left as it is; on a device it stays there (0-dim tensors, no sync)."""
    if t.numel() == 0 or t.dtype not in (torch.float32, torch.float64):
        return None
    low, high = torch.aminmax(t)  # (a twentieth of vector_norm(ord=inf)'s time on the CPU)
    amax = torch.maximum(-low, high)
    limit = 126 if t.dtype == torch.float32 else 1022  # 2^-limit and 2^limit both normal
    if t.device.type == "cpu":
        m = float(amax)
        if not math.isfinite(m) or m == 0.0 or _UNSCALED[0] <= m <= _UNSCALED[1]:
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
        diverged = fixed_point_diverged(x, z, chi, t_rowptr is None, storage_dtype)
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
    rescaling = _rescaling(x)
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
    rescaling = _rescaling(grad_z)
    if rescaling is None:
        return _backward(rowptr, col, edge_value, w, kappa, t_rowptr, t_col, t_perm,
                         diag_index, x, chi, p, q, z, grad_z, mu, eps, max_iter, tol, solver,
                         backend, check_every, window, storage_dtype)
    scale, unscale = rescaling  # every output is linear in grad_z
    *grads, stats = _backward(rowptr, col, edge_value, w, kappa, t_rowptr, t_col, t_perm,
                              diag_index, x, chi, p, q, z, grad_z * scale, mu, eps, max_iter,
                              tol, solver, backend, check_every, window, storage_dtype)
    return (*(g * unscale for g in grads), _unscaled_stats(stats, unscale))


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


def _solve_setup_context(ctx, inputs, output):
    (rowptr, col, edge_value, x, chi, p, q, _kappa, t_rowptr, t_col, t_perm, diag_index, mu,
     eps, max_iter, tol, solver, backend, check_every, window, storage_dtype) = inputs
    z, w, kappa, stats = output
    ctx.mark_non_differentiable(w, kappa, stats)
    ctx.save_for_backward(rowptr, col, edge_value, w, kappa, t_rowptr, t_col, t_perm,
                          diag_index, x, chi, p, q, z)
    ctx.config = (mu, eps, max_iter, tol, solver, backend, check_every, window, storage_dtype)
    ctx.stats_key = weakref.ref(stats) if type(stats) is torch.Tensor else None
    ctx.neural = p is not None


def _solve_backward(ctx, grad_z, grad_w, grad_kappa, grad_stats):
    if grad_z is None:
        return (None,) * 21
    grad_x, grad_chi, grad_p, grad_q, stats = torch.ops.dignn.implicit_solve_backward(
        *ctx.saved_tensors, grad_z, *ctx.config)
    forward_stats = ctx.stats_key() if ctx.stats_key is not None else None
    if forward_stats is not None:
        _file_backward_stats(forward_stats, stats)
    if not ctx.neural:
        grad_p = grad_q = None
    return (None, None, None, grad_x, grad_chi, grad_p, grad_q) + (None,) * 14


torch.library.register_autograd("dignn::implicit_solve", _solve_backward,
                                setup_context=_solve_setup_context)


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


def host_reads_allowed(x: Tensor) -> bool:
    """Whether a value of ``x``'s device may be read on the host now: not while tracing for
    torch.compile, not while a CUDA graph is being captured. ``is_compiling`` comes first, so
    that Dynamo never traces the capture query (it cannot, and fullgraph=True would fail)."""
    if torch.compiler.is_compiling():
        return False
    return not (x.is_cuda and torch.cuda.is_current_stream_capturing())


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


def warn_if_diverged(stats: Tensor, solver: str, mu: float, tol: float,
                     stacklevel: int = 3, inputs: Optional[dict] = None,
                     coefficients: Optional[Tuple[Tensor, Tensor]] = None) -> None:
    """Reads a solve's stats on the host and warns (:class:`DivergenceWarning`) when it
    diverged or ended no better than it started: naming the inputs that hold NaN or Inf
    (``inputs``: name -> tensor, read only then), else naming mu. With ``coefficients``
    (chi, kappa) a ValueError names mu where the row coefficients 1/(mu chi), kappa/(mu chi)
    overflow the compute dtype; a residual that overflowed from finite inputs names x."""
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
    # cg's SPD system converges for every mu > 0: a residual that is not finite from finite
    # inputs is an overflow (the fixed point and Anderson may also have diverged: mu is named)
    if solver == "cg" and not math.isfinite(residual) and inputs is not None and "x" in inputs:
        x = inputs["x"]
        warnings.warn(
            f"solver={solver!r} overflowed in {x.dtype}: its residual or dot products are not "
            f"finite although every input is (max|x| = "
            f"{float(torch.linalg.vector_norm(x.double(), ord=math.inf)):.3g}; the squared "
            f"norms of the residual of the SPD form (C + L/mu) Z = C X, chi and the edge "
            f"values times x, exceed {x.dtype}'s range). The output is not the equilibrium. "
            f"Compute in torch.float64, or rescale x and the edge values.", DivergenceWarning,
            stacklevel=stacklevel + 1)
        return
    if diverged and solver == "fixed_point":
        warnings.warn(
            f"solver='fixed_point' diverged at mu={mu:g}: the iteration Z <- X - (1/mu) Delta Z "
            f"only converges when mu > lambda_max(Delta) (paper corollary 4.3), and mu={mu:g} "
            f"is below lambda_max here, so the output is not the equilibrium. Use solver='cg' "
            f"(converges for every mu > 0 on undirected graphs) or solver='anderson', or raise "
            f"mu.", DivergenceWarning, stacklevel=stacklevel + 1)
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
    """The differentiable equilibrium Z = X - (1/mu) Delta Z (paper eq. 10), differentiable in
    x, chi, p and q by implicit differentiation.

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
            gradients come back in x's dtype. Fixed point only, on a backend that supports it
            (:func:`dignn_kernels.backends.storage_backends`: all four built in); with
            ``backend=None`` the first of them available on x's device.

    Returns:
        (z, stats): Z in x's dtype, and stats = [iterations, residual, relative residual,
        diverged] (float64, on the device); :func:`backward_stats` gives the same of the
        adjoint solve once a backward ran.

    Raises:
        ValueError: a bad argument, named with the fix (an unknown solver or backend, a
            storage_dtype the solver or backend does not take, a bad scalar, a graph that
            fails its check, mu whose 1/mu overflows x's dtype).
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
    z, _, kappa_out, stats = torch.ops.dignn.implicit_solve(
        rowptr, col, edge_value, x, chi, p, q, kappa, t_rowptr, t_col, t_perm, diag_index,
        float(mu), float(eps), max_iter, float(tol), solver, backend,
        -1 if check_every is None else check_every, window, storage_dtype)
    if host_checks:  # (the inputs are read only where the solve failed)
        warn_if_diverged(stats, solver, mu, tol,
                         inputs=dict(x=x, chi=chi, edge_value=edge_value, p=p, q=q,
                                     kappa=kappa),
                         coefficients=(chi, kappa_out))
    return z, stats
