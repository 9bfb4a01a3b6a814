"""The maps of one equilibrium problem on a backend's passes (paper eq. 17 and its adjoint).

The layer's equilibrium is Z = X - (1/mu) Delta Z with Delta = C^-1 L, C = diag(chi),
L = K - W, K = diag(kappa) (:mod:`dignn_kernels.laplacian`). Every map below is one row pass
(:attr:`Backend.csr_fma <dignn_kernels.backends.interface.Backend>`) with per-row
coefficients, so the solvers (:mod:`.registry`) run on every backend; it is prepared once per
system as the backend's row map (:attr:`Backend.row_map`: on the GPU backends, the CSR checked
and scheduled once for all of a solve's sweeps; elsewhere the ``csr_fma`` op itself).
"""
from typing import Callable, Optional

import torch
from torch import Tensor

from ..backends.interface import Backend, op_row_map
from ..csr import diagonal_index
from ..laplacian import guard_rows, node_mass, row_coefficients

__all__ = ["EquilibriumSystem"]


class EquilibriumSystem:
    """The maps of one equilibrium problem on a CSR graph with edge weights ``w``:

    - ``step(z, x) = x + cy.z + rs.(W z)``: the forward fixed-point map (eq. iter; ``cy``
      and ``rs`` the row coefficients, named as ``csr_fma`` names them);
    - ``adjoint_step(u, g) = g + cy.u + W^T (rs.u)``: the adjoint fixed-point map;
      both in z's (u's) dtype, or from 16-bit z in ``out_dtype`` (the wide last iteration
      of a 16-bit fixed point);
    - ``row_step_of``: either map as the backend's row step, if it has one;
    - ``spd_apply(y) = (S + L/mu) y``: the SPD matrix, S = diag(chi) with 1 on guard rows,
      identity rows on guard rows;
    - ``spd_product``: that product with its dot products as the backend's row product, if
      it has one (cg's sweep);
    - ``mass`` = diag(S), ``inv_diagonal`` = 1 / diag(S + L/mu) (Jacobi);
    - ``decoupled`` marks rows whose own row of the SPD matrix has no coupling to other
      nodes (guard rows, rows without edges), whose SPD solution is rhs_i / A_ii outright;
      a guard row's column may still couple (``guard_coupled``): cg eliminates it.

    ``kappa`` is the diagonal of L (row sums of W for the neural, rw and unnormalized
    Laplacians, 1 for sym). ``t_rowptr, t_col, t_perm`` describe W^T for directed graphs
    (None: W is symmetric, and the adjoint reads W^T from W's own CSR). ``symmetric`` says
    whether W is symmetric (default: no t_* given); a partitioned graph passes its global
    flag with the transpose of its local, padded CSR (:mod:`dignn_kernels.distributed`).
    ``diag_index`` locates the self-loops (computed when None).

    ``reduce`` sums per-process partial sums (norms, dot products) over the processes of a
    partitioned solve; None here, where every row is local. ``vector_kernels`` is the
    backend's (:attr:`Backend.vector_kernels`): who runs the solvers' vector work."""

    reduce = None

    def __init__(self, backend: Backend, rowptr: Tensor, col: Tensor, w: Tensor, chi: Tensor,
                 kappa: Tensor, mu: float, *, t_rowptr: Optional[Tensor] = None,
                 t_col: Optional[Tensor] = None, t_perm: Optional[Tensor] = None,
                 diag_index: Optional[Tensor] = None, symmetric: Optional[bool] = None):
        self.row_map = backend.row_map or op_row_map(backend.csr_fma)
        self.row_step = backend.row_step
        self.row_product = backend.row_product
        self.vector_kernels = backend.vector_kernels
        self.rowptr, self.col, self.w = rowptr, col, w
        self.mu = float(mu)
        self.symmetric = t_rowptr is None if symmetric is None else bool(symmetric)
        self._transposed = (t_rowptr, t_col, t_perm)
        self._diag_index = diag_index
        self.guard = guard_rows(chi)
        self.ones = torch.ones_like(chi)
        self.mass = node_mass(chi)
        self.cy, self.rs = row_coefficients(chi, kappa, self.mu)
        self.kappa = kappa
        self.decoupled = self.guard | (rowptr[1:] == rowptr[:-1])
        self._adjoint = None
        self._spd = None
        self._zeros = None
        self._prepared = {}

    def _map(self, adjoint: bool):
        """(rowptr, col, w, cy, rs) of the row pass of the forward or the adjoint map."""
        if not adjoint:
            return self.rowptr, self.col, self.w, self.cy, self.rs
        if self._adjoint is None:
            t_rowptr, t_col, t_perm = self._transposed
            if t_rowptr is None:
                t_rowptr, t_col, t_w = self.rowptr, self.col, self.w
            else:
                t_w = self.w[t_perm]
            # entry (j, i) of W^T carries W_ij rs_i, so that W^T (rs.u) is one CSR product
            self._adjoint = (t_rowptr, t_col, t_w * self.rs[t_col.long()], self.cy, self.ones)
        return self._adjoint

    def _prepared_map(self, which: str) -> Callable[..., Tensor]:
        """``map(y, b, out_dtype=None)``: the row pass of the forward map, the adjoint map or
        the SPD matrix (``which``), made once per system (the backend's row map; see the pass
        interface's ``row_map``)."""
        prepared = self._prepared.get(which)
        if prepared is None:
            if which == "spd":
                spd_cy, spd_rs, _ = self._spd_terms()
                rowptr, col, w, cy, rs = self.rowptr, self.col, self.w, spd_cy, spd_rs
            else:
                rowptr, col, w, cy, rs = self._map(which == "adjoint")
            prepared = self.row_map(rowptr, col, w, cy, rs)
            self._prepared[which] = prepared
        return prepared

    def step(self, z: Tensor, x: Tensor, out_dtype: Optional[torch.dtype] = None) -> Tensor:
        return self._prepared_map("forward")(z, x, out_dtype)

    def adjoint_step(self, u: Tensor, g: Tensor, out_dtype: Optional[torch.dtype] = None
                     ) -> Tensor:
        return self._prepared_map("adjoint")(u, g, out_dtype)

    def row_step_of(self, adjoint: bool, rhs: Tensor, c: Tensor
                    ) -> Optional[Callable[[Tensor, Tensor, Tensor, Tensor, int], None]]:
        """The backend's row step of the forward (or adjoint) map with right-hand side
        ``rhs`` and certificate weights ``c``, prepared for one solve (see the pass
        interface's ``row_step``); None where the backend has none."""
        if self.row_step is None:
            return None
        rowptr, col, w, cy, rs = self._map(adjoint)
        return self.row_step(rowptr, col, w, rhs, cy, rs, c)

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
        if self._zeros is None or self._zeros.shape != y.shape:
            self._zeros = torch.zeros_like(y)
        return self._prepared_map("spd")(y, self._zeros)

    def spd_product(self) -> Optional[Callable[[Tensor, Tensor, Tensor], Tensor]]:
        """The backend's row product of (S + L/mu), prepared for one solve: ``product(y, out,
        done)`` writes (S + L/mu) y into ``out`` and returns the dots out.y per channel (see
        the pass interface's ``row_product``); None where the backend has none."""
        if self.row_product is None:
            return None
        spd_cy, spd_rs, _ = self._spd_terms()
        return self.row_product(self.rowptr, self.col, self.w, spd_cy, spd_rs)

    @property
    def guard_coupled(self) -> Tensor:
        """On the device: whether a guard row has edges (W symmetric: other rows read it),
        so that cg eliminates it (:func:`.loops.conjugate_gradient`)."""
        has_edges = self.rowptr[1:] != self.rowptr[:-1]
        return (self.guard & has_edges).any()

    @property
    def inv_diagonal(self) -> Tensor:
        return self._spd_terms()[2]
