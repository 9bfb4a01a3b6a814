r"""Equilibrium solvers for the implicit layer, written once on the pass interface of
:func:`dignn_kernels.backends.kernels_for` (``neural_edge_weights``, ``csr_fma``,
``neural_weight_grad``), so every backend runs them.

The layer's equilibrium (paper eq. 10) is Z = X - (1/mu) Delta Z with Delta = C^-1 L,
C = diag(chi), L = K - W, K = diag(kappa) (csrc/dignn/laplacian_math.h). Three solvers:

``fixed_point``
    The paper's iteration (eq. iter), Z <- X + cy.Z + ca.(W Z). It converges only when
    mu > lambda_max(Delta) (corollary 4.3), at rate lambda_max / mu.
``cg``
    When W is symmetric (an undirected graph with symmetric edge values) L is symmetric
    positive semi-definite, and multiplying the equilibrium by C gives
    ``(C + L/mu) Z = C X``: a symmetric positive definite system for *every* mu > 0. It is
    solved by Jacobi-preconditioned conjugate gradient, one system per channel, all channels
    in the same CSR pass. The adjoint system (I + Delta^T/mu) u = g of the backward is the same
    matrix: ``(C + L/mu) v = g``, ``u = C v``. With the Jacobi preconditioner
    diag(C + L/mu) the preconditioned matrix of the rw Laplacian is I + Delta/mu, whose
    condition number 1 + lambda_max/mu stays small for every mu.
``anderson``
    Anderson acceleration (type II, a window of the last few iterates, least squares solved
    per channel on the device) of the fixed-point map, forward and adjoint. It needs no
    symmetry, so it is the fallback for directed graphs.

Guard rows (chi_i <= 1e-30, see laplacian_math.h) keep z_i = x_i in every solver. In the SPD
form such a row is the identity (its C_ii is taken as 1 and its row of L/mu is dropped); for
the neural Laplacian chi_i = 0 forces W_i. = 0 and, on a symmetric graph, W_.i = 0, so the
matrix stays symmetric.

Every loop keeps its residual norms, its convergence flag and its counters on the device and
reads them on the host only every ``check_every`` sweeps (0: never, a fixed ``max_iter``
sweeps); once converged, later sweeps leave the iterate unchanged, so the result does not
depend on ``check_every``. That is what lets a solve run under CUDA graph capture.

All residuals are of the equation itself, ``||X - Z - Delta Z / mu||_F`` (forward) and
``||g - u - Delta^T u / mu||_F`` (adjoint), relative to ``||X||_F`` and ``||g||_F``.
"""
import math
import warnings
import weakref
from dataclasses import dataclass
from typing import Callable, Optional, Tuple

import torch
from torch import Tensor

from .backends import kernels_for
from .graph import diagonal_index
from .ops import _check_graph, _file_backward_stats
from .reference import CHI_FLOOR

__all__ = ["SOLVERS", "DivergenceWarning", "SolveResult", "EquilibriumSystem", "fixed_point",
           "conjugate_gradient", "anderson", "solve_forward", "solve_adjoint",
           "implicit_diffusion", "resolve_solver", "default_check_every",
           "fixed_point_diverged"]

SOLVERS = ("fixed_point", "cg", "anderson")
KERNEL_BACKENDS = ("cpu", "cuda", "triton", "torch")
ANDERSON_WINDOW = 5
# Margin of the fixed-point divergence certificate (see fixed_point_diverged), on squared
# norms: rounding only, on symmetric graphs; a heuristic bound on directed ones.
_CERTIFICATE_SYMMETRIC = 1.0 + 1e-3
_CERTIFICATE_DIRECTED = 100.0


class DivergenceWarning(RuntimeWarning):
    """A solve diverged or produced non-finite values: its output is not the equilibrium."""


@dataclass
class SolveResult:
    """What a solver returns; every tensor stays on the solve's device.

    ``history[k]`` is the relative residual of the iterate that k CSR sweeps produced (NaN
    where unknown or past the end); ``sweeps`` counts the sweeps done before convergence;
    ``residual`` and ``relative`` describe the returned solution (fixed point: the last
    difference ||Z_K - Z_{K-1}||, the residual of Z_{K-1}, as the paper's stopping test);
    ``diverged`` flags a fixed point that broke its divergence certificate or a non-finite
    residual."""

    solution: Tensor
    history: Tensor
    sweeps: Tensor
    residual: Tensor
    relative: Tensor
    diverged: Tensor

    def stats(self) -> Tensor:
        """[sweeps, residual, relative residual, diverged] as float64."""
        return torch.stack([self.sweeps.double(), self.residual.double(),
                            self.relative.double(), self.diverged.double()])


def default_check_every(device: torch.device) -> int:
    """Host checks of the convergence flag: every sweep on the CPU (free there), every 4
    sweeps on an accelerator, never while a CUDA graph is being captured."""
    if device.type == "cpu":
        return 1
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return 0
    return 4


# ------------------------------------------------------------------------ systems --

