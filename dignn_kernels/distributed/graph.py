"""``DistributedGraph``: one rank's piece of a :class:`GraphPartition`, on its device, with
everything the layer needs of it (the local CSR and its transpose, global degrees, the
exchange plan, the all-reduce), computed once."""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

from ..csr import csr_rows, diagonal_index, transpose_csr
from ..graph import fixed_weights
from .exchange import HaloExchange, all_reduce_sum, with_halo
from .partition import GraphPartition

__all__ = ["DistributedGraph"]


class DistributedGraph:
    """The piece of ``partition`` that ``rank`` of ``group`` owns, on ``device``, to pass to
    :class:`~dignn_kernels.FusedImplicitDiffusion` in place of ``edge_index``. On each rank::

        graph = DistributedGraph(partition)          # rank, group: torch.distributed's
        z_owned = layer(x[graph.owned], graph)       # the owned rows of Z

    ``rank`` and ``group`` default to the current process and the default group (call
    ``torch.distributed.init_process_group`` first); the partition must have as many parts as
    the group has ranks. ``device`` defaults to the current CUDA device for the NCCL backend,
    else the CPU.

    Holds: ``owned``, ``halo`` (global ids), ``num_owned``, ``num_halo``; the padded local CSR
    (``rowptr``, ``col``, ``value``; local ids owned first, then halo; halo rows empty) and its
    transpose; the global degree of the owned and halo nodes; ``symmetric`` (whether the
    global W is); the exchange plan.

    Args:
        partition: the :class:`GraphPartition` (every rank passes the same one, or loads the
            same file).
        rank: None (this process's rank in ``group``), or that same rank.
        group: the process group (None: the default one).
        device: where this rank's piece goes (default: see above).

    Raises:
        TypeError: ``partition`` not a GraphPartition.
        RuntimeError: torch.distributed not initialized.
        ValueError: the partition's parts differ from the group's ranks, or ``rank`` is not
            this process's.

    Example:
        >>> import torch
        >>> import torch.distributed as dist
        >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        >>> from dignn_kernels import FusedImplicitDiffusion
        >>> from dignn_kernels.distributed import DistributedGraph, partition
        >>> edge_index = torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]])
        >>> graph = DistributedGraph(partition(edge_index, 3, parts=1))
        >>> graph
        DistributedGraph(rank=0/1, owned=3, halo=0, entries=4, device=cpu)
        >>> layer = FusedImplicitDiffusion(2, laplacian="rw")
        >>> layer(torch.ones(3, 2)[graph.owned], graph).shape
        torch.Size([3, 2])
        >>> dist.destroy_process_group()
    """

    def __init__(self, partition: GraphPartition, rank: Optional[int] = None, group=None,
                 device=None):
        if not isinstance(partition, GraphPartition):
            raise TypeError(f"partition must be a GraphPartition (from "
                            f"dignn_kernels.distributed.partition or GraphPartition.load), got "
                            f"{type(partition).__name__}")
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("DistributedGraph needs torch.distributed: call "
                               "torch.distributed.init_process_group(...) first (torchrun sets "
                               "its environment)")
        world = dist.get_world_size(group)
        if partition.parts != world:
            raise ValueError(f"the partition has {partition.parts} parts but the process group "
                             f"has {world} ranks: partition the graph with parts={world}")
        group_rank = dist.get_rank(group)
        if rank is None:
            rank = group_rank
        elif rank != group_rank:
            raise ValueError(f"rank={rank} but this process is rank {group_rank} of the "
                             f"process group; leave rank=None (every process holds its own "
                             f"piece)")
        if device is None:
            device = torch.device("cpu")
            if dist.get_backend(group) == "nccl":
                device = torch.device("cuda", torch.cuda.current_device())
        self.device = torch.device(device)
        self.partition, self.rank, self.group, self.world_size = partition, rank, group, world
        piece = {k: v.to(self.device) for k, v in partition.piece(rank).items()}
        self.owned, self.halo = piece["owned"], piece["halo"]
        self.num_owned, self.num_halo = int(self.owned.numel()), int(self.halo.numel())
        self.num_local = self.num_owned + self.num_halo
        self.num_nodes = partition.num_nodes
        self.rowptr, self.col, self.value = piece["rowptr"], piece["col"], piece["value"]
        self.degree = piece["degree"]  # global D of owned + halo nodes, local order
        self.symmetric = partition.symmetric
        self._transposed = transpose_csr(self.rowptr, self.col, self.num_local)
        active = any(int(p["halo"].numel()) for p in partition.pieces)
        self.exchange = HaloExchange(piece["send_index"], piece["send_counts"].tolist(),
                                     piece["recv_counts"].tolist(), group, active)
        self.all_reduce = all_reduce_sum(group)
        self._by_dtype: Dict = {}

    @property
    def num_edges(self) -> int:
        """The CSR entries of this rank's rows."""
        return int(self.col.numel())

    def transposed(self) -> Tuple[Tensor, Tensor, Tensor]:
        """(t_rowptr, t_col, t_perm) of the padded local CSR: its rows are the owned and halo
        nodes, holding the entries of the owned rows that read them."""
        return self._transposed

    def diagonal_index(self) -> Tensor:
        """int64 [num_local]: the local CSR position of each row's self-loop, or -1 (as
        :meth:`dignn_kernels.CSRGraph.diagonal_index`)."""
        if "diag" not in self._by_dtype:
            self._by_dtype["diag"] = diagonal_index(self.rowptr, self.col)
        return self._by_dtype["diag"]

    def with_halo(self, owned_rows: Tensor) -> Tensor:
        """[owned rows; halo rows] of a row-distributed tensor, differentiable."""
        return with_halo(self.exchange, owned_rows)

    def pad(self, owned_rows: Tensor) -> Tensor:
        """[owned rows; zeros]: a row-distributed tensor on the padded local rows."""
        return torch.cat([owned_rows, owned_rows.new_zeros((self.num_halo,) +
                                                           tuple(owned_rows.shape[1:]))])

    def values(self, dtype: torch.dtype) -> Tuple[Tensor, Tensor]:
        """(a, D): the local edge values and the degree of the owned nodes, in ``dtype``."""
        key = ("a", dtype)
        if key not in self._by_dtype:
            self._by_dtype[key] = (self.value.to(dtype),
                                   self.degree[: self.num_owned].to(dtype))
        return self._by_dtype[key]

    def fixed_laplacian(self, laplacian: str, dtype: torch.dtype
                        ) -> Tuple[Tensor, Tensor, Tensor]:
        """(W, chi, kappa) on the padded local rows, as
        :meth:`dignn_kernels.graph.CSRGraph.fixed_laplacian` gives them for the whole graph
        (sym reads the global degree of the halo nodes); chi and kappa are 0 on the halo
        rows, which are guard rows of the local system."""
        key = (laplacian, dtype)
        if key in self._by_dtype:
            return self._by_dtype[key]
        rows = csr_rows(self.rowptr, self.num_edges)
        w, chi, kappa = fixed_weights(laplacian, self.value.to(dtype), self.degree.to(dtype),
                                      rows, self.col.long())
        guard = torch.arange(self.num_local, device=self.device) >= self.num_owned
        out = (w, chi.masked_fill(guard, 0.0), kappa.masked_fill(guard, 0.0))
        self._by_dtype[key] = out
        return out

    def __repr__(self) -> str:
        return (f"DistributedGraph(rank={self.rank}/{self.world_size}, owned={self.num_owned}, "
                f"halo={self.num_halo}, entries={self.num_edges}, device={self.device})")
