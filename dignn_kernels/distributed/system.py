"""The maps of the equilibrium on one rank's rows: the solvers of
:mod:`dignn_kernels.solvers.loops` run on it as on a whole graph, with all-reduced norms.

Each map is a halo exchange followed by the backend's row pass on the padded local CSR
(:class:`~dignn_kernels.solvers.system.EquilibriumSystem`, whose halo rows are guard rows):

- ``step`` and ``spd_apply`` read W Z: the owned rows are sent to the ranks whose rows read
  them (the forward plan), then one row pass;
- ``adjoint_step`` reads W^T (rs.u): one row pass over the local transpose gives, on each
  halo row, this rank's share of that remote node's sum; the reverse plan sends the shares to
  their owners, which add them (the transposed plan; the same for symmetric and directed W).

Why the exchange does not overlap the interior rows' pass (not done): every backend's row
pass is one call over all rows of a square CSR, so overlapping would need a second CSR of the
boundary rows and a row pass that writes a subset of rows, a change to every backend's pass
interface, not a simple one. On the CPU (gloo) it would gain nothing: the exchange runs on the
same cores as the pass. On GPUs (NCCL) it would pay where the exchange is a large share of
the sweep (many halo rows per owned row, e.g. the 8-part partitions measured in
bench/results/distributed_halo.json).
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..solvers.system import EquilibriumSystem
from .graph import DistributedGraph

__all__ = ["DistributedSystem"]


class DistributedSystem:
    """The maps of :class:`~dignn_kernels.solvers.system.EquilibriumSystem` on the owned rows
    of ``graph``; ``local`` is the system on its padded local CSR (built with the local
    transpose and the global ``symmetric`` flag)."""

    def __init__(self, local: EquilibriumSystem, graph: DistributedGraph):
        n = graph.num_owned
        self.local, self.graph, self.num_owned = local, graph, n
        self.reduce = graph.all_reduce
        self.vector_kernels = local.vector_kernels
        self.symmetric = local.symmetric
        self.mu = local.mu
        self.mass = local.mass[:n]
        self.decoupled = local.decoupled[:n]
        self.rs = local.rs[:n]
        self._rhs = (None, None)

    def _padded_rhs(self, rhs: Tensor) -> Tensor:
        """The right-hand side on the padded rows, kept for the solve's sweeps."""
        if self._rhs[0] is not rhs:
            self._rhs = (rhs, self.graph.pad(rhs))
        return self._rhs[1]

    def _owned(self, padded: Tensor) -> Tensor:
        return padded[: self.num_owned]

    def step(self, z: Tensor, x: Tensor) -> Tensor:
        full = self.graph.exchange.gather(z)
        return self._owned(self.local.step(_cat(z, full), self._padded_rhs(x)))

    def adjoint_step(self, u: Tensor, g: Tensor) -> Tensor:
        out = self.local.adjoint_step(self.graph.pad(u), self._padded_rhs(g))
        return self.graph.exchange.scatter_add(out[self.num_owned:], self._owned(out))

    def row_step_of(self, adjoint: bool, rhs: Tensor, c: Tensor) -> None:
        """None: a sweep here exchanges halo rows around the local row pass, so the solvers'
        loop takes its norms from the owned rows it returns."""
        return None

    def spd_product(self) -> None:
        """None: cg's sweep here exchanges halo rows around the local row pass, so cg takes
        its dot products of the owned rows it returns."""
        return None

    def spd_apply(self, y: Tensor) -> Tensor:
        return self._owned(self.local.spd_apply(_cat(y, self.graph.exchange.gather(y))))

    @property
    def inv_diagonal(self) -> Tensor:
        return self.local.inv_diagonal[: self.num_owned]


def _cat(owned: Tensor, halo: Tensor) -> Tensor:
    return torch.cat([owned, halo]) if halo.shape[0] else owned