class EquilibriumSystem:
    """The maps of one equilibrium problem on a CSR graph with edge weights ``w``:

    - ``step(z, x) = x + cy.z + ca.(W z)``: the forward fixed-point map (eq. iter);
    - ``adjoint_step(u, g) = g + cy.u + W^T (ca.u)``: the adjoint fixed-point map;
    - ``spd_apply(y) = (S + L/mu) y``: the SPD matrix, S = diag(chi) with 1 on guard rows,
      identity rows on guard rows;
    - ``mass`` = diag(S), ``inv_diagonal`` = 1 / diag(S + L/mu) (Jacobi);
    - ``decoupled`` marks rows with no coupling to other nodes (guard rows, rows without
      edges), whose SPD solution is rhs_i / A_ii outright.

    ``kappa`` is the diagonal of L (row sums of W for the neural, rw and unnormalized
    Laplacians, 1 for sym). ``t_rowptr, t_col, t_perm`` describe W^T for directed graphs
    (None: W is symmetric). ``diag_index`` locates the self-loops (computed when None)."""

    def __init__(self, kernels, rowptr: Tensor, col: Tensor, w: Tensor, chi: Tensor,
                 kappa: Tensor, mu: float, *, t_rowptr: Optional[Tensor] = None,
                 t_col: Optional[Tensor] = None, t_perm: Optional[Tensor] = None,
                 diag_index: Optional[Tensor] = None):
        self.kernels = kernels
        self.rowptr, self.col, self.w = rowptr, col, w
        self.mu = float(mu)
        self.symmetric = t_rowptr is None
        self._transposed = (t_rowptr, t_col, t_perm)
        self._diag_index = diag_index
        self.guard = chi <= CHI_FLOOR
        ones = torch.ones_like(chi)
        self.ones = ones
        self.mass = torch.where(self.guard, ones, chi)
        # Row coefficients of the fixed-point map (laplacian_math.h, row_coefficients).
        self.ca = torch.where(self.guard, torch.zeros_like(chi), 1.0 / (self.mu * self.mass))
        self.cy = -kappa * self.ca
        self.kappa = kappa
        self.decoupled = self.guard | (rowptr[1:] == rowptr[:-1])
        self._adjoint = None
        self._spd = None
        self._zeros = None

    def step(self, z: Tensor, x: Tensor) -> Tensor:
        return self.kernels.csr_fma(self.rowptr, self.col, self.w, z, x, self.cy, self.ca,
                                    trusted=True)

    def adjoint_step(self, u: Tensor, g: Tensor) -> Tensor:
        if self._adjoint is None:
            t_rowptr, t_col, t_perm = self._transposed
            if self.symmetric:
                t_rowptr, t_col, t_w = self.rowptr, self.col, self.w
            else:
                t_w = self.w[t_perm]
            # entry (j, i) of W^T carries W_ij ca_i, so that W^T (ca.u) is one CSR product
            self._adjoint = (t_rowptr, t_col, t_w * self.ca[t_col.long()])
        t_rowptr, t_col, t_w = self._adjoint
        return self.kernels.csr_fma(t_rowptr, t_col, t_w, u, g, self.cy, self.ones,
                                    trusted=True)

    def _spd_terms(self):
        if self._spd is None:
            if not self.symmetric:
                raise ValueError("the SPD form (solver='cg') needs a symmetric W; this graph "
                                 "is directed or has asymmetric edge values")
            inv_mu = 1.0 / self.mu
            # (S + (K - W)/mu) y = spd_cy * y + spd_rs * (W y); identity on guard rows.
            spd_cy = torch.where(self.guard, self.ones, self.mass + self.kappa * inv_mu)
            spd_rs = torch.where(self.guard, torch.zeros_like(self.mass),
                                 torch.full_like(self.mass, -inv_mu))
            index = self._diag_index
            if index is None:
                index = diagonal_index(self.rowptr, self.col)
            # A self-loop's W_ii is in kappa_i and in W: L_ii = kappa_i - W_ii.
            w_ii = torch.where(index >= 0, self.w[index.clamp_min(0)],
                               torch.zeros_like(self.mass)) if self.w.numel() else \
                torch.zeros_like(self.mass)
            diagonal = spd_cy + spd_rs * w_ii
            self._spd = (spd_cy, spd_rs, 1.0 / diagonal)
        return self._spd

    def spd_apply(self, y: Tensor) -> Tensor:
        spd_cy, spd_rs, _ = self._spd_terms()
        if self._zeros is None or self._zeros.shape != y.shape:
            self._zeros = torch.zeros_like(y)
        return self.kernels.csr_fma(self.rowptr, self.col, self.w, y, self._zeros, spd_cy,
                                    spd_rs, trusted=True)

    @property
    def inv_diagonal(self) -> Tensor:
        return self._spd_terms()[2]


# ----------------------------------------------------------------------- the loops --

def _norm(t: Tensor) -> Tensor:
    return torch.linalg.vector_norm(t).double()


def _weighted_sq(t: Tensor, weight: Tensor) -> Tensor:
    return (t.square().sum(dim=1, dtype=torch.float64) * weight.double()).sum()


def _start(rhs: Tensor, max_iter: int, ref: Optional[Tensor] = None):
    dev = rhs.device
    ref = _norm(rhs) if ref is None else ref.double()
    ref_safe = ref.clamp_min(torch.finfo(torch.float64).tiny)
    history = torch.full((max_iter + 1,), math.nan, dtype=torch.float64, device=dev)
    flag = torch.zeros((), dtype=torch.bool, device=dev)
    count = torch.zeros((), dtype=torch.int64, device=dev)
    return ref, ref_safe, history, flag, count


def _finish(solution, rhs, history, sweeps, residual, ref_safe, diverged, valid_upto):
    positions = torch.arange(history.numel(), device=history.device)
    history = torch.where(positions < valid_upto, history, torch.nan)
    if solution is rhs:
        solution = rhs.clone()
    return SolveResult(solution, history, sweeps, residual, residual / ref_safe, diverged)


def _check(check_every: int) -> int:
    if isinstance(check_every, bool) or not isinstance(check_every, int) or check_every < 0:
        raise ValueError(f"check_every must be an integer >= 0 (0: run max_iter sweeps with no "
                         f"host check), got {check_every!r}")
    return check_every


def fixed_point(step: Callable[[Tensor], Tensor], rhs: Tensor, *, max_iter: int, tol: float,
                check_every: int = 1, certificate: Optional[Tensor] = None,
                growth: float = _CERTIFICATE_SYMMETRIC,
                callback: Optional[Callable[[int], None]] = None) -> SolveResult:
    """y_0 = rhs, y_{k+1} = step(y_k) (the paper's iteration from Z_1 = X), at most
    ``max_iter`` sweeps, until ||y_{k+1} - y_k|| <= tol ||rhs||.

    ``certificate`` (n weights c_i > 0) turns on the divergence test: the iterates are the
    partial sums y_k = sum_{j<=k} J^j rhs of a map J = -Delta/mu that is self-adjoint in the
    c-weighted inner product, so while every eigenvalue of Delta is <= mu each of them is
    bounded, ||y_k||_c <= ||rhs||_c. An iterate above ``growth`` times that bound proves
    mu < lambda_max(Delta): the loop stops there (before anything overflows), keeps the last
    iterate under the bound and flags ``diverged``."""
    check_every = _check(check_every)
    ref, ref_safe, history, done, sweeps = _start(rhs, max_iter)
    diverged = done.clone()
    residual = torch.where(ref > 0, torch.nan, 0.0).double()
    done = done | (ref <= 0)  # rhs = 0: y = 0 is exact
    bound = growth * _weighted_sq(rhs, certificate) if certificate is not None else None
    y = rhs
    if not (check_every and bool(done)):
        for k in range(1, max_iter + 1):
            y_next = step(y)
            res = _norm(y_next - y)  # the residual of y_{k-1}
            bad = ~torch.isfinite(res)
            if bound is not None:
                bad = bad | (_weighted_sq(y_next, certificate) > bound)
            history[k - 1] = res / ref_safe
            live = ~done
            sweeps += live
            diverged |= live & bad
            residual = torch.where(live, res, residual)
            accept = live & ~bad
            done = done | bad | (res <= tol * ref)
            if callback is not None:
                callback(k)
            if check_every == 1:
                is_bad, is_done = torch.stack([bad, done]).tolist()
                if not is_bad:
                    y = y_next
                if is_done:
                    break
            else:
                y = torch.where(accept, y_next, y)
                if check_every and k % check_every == 0 and bool(done):
                    break
    return _finish(y, rhs, history, sweeps, residual, ref_safe, diverged, sweeps)


def conjugate_gradient(apply: Callable[[Tensor], Tensor], rhs: Tensor, inv_diagonal: Tensor, *,
                       max_iter: int, tol: float, check_every: int = 1,
                       residual_scale: Optional[Tensor] = None, ref_norm: Optional[Tensor] = None,
                       decoupled: Optional[Tensor] = None,
                       callback: Optional[Callable[[int], None]] = None) -> SolveResult:
    """Jacobi-preconditioned conjugate gradient for A V = rhs, A SPD, every column its own
    system (per-column step lengths); one ``apply`` (one CSR sweep) per iteration. Stops once
    ||residual_scale * (rhs - A V)||_F <= tol * ref_norm (default ||rhs||_F); the residual is
    the recursively updated one.

    Rows marked ``decoupled`` (A_ij = A_ji = 0 for j != i) start at their exact value
    rhs_i / A_ii with a zero residual, so they never enter the Krylov space and stay exact
    (guard rows keep z_i = x_i bit for bit); the others start at 0."""
    check_every = _check(check_every)
    ref, ref_safe, history, done, sweeps = _start(rhs, max_iter, ref_norm)
    diverged = done.clone()
    inv_diag = inv_diagonal.unsqueeze(1)
    # Both reductions of an iteration in one pass over r^2: with M = diag(1/inv_diagonal),
    # column c of [inv_diagonal, scale^2]^T r^2 holds r_c . M^-1 r_c and ||scale * r_c||^2.
    weights = torch.stack([inv_diagonal, residual_scale.square() if residual_scale is not None
                           else torch.ones_like(inv_diagonal)]).to(rhs.dtype)

    def reduce(r):
        both = torch.mm(weights, torch.mul(r, r, out=scratch))
        return both[0], both[1].double().sum().clamp_min(0.0).sqrt()

    if decoupled is None:
        z = torch.zeros_like(rhs)
        r = rhs.clone()
    else:
        known = decoupled.unsqueeze(1)
        z = torch.where(known, rhs * inv_diag, 0.0)
        r = torch.where(known, 0.0, rhs)
    p = r * inv_diag
    scratch = torch.empty_like(rhs)  # the loop's one n x d temporary, reused
    rz, residual = reduce(r)
    history[0] = residual / ref_safe
    done = done | (residual <= tol * ref)
    if not (check_every and bool(done)):
        for k in range(1, max_iter + 1):
            ap = apply(p)
            pap = torch.mul(p, ap, out=scratch).sum(dim=0)
            live = ~done
            alpha = torch.where(live & (pap > 0), rz / pap, 0.0)
            z.addcmul_(p, alpha)
            r.addcmul_(ap, alpha, value=-1.0)
            rz_new, res = reduce(r)
            beta = torch.where(live & (rz > 0), rz_new / rz, 0.0)
            p.mul_(beta).addcmul_(r, inv_diag)  # p = M^-1 r + beta p
            rz = rz_new
            history[k] = res / ref_safe
            sweeps += live
            bad = ~torch.isfinite(res)
            diverged |= live & bad
            residual = torch.where(live, res, residual)
            done = done | bad | (res <= tol * ref)
            if callback is not None:
                callback(k)
            if check_every and k % check_every == 0 and bool(done):
                break
    return _finish(z, rhs, history, sweeps, residual, ref_safe, diverged, sweeps + 1)


def _anderson_regularization(dtype: torch.dtype) -> float:
    # Tikhonov term of the window's normal equations, relative to their mean diagonal: above
    # the rounding of a Gram matrix accumulated in `dtype`.
    return 1e-12 if dtype == torch.float64 else 1e-6


def _small_spd_solve(a: Tensor, b: Tensor) -> Tensor:
    """Solves a batch of small SPD systems a x = b (a: B x m x m, b: B x m) by Cholesky, in
    elementwise tensor ops: on the device, no host check, no LAPACK call (whose batched
    drivers go multi-threaded even for a handful of 5 x 5 matrices)."""
    m = a.shape[-1]
    tiny = torch.finfo(a.dtype).tiny
    chol = torch.zeros_like(a)
    for j in range(m):
        row = chol[:, j, :j]
        pivot = (a[:, j, j] - (row * row).sum(dim=1)).clamp_min(tiny).sqrt()
        chol[:, j, j] = pivot
        if j + 1 < m:
            below = (chol[:, j + 1:, :j] * row.unsqueeze(1)).sum(dim=2)
            chol[:, j + 1:, j] = (a[:, j + 1:, j] - below) / pivot.unsqueeze(1)
    y = torch.zeros_like(b)
    for i in range(m):  # chol y = b
        y[:, i] = (b[:, i] - (chol[:, i, :i] * y[:, :i]).sum(dim=1)) / chol[:, i, i]
    x = torch.zeros_like(b)
    for i in reversed(range(m)):  # chol^T x = y
        x[:, i] = (y[:, i] - (chol[:, i + 1:, i] * x[:, i + 1:]).sum(dim=1)) / chol[:, i, i]
    return x


def anderson(step: Callable[[Tensor], Tensor], rhs: Tensor, *, max_iter: int, tol: float,
             window: int = ANDERSON_WINDOW, check_every: int = 1,
             callback: Optional[Callable[[int], None]] = None) -> SolveResult:
    """Anderson acceleration (type II, mixing 1) of y -> step(y) from y_0 = rhs, one sweep per
    iteration, at most ``max_iter`` sweeps, until ||step(y) - y|| <= tol ||rhs||.

    Each channel (column) mixes its own last ``window`` iterates: with f = step(y) - y and
    the differences dF, dG of f and step(y) over the window,
    gamma = argmin ||f - dF gamma|| (regularized normal equations, a batched m x m solve on
    the device) and y <- step(y) - dG gamma."""
    check_every = _check(check_every)
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be an integer >= 1, got {window!r}")
    if rhs.dim() != 2:
        raise ValueError(f"rhs must be 2-D (nodes x channels), got shape {list(rhs.shape)}")
    ref, ref_safe, history, done, sweeps = _start(rhs, max_iter)
    m = min(window, max(max_iter - 1, 1))
    dtype = rhs.dtype
    y = rhs
    gy = step(y)
    f = gy - y
    residual = _norm(f)
    history[0] = residual / ref_safe
    sweeps += 1
    diverged = ~torch.isfinite(residual)
    done = diverged | (residual <= tol * ref)
    if callback is not None:
        callback(1)
    # The window, slot-major (each slot one contiguous n x d block): loops over the slots with
    # one scratch buffer beat any batched form of these per-channel products on the CPU.
    d_f = rhs.new_zeros((m,) + rhs.shape)
    d_g = rhs.new_zeros((m,) + rhs.shape)
    scratch = torch.empty_like(rhs)
    gram = torch.zeros(rhs.size(1), m, m, dtype=torch.float64, device=rhs.device)
    eye = torch.eye(m, dtype=torch.float64, device=rhs.device)
    reg = _anderson_regularization(dtype)
    tiny = torch.finfo(torch.float64).tiny

    def dots(v, filled):
        """<d_f[j], v> per channel for the filled slots: (filled, d), float64."""
        return torch.stack([torch.mul(d_f[j], v, out=scratch).sum(dim=0)
                            for j in range(filled)]).double()

    if check_every and bool(done):
        max_iter = 1
    for k in range(1, max_iter):
        filled = min(k - 1, m)
        if filled == 0:
            y_new = gy
        else:
            proj = torch.zeros(m, rhs.size(1), dtype=torch.float64, device=rhs.device)
            proj[:filled] = dots(f, filled)  # dF^T f
            lam = reg * gram.diagonal(dim1=1, dim2=2).mean(dim=1) + tiny
            gamma = _small_spd_solve(gram + lam[:, None, None] * eye, proj.t())
            gamma = torch.nan_to_num(gamma, nan=0.0, posinf=0.0, neginf=0.0).t().to(dtype)
            y_new = torch.addcmul(gy, d_g[0], gamma[0], value=-1.0)  # gy - dG gamma
            for j in range(1, filled):
                y_new.addcmul_(d_g[j], gamma[j], value=-1.0)
        gy_new = step(y_new)
        f_new = gy_new - y_new
        res = _norm(f_new)
        slot = (k - 1) % m
        torch.sub(f_new, f, out=d_f[slot])
        torch.sub(gy_new, gy, out=d_g[slot])
        column = dots(d_f[slot], min(k, m)).t()  # (d, filled): the new Gram row/column
        gram[:, : column.size(1), slot] = column
        gram[:, slot, : column.size(1)] = column
        history[k] = res / ref_safe
        bad = ~torch.isfinite(res)
        live = ~done
        sweeps += live
        diverged |= live & bad
        accept = live & ~bad
        residual = torch.where(accept, res, residual)
        done = done | bad | (res <= tol * ref)
        if callback is not None:
            callback(k + 1)
        if check_every == 1:
            is_bad, is_done = torch.stack([bad, done]).tolist()
            if not is_bad:
                y, gy, f = y_new, gy_new, f_new
            if is_done:
                break
        else:
            y = torch.where(accept, y_new, y)
            gy = torch.where(accept, gy_new, gy)
            f = torch.where(accept, f_new, f)
            if check_every and (k + 1) % check_every == 0 and bool(done):
                break
    return _finish(y, rhs, history, sweeps, residual, ref_safe, diverged, sweeps)


# --------------------------------------------------------------- forward / adjoint --

def solve_forward(system: EquilibriumSystem, x: Tensor, solver: str, *, max_iter: int,
                  tol: float, check_every: int = 1, window: int = ANDERSON_WINDOW,
                  callback=None) -> SolveResult:
    """Z = X - (1/mu) Delta Z with the given solver."""
    if solver == "cg":
        out = conjugate_gradient(system.spd_apply, system.mass.unsqueeze(1) * x,
                                 system.inv_diagonal, max_iter=max_iter, tol=tol,
                                 check_every=check_every, residual_scale=1.0 / system.mass,
                                 ref_norm=torch.linalg.vector_norm(x),
                                 decoupled=system.decoupled, callback=callback)
        return out
    step = lambda z: system.step(z, x)  # noqa: E731
    if solver == "anderson":
        return anderson(step, x, max_iter=max_iter, tol=tol, window=window,
                        check_every=check_every, callback=callback)
    growth = _CERTIFICATE_SYMMETRIC if system.symmetric else _CERTIFICATE_DIRECTED
    return fixed_point(step, x, max_iter=max_iter, tol=tol, check_every=check_every,
                       certificate=system.mass, growth=growth, callback=callback)


def solve_adjoint(system: EquilibriumSystem, g: Tensor, solver: str, *, max_iter: int,
                  tol: float, check_every: int = 1, window: int = ANDERSON_WINDOW,
                  callback=None) -> SolveResult:
    """u = g - (1/mu) Delta^T u (u = dl/dX) with the given solver. For ``cg``: the SPD
    system (S + L/mu) v = g, then u = S v; its residual g - A v equals the adjoint equation's
    residual, so the stopping test is the same as the other solvers'."""
    if solver == "cg":
        out = conjugate_gradient(system.spd_apply, g, system.inv_diagonal, max_iter=max_iter,
                                 tol=tol, check_every=check_every, decoupled=system.decoupled,
                                 callback=callback)
        out.solution = system.mass.unsqueeze(1) * out.solution
        return out
    step = lambda u: system.adjoint_step(u, g)  # noqa: E731
    if solver == "anderson":
        return anderson(step, g, max_iter=max_iter, tol=tol, window=window,
                        check_every=check_every, callback=callback)
    # J^T = -L C^-1 / mu is self-adjoint in the 1/c-weighted inner product
    growth = _CERTIFICATE_SYMMETRIC if system.symmetric else _CERTIFICATE_DIRECTED
    return fixed_point(step, g, max_iter=max_iter, tol=tol, check_every=check_every,
                       certificate=1.0 / system.mass, growth=growth, callback=callback)


def fixed_point_diverged(x: Tensor, z: Tensor, chi: Tensor, symmetric: bool) -> Tensor:
    """On the device: True when ``z``, an iterate of the paper's fixed point from Z_1 = X,
    is non-finite or breaks the bound ||Z_t||_C <= ||X||_C that holds for every iterate while
    mu >= lambda_max(Delta) (C = diag(chi), 1 on guard rows; see :func:`fixed_point`). On a
    symmetric graph a break proves divergence; on a directed one it is a heuristic with a
    wide margin."""
    mass = torch.where(chi <= CHI_FLOOR, torch.ones_like(chi), chi)
    growth = _CERTIFICATE_SYMMETRIC if symmetric else _CERTIFICATE_DIRECTED
    zs = _weighted_sq(z, mass)
    return ~torch.isfinite(zs) | (zs > growth * _weighted_sq(x, mass))


# ------------------------------------------------------------------ the custom ops --

def _system(kernels, rowptr, col, edge_value, chi, p, q, kappa, mu, eps, t_rowptr, t_col,
            t_perm, diag_index, w=None):
    if p is not None:
        if w is None:
            w, kappa = kernels.neural_edge_weights(rowptr, col, edge_value, p, q, eps,
                                                   trusted=True)
    else:
        w = edge_value
        if kappa is None:  # row sums of the fixed weights
            n = rowptr.numel() - 1
            rows = torch.repeat_interleave(torch.arange(n, device=rowptr.device),
                                           rowptr[1:] - rowptr[:-1], output_size=col.numel())
            kappa = torch.zeros_like(chi).index_add_(0, rows, w)
    return EquilibriumSystem(kernels, rowptr, col, w, chi, kappa, mu, t_rowptr=t_rowptr,
                             t_col=t_col, t_perm=t_perm, diag_index=diag_index), w, kappa


def _effective_check_every(check_every: int, device: torch.device) -> int:
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return 0  # no host reads inside a CUDA graph: a fixed max_iter sweeps
    return check_every if check_every >= 0 else default_check_every(device)


@torch.library.custom_op("dignn::implicit_solve", mutates_args=())
def _implicit_solve(rowptr: Tensor, col: Tensor, edge_value: Tensor, x: Tensor, chi: Tensor,
                    p: Optional[Tensor], q: Optional[Tensor], kappa: Optional[Tensor],
                    t_rowptr: Optional[Tensor], t_col: Optional[Tensor],
                    t_perm: Optional[Tensor], diag_index: Optional[Tensor], mu: float,
                    eps: float, max_iter: int, tol: float, solver: str, backend: str,
                    check_every: int, window: int) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """The equilibrium with ``solver`` on the passes of ``backend``. Returns (z, w, kappa,
    stats): w the neural edge weights (empty for fixed weights), kappa the diagonal of L,
    stats = [sweeps, residual, relative residual, diverged] (float64, on x's device)."""
    kernels = kernels_for(backend)
    system, w, kappa_out = _system(kernels, rowptr, col, edge_value, chi, p, q, kappa, mu, eps,
                                   t_rowptr, t_col, t_perm, diag_index)
    out = solve_forward(system, x, solver, max_iter=max_iter, tol=tol,
                        check_every=_effective_check_every(check_every, x.device),
                        window=window)
    w_out = w if p is not None else x.new_empty(0)
    return out.solution, w_out, kappa_out.clone() if kappa_out is kappa else kappa_out, \
        out.stats()


@_implicit_solve.register_fake
def _(rowptr, col, edge_value, x, chi, p, q, kappa, t_rowptr, t_col, t_perm, diag_index, mu,
      eps, max_iter, tol, solver, backend, check_every, window):
    w = x.new_empty(col.shape[0]) if p is not None else x.new_empty(0)
    stats = torch.empty(4, dtype=torch.float64, device=x.device)
    return torch.empty_like(x), w, x.new_empty(rowptr.shape[0] - 1), stats


@torch.library.custom_op("dignn::implicit_solve_backward", mutates_args=())
def _implicit_solve_backward(rowptr: Tensor, col: Tensor, edge_value: Tensor, w: Tensor,
                             kappa: Tensor, t_rowptr: Optional[Tensor],
                             t_col: Optional[Tensor], t_perm: Optional[Tensor],
                             diag_index: Optional[Tensor], x: Tensor, chi: Tensor,
                             p: Optional[Tensor], q: Optional[Tensor], z: Tensor,
                             grad_z: Tensor, mu: float, eps: float, max_iter: int, tol: float,
                             solver: str, backend: str, check_every: int,
                             window: int) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Implicit differentiation (appendix "Training for DIGNNs"): the adjoint solve with the
    same solver, then dl/dx = u, dl/dchi_i = u_i . (x_i - z_i) / chi_i, and for the neural
    Laplacian dl/dp, dl/dq from the fused gradient pass with v = ca.u. Returns (grad_x,
    grad_chi, grad_p, grad_q, stats); grad_p and grad_q are empty for fixed weights."""
    kernels = kernels_for(backend)
    neural = p is not None
    system, _, _ = _system(kernels, rowptr, col, edge_value, chi, p, q, kappa, mu, eps,
                           t_rowptr, t_col, t_perm, diag_index,
                           w=w if neural else None)
    out = solve_adjoint(system, grad_z.contiguous(), solver, max_iter=max_iter, tol=tol,
                        check_every=_effective_check_every(check_every, x.device),
                        window=window)
    u = out.solution
    grad_chi = (u * (x - z)).sum(dim=1) * system.ca * mu
    if neural:
        v = u * system.ca.unsqueeze(1)
        grad_p, grad_q = kernels.neural_weight_grad(rowptr, col, edge_value, p, q, z, v, eps,
                                                    t_rowptr, t_col, t_perm, trusted=True)
    else:
        grad_p, grad_q = x.new_empty(0), x.new_empty(0)
    return u, grad_chi, grad_p, grad_q, out.stats()


@_implicit_solve_backward.register_fake
def _(rowptr, col, edge_value, w, kappa, t_rowptr, t_col, t_perm, diag_index, x, chi, p, q, z,
      grad_z, mu, eps, max_iter, tol, solver, backend, check_every, window):
    grad_p = torch.empty_like(p) if p is not None else x.new_empty(0)
    grad_q = torch.empty_like(q) if q is not None else x.new_empty(0)
    return (torch.empty_like(x), torch.empty_like(chi), grad_p, grad_q,
            torch.empty(4, dtype=torch.float64, device=x.device))


def _solve_setup_context(ctx, inputs, output):
    (rowptr, col, edge_value, x, chi, p, q, _kappa, t_rowptr, t_col, t_perm, diag_index, mu,
     eps, max_iter, tol, solver, backend, check_every, window) = inputs
    z, w, kappa, stats = output
    ctx.mark_non_differentiable(w, kappa, stats)
    ctx.save_for_backward(rowptr, col, edge_value, w, kappa, t_rowptr, t_col, t_perm,
                          diag_index, x, chi, p, q, z)
    ctx.config = (mu, eps, max_iter, tol, solver, backend, check_every, window)
    ctx.stats_key = weakref.ref(stats) if type(stats) is torch.Tensor else None
    ctx.neural = p is not None


def _solve_backward(ctx, grad_z, grad_w, grad_kappa, grad_stats):
    if grad_z is None:
        return (None,) * 20
    saved = ctx.saved_tensors
    grad_x, grad_chi, grad_p, grad_q, stats = torch.ops.dignn.implicit_solve_backward(
        *saved, grad_z, *ctx.config)
    forward_stats = ctx.stats_key() if ctx.stats_key is not None else None
    if forward_stats is not None:
        _file_backward_stats(forward_stats, stats)
    if not ctx.neural:
        grad_p = grad_q = None
    return (None, None, None, grad_x, grad_chi, grad_p, grad_q) + (None,) * 13


torch.library.register_autograd("dignn::implicit_solve", _solve_backward,
                                setup_context=_solve_setup_context)


# ------------------------------------------------------------------ the entry point --

def resolve_solver(solver: str, symmetric: bool) -> str:
    """The solver that will run: ``cg`` needs a symmetric W and falls back to ``anderson``
    (with a warning) on directed graphs or asymmetric edge values."""
    if solver not in SOLVERS:
        raise ValueError(f"solver must be one of {SOLVERS}, got {solver!r}")
    if solver == "cg" and not symmetric:
        warnings.warn(
            "solver='cg' needs a symmetric W (an undirected graph with a_ij == a_ji): only then "
            "is (C + L/mu) Z = C X a symmetric positive definite system. This graph is directed "
            "or has asymmetric edge values, so solver='anderson' runs instead. Symmetrize the "
            "graph (torch_geometric.utils.to_undirected) to use cg, or pass solver='anderson' "
            "to silence this.", UserWarning, stacklevel=3)
        return "anderson"
    return solver


def host_reads_allowed(x: Tensor) -> bool:
    """Whether a value of ``x``'s device may be read on the host now: not while tracing for
    torch.compile, not while a CUDA graph is being captured. ``is_compiling`` comes first, so
    that Dynamo never traces the capture query (it cannot, and fullgraph=True would fail)."""
    if torch.compiler.is_compiling():
        return False
    return not (x.is_cuda and torch.cuda.is_current_stream_capturing())


def _warn_fixed_point_diverged(mu: float, stacklevel: int) -> None:
    warnings.warn(
        f"solver='fixed_point' diverged at mu={mu:g}: the iteration Z <- X - (1/mu) Delta Z "
        f"only converges when mu > lambda_max(Delta) (paper corollary 4.3), and mu={mu:g} is "
        f"below lambda_max here, so the output is not the equilibrium. Use solver='cg' "
        f"(converges for every mu > 0 on undirected graphs) or solver='anderson', or raise mu.",
        DivergenceWarning, stacklevel=stacklevel)


def implicit_diffusion(rowptr: Tensor, col: Tensor, edge_value: Tensor, x: Tensor, chi: Tensor,
                       p: Optional[Tensor] = None, q: Optional[Tensor] = None,
                       kappa: Optional[Tensor] = None, *, mu: float, eps: float = 1e-6,
                       max_iter: int = 10, tol: float = 1e-6, solver: str = "fixed_point",
                       backend: Optional[str] = None, check_every: Optional[int] = None,
                       window: int = ANDERSON_WINDOW, t_rowptr: Optional[Tensor] = None,
                       t_col: Optional[Tensor] = None, t_perm: Optional[Tensor] = None,
                       diag_index: Optional[Tensor] = None,
                       host_checks: Optional[bool] = None,
                       trusted: bool = False) -> Tuple[Tensor, Tensor]:
    """The differentiable equilibrium Z = X - (1/mu) Delta Z with a choice of solver; the
    arguments of :func:`dignn_kernels.ops.implicit_diffusion` plus:

    - ``solver``: ``"fixed_point"`` (the backend's fused ``implicit_diffusion`` loop),
      ``"cg"`` (symmetric W only: pass no t_*; directed graphs fall back to ``"anderson"``
      with a warning) or ``"anderson"``;
    - ``backend``: whose passes run the loop (``"cpu"``, ``"cuda"``, ``"triton"``,
      ``"torch"``; default: ``"cuda"`` for CUDA tensors, else ``"cpu"``);
    - ``check_every``: host reads of the convergence flag (None: 1 on the CPU, 4 on a GPU;
      0: always ``max_iter`` sweeps); ``window``: Anderson's history;
    - ``diag_index``: self-loop positions (:meth:`CSRGraph.diagonal_index`), else computed;
    - ``host_checks``: read the divergence flags on the host to warn (None: whenever
      :func:`host_reads_allowed`; False: never, so the call does not synchronize);
    - ``trusted``: skip the O(edges) graph check (:func:`dignn_kernels.ops.check_graph`, run
      once here, never per sweep) for a CSR built by :mod:`dignn_kernels.graph`.

    ``cg`` and ``anderson`` stop once ||X - Z - Delta Z/mu||_F <= tol ||X||_F (the backward:
    the adjoint's residual relative to ||g||_F); ``max_iter`` bounds the CSR sweeps. Returns
    (z, stats), stats = [iterations, residual, relative residual, ...] (for cg/anderson:
    sweeps and the residual of z; for fixed_point: the paper's ||Z_t - Z_{t-1}||_F and that
    over ||Z_t||_F). A diverging fixed point or a non-finite solve gives a
    :class:`DivergenceWarning` naming mu."""
    if backend is None:
        backend = "cuda" if x.is_cuda else "cpu"
    if backend not in KERNEL_BACKENDS:
        raise ValueError(f"backend must be one of {KERNEL_BACKENDS}, got {backend!r}")
    if isinstance(max_iter, bool) or not isinstance(max_iter, int) or max_iter < 1:
        raise ValueError(f"max_iter must be an integer >= 1, got {max_iter!r}")
    if not (isinstance(tol, (int, float)) and math.isfinite(tol) and tol >= 0):
        raise ValueError(f"tol must be a finite number >= 0, got {tol!r}")
    if not (isinstance(mu, (int, float)) and math.isfinite(mu) and mu > 0):
        raise ValueError(f"mu must be a finite number > 0, got {mu!r}")
    if check_every is not None:
        _check(check_every)
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be an integer >= 1, got {window!r}")
    _check_graph(trusted, rowptr, col, x, t_rowptr, t_col, t_perm)
    symmetric = t_rowptr is None
    solver = resolve_solver(solver, symmetric)
    host_checks = host_reads_allowed(x) if host_checks is None else \
        bool(host_checks) and host_reads_allowed(x)
    if solver == "fixed_point" and backend != "torch":
        z, stats = kernels_for(backend).implicit_diffusion(
            rowptr, col, edge_value, x, chi, p, q, kappa, mu=mu, eps=eps, max_iter=max_iter,
            tol=tol, t_rowptr=t_rowptr, t_col=t_col, t_perm=t_perm, trusted=True)
        if host_checks and bool(fixed_point_diverged(x.detach(), z.detach(), chi.detach(),
                                                        symmetric)):
            _warn_fixed_point_diverged(mu, stacklevel=3)
        return z, stats
    z, _, _, stats = torch.ops.dignn.implicit_solve(
        rowptr, col, edge_value, x, chi, p, q, kappa, t_rowptr, t_col, t_perm, diag_index,
        float(mu), float(eps), max_iter, float(tol), solver, backend,
        -1 if check_every is None else check_every, window)
    if host_checks:
        sweeps, _, relative, diverged = stats.tolist()
        if diverged and solver == "fixed_point":
            _warn_fixed_point_diverged(mu, stacklevel=3)
        elif diverged or (relative > 1.0 and relative > tol):
            warnings.warn(
                f"solver={solver!r} did not converge at mu={mu:g}: relative residual "
                f"{relative:.3g} after {int(sweeps)} sweeps (no better than the start). "
                f"Raise max_iter" + (", or use solver='cg' on an undirected graph"
                                     if solver == "anderson" else "") + ".",
                DivergenceWarning, stacklevel=3)
    return z, stats
