"""Node partitions of a graph for the distributed solve: who owns which rows, which remote rows
(the halo) each process reads, and the plans that move them.

Each rank owns some nodes (its CSR rows, global ids ascending) and reads, in its rows, columns
owned by other ranks: its halo. Its local CSR is square and padded: local ids are the owned
nodes first, then the halo nodes grouped by owning rank (ascending global id within a group),
and the halo rows are empty. So every backend's row pass runs on it unchanged, and the rows an
``all_to_all`` receives (concatenated by source rank) land in halo order as they are.

The send plan of rank s lists, per destination rank r, the local ids (owned positions) of the
rows that r reads from s, in r's halo order; the receive plan of r is the number of halo rows
per owner. The reverse of the same plan (halo rows back to their owners, summed there) carries
the adjoint on directed graphs and the gradients of halo rows.

Edge convention as in PyG and :mod:`dignn_kernels.graph`: ``edge_index[0] -> edge_index[1]``,
row i of the CSR holds the sources j that node i aggregates from; with
``flow="target_to_source"`` (the authors' DIGNN code) row i is ``edge_index[0]``. The partition
records its flow (and keeps it in its file), and the layer refuses a partition built for
another flow than its own.
"""
from __future__ import annotations

import os
import time
from typing import Dict, List, Optional, Union

import torch
from torch import Tensor

from ..archive import load_checked
from ..checks import FLOWS, check_flow
from ..graph import CSRGraph, build_graph
from ..csr import csr_rows, diagonal_index

__all__ = ["GraphPartition", "partition", "METHODS"]

#: The ``method`` choices of :func:`partition`: ``"contiguous"`` (blocks of consecutive ids)
#: and ``"metis"`` (METIS through the optional ``pymetis``).
METHODS = ("contiguous", "metis")
_FORMAT = 1
_PIECE_KEYS = ("owned", "halo", "rowptr", "col", "value", "degree", "send_index",
               "send_counts", "recv_counts")


def _check_parts(parts) -> int:
    if isinstance(parts, bool) or not isinstance(parts, int) or parts < 1:
        raise ValueError(f"parts must be an integer >= 1 (the number of processes, e.g. the "
                         f"torchrun --nproc-per-node), got {parts!r}")
    return parts


def _row_cost(graph: CSRGraph) -> Tensor:
    """The work of a row in one sweep: 1 + its CSR entries (the balance weight of both
    methods)."""
    return (graph.rowptr[1:] - graph.rowptr[:-1]) + 1


def contiguous_assignment(graph: CSRGraph, parts: int) -> Tensor:
    """Blocks of consecutive node ids of about equal work (rows + CSR entries): node i goes to
    the rank whose share of the cumulative work holds i's start. With more parts than nodes
    some ranks own nothing."""
    cost = _row_cost(graph).double()
    start = torch.cumsum(cost, 0) - cost  # work before node i
    total = float(cost.sum()) if cost.numel() else 0.0
    if total == 0.0:
        return torch.zeros(graph.num_nodes, dtype=torch.int64)
    return torch.clamp((start * parts / total).floor().long(), max=parts - 1)


def _metis_module():
    try:
        import pymetis  # noqa: F401
    except ImportError as err:
        raise ImportError("method='metis' needs pymetis, an optional dependency: install it "
                          "with `pip install pymetis` (or `pip install dignn-kernels[distributed]`"
                          "), or use method='contiguous'") from err
    return pymetis


def _metis_index_dtype(pymetis) -> torch.dtype:
    """METIS's idx_t, so that pymetis reads the arrays without a copy."""
    import numpy as np
    return torch.int64 if pymetis.zero_copy_dtype() == np.dtype(np.int64) else torch.int32


def _metis_adjacency(graph: CSRGraph):
    """(xadj, adjncy) of the symmetrized graph without self-loops: the CSR itself when W is
    symmetric (only its self-loops dropped), else the union of both directions."""
    n = graph.num_nodes
    if graph.symmetric:
        diag = diagonal_index(graph.rowptr, graph.col)
        has_loop = diag >= 0
        if not bool(has_loop.any()):
            return graph.rowptr, graph.col
        keep = torch.ones(graph.num_edges, dtype=torch.bool)
        keep[diag[has_loop]] = False
        counts = (graph.rowptr[1:] - graph.rowptr[:-1]) - has_loop.long()
        xadj = torch.zeros(n + 1, dtype=torch.int64)
        torch.cumsum(counts, 0, out=xadj[1:])
        return xadj, graph.col[keep]
    rows = csr_rows(graph.rowptr, graph.num_edges)
    cols = graph.col.long()
    keep = rows != cols
    lo = torch.minimum(rows[keep], cols[keep])
    hi = torch.maximum(rows[keep], cols[keep])
    del rows, cols, keep
    key = torch.unique(lo * n + hi)
    lo, hi = key // n, key % n
    del key
    src = torch.cat([lo, hi])
    dst = torch.cat([hi, lo])
    del lo, hi
    order = torch.argsort(src * n + dst)
    xadj = torch.zeros(n + 1, dtype=torch.int64)
    torch.cumsum(torch.bincount(src, minlength=n), 0, out=xadj[1:])
    return xadj, dst[order]


def metis_assignment(graph: CSRGraph, parts: int, seed: int = 0) -> Tensor:
    """METIS (k-way, through pymetis) on the symmetrized graph without self-loops, vertex
    weights 1 + the row's CSR entries so that the ranks' sweeps take about equal time; edge
    values are ignored (METIS minimizes the number of cut edges, which is what the exchange
    moves). A directed graph is partitioned as its symmetrization: a cut either way costs
    one halo row.

    Only the nodes with a neighbour go to METIS: its coarsening cannot match a vertex
    without edges, so each isolated node survives every level and the time grows faster
    than quadratically in their number. They cut no edge wherever they go, so they are
    spread afterwards, in id order, over the parts below the mean work
    (:func:`_spread_isolated`); METIS gets only as many parts as the connected nodes' share
    of the work needs, so that they are not cut more than the balance asks. Time: METIS on
    the connected nodes plus O(nodes + edges)."""
    pymetis = _metis_module()
    n = graph.num_nodes
    if parts == 1 or n == 0:
        return torch.zeros(n, dtype=torch.int64)
    xadj, adjncy = _metis_adjacency(graph)
    cost = _row_cost(graph)
    connected = torch.nonzero(xadj[1:] > xadj[:-1]).flatten()
    k = _parts_for(int(cost[connected].sum()), int(cost.sum()), parts)
    assignment = torch.zeros(n, dtype=torch.int64)
    assignment[connected] = _metis_parts(pymetis, xadj, adjncy, cost, connected, k, seed)
    return _spread_isolated(assignment, cost, connected, parts)


def _parts_for(connected_work: int, total_work: int, parts: int) -> int:
    """How many of ``parts`` parts the connected nodes need so that none holds more than the
    mean work (all of them when there are no isolated nodes)."""
    return max(1, min(parts, -(-connected_work * parts // max(total_work, 1))))


def _metis_parts(pymetis, xadj: Tensor, adjncy: Tensor, cost: Tensor, nodes: Tensor,
                 parts: int, seed: int) -> Tensor:
    """METIS's part (0..parts-1) of each of ``nodes``, the nodes with a neighbour, on the
    graph they induce (which holds every edge: the others have none)."""
    count = nodes.numel()
    if parts == 1 or count == 0:
        return torch.zeros(count, dtype=torch.int64)
    if parts >= count:  # one node per part (METIS rejects more parts than vertices)
        return torch.arange(count, dtype=torch.int64)
    index = _metis_index_dtype(pymetis)
    local = torch.full((xadj.numel() - 1,), -1, dtype=torch.int64)
    local[nodes] = torch.arange(count)
    sub_xadj = torch.cat([xadj[:1], xadj[nodes + 1]])  # isolated rows add no entries
    sub_adjncy = local[adjncy.long()]
    options = pymetis.Options(seed=seed)
    adjacency = pymetis.CSRAdjacency(sub_xadj.to(index).numpy(),
                                     sub_adjncy.to(index).numpy())
    _, membership = pymetis.part_graph(parts, adjacency,
                                       vweights=cost[nodes].to(index).numpy(),
                                       options=options)
    return torch.as_tensor(membership, dtype=torch.int64)


def _spread_isolated(assignment: Tensor, cost: Tensor, connected: Tensor,
                     parts: int) -> Tensor:
    """``assignment`` (set for the ``connected`` nodes) with every other node placed, in id
    order, in the parts whose work is below the mean: each part takes a run of consecutive
    isolated nodes as long as its shortfall, so that no part ends more than one node's work
    above the mean. Deterministic, O(nodes + parts)."""
    isolated = torch.ones(assignment.numel(), dtype=torch.bool)
    isolated[connected] = False
    spread = torch.nonzero(isolated).flatten()
    if spread.numel() == 0:
        return assignment
    total = cost.sum().double()
    load = torch.bincount(assignment[connected], weights=cost[connected].double(),
                          minlength=parts)
    shortfall = torch.clamp(total / parts - load, min=0)
    ends = torch.cumsum(shortfall, 0)  # part r takes the isolated work in [ends[r-1], ends[r])
    weight = cost[spread].double()
    start = torch.cumsum(weight, 0) - weight  # the isolated work before each isolated node
    # the shortfalls sum to at least the isolated work; the clamp absorbs rounding
    assignment[spread] = torch.clamp(torch.searchsorted(ends, start, right=True),
                                     max=parts - 1)
    return assignment


def _segments(rowptr: Tensor, rows: Tensor) -> Tensor:
    """The CSR positions of the entries of ``rows`` (in order)."""
    starts, counts = rowptr[rows], rowptr[rows + 1] - rowptr[rows]
    total = int(counts.sum()) if counts.numel() else 0
    offsets = torch.cumsum(counts, 0) - counts
    return torch.repeat_interleave(starts - offsets, counts, output_size=total) + \
        torch.arange(total, dtype=torch.int64)


class GraphPartition:
    """A graph split over ``parts`` ranks: the node -> rank ``assignment`` and, per rank, its
    piece: ``owned`` and ``halo`` (global ids), the padded local CSR (``rowptr``, ``col`` in
    local ids, ``value`` a_ij), the global ``degree`` D_i = sum_j a_ij of its owned and halo
    nodes (local order), and its exchange plan (``send_index``, ``send_counts``,
    ``recv_counts``). Build it with :func:`partition` or :meth:`from_assignment`; keep it with
    :meth:`save` / :meth:`load`.

    Args:
        num_nodes: int, the nodes of the whole graph.
        parts: int, the ranks.
        method: how the assignment was made (``"contiguous"``, ``"metis"``, ``"given"``).
        assignment: int64 Tensor [num_nodes], the rank of each node.
        symmetric: whether the whole graph's edge values are symmetric.
        pieces: one dict of tensors per rank (the fields above).
        seconds: the wall time of the partitioning.
        flow: the ``flow`` the graph was read with (``"source_to_target"``, PyG's default,
            or ``"target_to_source"``; see :func:`partition`).

    Example:
        >>> import torch
        >>> from dignn_kernels.distributed import partition
        >>> edge_index = torch.tensor([[0, 1, 1, 2, 2, 3], [1, 0, 2, 1, 3, 2]])  # a path
        >>> part = partition(edge_index, 4, parts=2)
        >>> part.owned(0), part.halo(0), part.owned(1), part.halo(1)
        (tensor([0, 1]), tensor([2]), tensor([2, 3]), tensor([1]))
        >>> part.stats(h=8)["halo_nodes"]
        [1, 1]
    """

    def __init__(self, num_nodes: int, parts: int, method: str, assignment: Tensor,
                 symmetric: bool, pieces: List[Dict[str, Tensor]], seconds: float = 0.0,
                 flow: str = "source_to_target"):
        self.num_nodes, self.parts, self.method = int(num_nodes), int(parts), method
        self.flow = check_flow(flow)
        self.assignment = assignment
        self.symmetric = bool(symmetric)
        self.pieces = pieces
        self.seconds = float(seconds)  # wall time of the partitioning (assignment + pieces)

    # ------------------------------------------------------------------ building --
    @classmethod
    def from_assignment(cls, edge_index: Union[Tensor, CSRGraph], num_nodes: int,
                        assignment: Tensor, parts: int, edge_weight: Optional[Tensor] = None,
                        method: str = "given", flow: str = "source_to_target"
                        ) -> "GraphPartition":
        """The partition in which node i belongs to rank ``assignment[i]`` (any split: ranks
        may own no nodes or no edges).

        Args:
            edge_index: as for :func:`partition`.
            num_nodes: int, the number of nodes.
            assignment: integer Tensor [num_nodes] of ranks in 0..parts-1.
            parts: int >= 1, the ranks.
            edge_weight: optional float Tensor [num_edges].
            method: the name kept in the partition (and its stats).
            flow: as for :func:`partition`.

        Returns:
            GraphPartition: the partition.

        Raises:
            ValueError: ``parts`` < 1, an assignment of the wrong shape or out of range, or a
                ``flow`` as :func:`partition` refuses it.

        Example:
            >>> import torch
            >>> from dignn_kernels.distributed import GraphPartition
            >>> edge_index = torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]])
            >>> part = GraphPartition.from_assignment(edge_index, 3, torch.tensor([1, 0, 1]), 2)
            >>> part.owned(0), part.owned(1)
            (tensor([1]), tensor([0, 2]))
        """
        parts = _check_parts(parts)
        began = time.perf_counter()
        graph = _as_graph(edge_index, num_nodes, edge_weight, flow)
        assignment = _check_assignment(assignment, graph.num_nodes, parts)
        pieces = _pieces(graph, assignment, parts)
        return cls(graph.num_nodes, parts, method, assignment, graph.symmetric, pieces,
                   time.perf_counter() - began, graph.flow)

    # ------------------------------------------------------------------ queries --
    def _rank(self, rank: int) -> int:
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.parts:
            raise ValueError(f"rank must be an integer in 0..{self.parts - 1} (this partition "
                             f"has {self.parts} parts), got {rank!r}")
        return rank

    def piece(self, rank: int) -> Dict[str, Tensor]:
        """Rank ``rank``'s tensors (see the class docstring)."""
        return self.pieces[self._rank(rank)]

    def owned(self, rank: int) -> Tensor:
        """The global ids of the nodes ``rank`` owns, ascending."""
        return self.piece(rank)["owned"]

    def halo(self, rank: int) -> Tensor:
        """The global ids of the remote nodes ``rank``'s rows read, in local (owner, id)
        order."""
        return self.piece(rank)["halo"]

    @property
    def num_entries(self) -> int:
        """The CSR entries of all ranks together (the graph's coalesced edges)."""
        return sum(int(p["col"].numel()) for p in self.pieces)

    def stats(self, h: int = 64, dtype: torch.dtype = torch.float32) -> dict:
        """Sizes per rank and the traffic of one sweep: each sweep moves every halo row once
        (h values of ``dtype``), forward and adjoint alike (the adjoint sends the same rows
        back). ``halo_fraction``: halo rows over all nodes; ``cut_entries``: CSR entries that
        read a halo row.

        Args:
            h: the feature width of the exchanged rows.
            dtype: their dtype.

        Returns:
            dict: sizes per rank (``owned_nodes``, ``halo_nodes``, ``entries``,
            ``cut_entries``), totals and fractions, and bytes per sweep.
        """
        item = torch.empty(0, dtype=dtype).element_size()
        owned = [int(p["owned"].numel()) for p in self.pieces]
        halo = [int(p["halo"].numel()) for p in self.pieces]
        entries = [int(p["col"].numel()) for p in self.pieces]
        cut = [int((p["col"].long() >= p["owned"].numel()).sum()) for p in self.pieces]
        sent = [int(p["send_counts"].sum()) * h * item for p in self.pieces]
        received = [n * h * item for n in halo]
        total_halo = sum(halo)
        return {
            "parts": self.parts, "method": self.method, "num_nodes": self.num_nodes,
            "num_entries": sum(entries), "symmetric": self.symmetric,
            "owned_nodes": owned, "entries": entries, "halo_nodes": halo,
            "halo_total": total_halo,
            "halo_fraction": total_halo / self.num_nodes if self.num_nodes else 0.0,
            "cut_entries": cut, "cut_fraction": sum(cut) / max(sum(entries), 1),
            "h": h, "dtype": str(dtype).replace("torch.", ""),
            "bytes_per_sweep": total_halo * h * item,
            "bytes_sent_per_rank": sent, "bytes_received_per_rank": received,
            "partition_seconds": self.seconds,
        }

    # ------------------------------------------------------------------ storage --
    def save(self, path) -> None:
        """Writes the partition to ``path`` (a file path or a binary file object, as
        torch.save takes; :meth:`load` reads it back), with CRC-32 checksums of its records.

        Args:
            path: a file path or a writable binary file object.
        """
        crc = torch.serialization.get_crc32_options()
        torch.serialization.set_crc32_options(True)  # load compares them
        try:
            torch.save({"format": _FORMAT, "num_nodes": self.num_nodes, "parts": self.parts,
                        "method": self.method, "symmetric": self.symmetric,
                        "seconds": self.seconds, "assignment": self.assignment,
                        "pieces": self.pieces, "flow": self.flow},
                       path if hasattr(path, "write") else os.fspath(path))
        finally:
            torch.serialization.set_crc32_options(crc)

    @classmethod
    def load(cls, path: Union[str, os.PathLike]) -> "GraphPartition":
        """A partition written by :meth:`save`. The file is memory-mapped, so that a rank
        reads only its own piece of a large graph; every field's type and shape is checked
        (and the counts' sums), so that a damaged or foreign file is refused with a
        ``ValueError`` naming it rather than failing later.

        Args:
            path: the file written by :meth:`save`.

        Returns:
            GraphPartition: the partition.

        Raises:
            FileNotFoundError: no file at ``path``.
            ValueError: a folder, or a damaged or foreign file.

        Example:
            >>> import os, tempfile, torch
            >>> from dignn_kernels.distributed import GraphPartition, partition
            >>> part = partition(torch.tensor([[0, 1], [1, 0]]), 2, parts=2)
            >>> path = os.path.join(tempfile.mkdtemp(), "part.pt")
            >>> part.save(path)
            >>> GraphPartition.load(path).owned(1)
            tensor([1])
        """
        path = os.fspath(path)
        if not os.path.exists(path):
            raise FileNotFoundError(f"no partition file at {path!r}; write one with "
                                    f"partition(...).save(path)")
        if os.path.isdir(path):
            raise ValueError(f"the partition file {path!r} is a folder; give the path of a "
                             f"file written by GraphPartition.save")
        data = load_checked(path, lambda why: _bad_file(path, why), mmap=True)
        if not isinstance(data, dict) or data.get("format") != _FORMAT:
            raise ValueError(f"{path!r} is not a partition written by GraphPartition.save "
                             f"(format {_FORMAT}); partition the graph again and save it")
        _check_stored(path, data)
        # files written before partitions kept their flow hold PyG's default
        return cls(data["num_nodes"], data["parts"], data["method"], data["assignment"],
                   data["symmetric"], data["pieces"], data["seconds"],
                   data.get("flow", "source_to_target"))

    def __repr__(self) -> str:
        return (f"GraphPartition(num_nodes={self.num_nodes}, parts={self.parts}, "
                f"method={self.method!r}, halo={[int(p['halo'].numel()) for p in self.pieces]}"
                + (f", flow={self.flow!r}" if self.flow != "source_to_target" else "") + ")")


def partition(edge_index: Union[Tensor, CSRGraph], num_nodes: int, parts: int,
              method: str = "contiguous", edge_weight: Optional[Tensor] = None,
              seed: int = 0, flow: str = "source_to_target") -> GraphPartition:
    """Splits the nodes of a graph (``edge_index`` in PyG's convention, or a
    :class:`~dignn_kernels.graph.CSRGraph` from :func:`~dignn_kernels.build_graph`) over
    ``parts`` ranks: ``method="contiguous"`` (blocks of consecutive ids of about equal work) or
    ``"metis"`` (METIS through the optional ``pymetis``: fewer halo rows on graphs whose ids
    do not follow their communities; ``seed`` is METIS's).

    Args:
        edge_index: int64 Tensor [2, num_edges] (read for ``flow``: by default
            ``edge_index[1]`` aggregates over ``edge_index[0]``), or a
            :class:`~dignn_kernels.CSRGraph` (built with the same ``flow``).
        num_nodes: int, the number of nodes.
        parts: int >= 1, the ranks (``torch.distributed.get_world_size()``).
        method: one of :data:`METHODS`.
        edge_weight: optional float Tensor [num_edges] (not with a CSRGraph).
        seed: METIS's seed.
        flow: PyG's ``MessagePassing(flow=...)``, as for
            :func:`~dignn_kernels.build_graph`: ``"source_to_target"`` (default) or
            ``"target_to_source"`` (row i aggregates at ``edge_index[0]``, the authors'
            DIGNN code). The partition keeps it; a layer solving on it must have the same
            ``flow``.

    Returns:
        GraphPartition: the assignment and every rank's piece.

    Raises:
        ValueError: ``parts`` < 1, an unknown ``method`` or ``flow``, a CSRGraph built with
            another ``flow``, or a graph :func:`build_graph` refuses.
        ImportError: ``method="metis"`` without ``pymetis`` installed.

    Example:
        >>> import torch
        >>> from dignn_kernels.distributed import partition
        >>> edge_index = torch.tensor([[0, 1, 1, 2, 2, 3], [1, 0, 2, 1, 3, 2]])  # a path
        >>> part = partition(edge_index, 4, parts=2)
        >>> part.assignment
        tensor([0, 0, 1, 1])
        >>> partition(edge_index, 4, parts=2, flow="target_to_source").flow
        'target_to_source'
    """
    parts = _check_parts(parts)
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    began = time.perf_counter()
    graph = _as_graph(edge_index, num_nodes, edge_weight, flow)
    if method == "metis":
        assignment = metis_assignment(graph, parts, seed)
    else:
        assignment = contiguous_assignment(graph, parts)
    pieces = _pieces(graph, assignment, parts)
    return GraphPartition(graph.num_nodes, parts, method, assignment, graph.symmetric, pieces,
                          time.perf_counter() - began, graph.flow)


def _bad_file(path: str, why: str) -> ValueError:
    return ValueError(f"the partition file {path!r} cannot be used: {why}; it is damaged (a "
                      f"truncated or altered file) or not written by GraphPartition.save: "
                      f"partition the graph again and save it (or remove the file)")


_INDEX_KEYS = ("owned", "halo", "rowptr", "send_index", "send_counts", "recv_counts")


def _check_stored(path: str, data: dict) -> None:
    """Refuses a stored partition whose fields are not of the types and shapes
    :meth:`GraphPartition.save` writes (reading only metadata, the assignment and the
    counts, not the pieces' edges)."""
    def is_int(v):
        return isinstance(v, int) and not isinstance(v, bool)

    missing = [k for k in ("num_nodes", "parts", "method", "symmetric", "seconds",
                           "assignment", "pieces") if k not in data]
    if missing:
        raise _bad_file(path, f"it lacks {', '.join(missing)}")
    n, parts = data["num_nodes"], data["parts"]
    if not is_int(n) or n < 0:
        raise _bad_file(path, f"num_nodes is {n!r}, not an integer >= 0")
    if not is_int(parts) or parts < 1:
        raise _bad_file(path, f"parts is {parts!r}, not an integer >= 1")
    if data.get("flow", FLOWS[0]) not in FLOWS:
        raise _bad_file(path, f"its flow is {data['flow']!r}, not one of {FLOWS}")
    if not isinstance(data["method"], str) or not isinstance(data["symmetric"], bool) or \
            not isinstance(data["seconds"], (int, float)) or isinstance(data["seconds"], bool):
        raise _bad_file(path, "method, symmetric and seconds must be a string, a bool and a "
                              "number")
    assignment = data["assignment"]
    if not isinstance(assignment, Tensor) or assignment.dim() != 1 or \
            assignment.numel() != n or assignment.dtype != torch.int64:
        got = (f"{assignment.dtype} {list(assignment.shape)}" if isinstance(assignment, Tensor)
               else type(assignment).__name__)
        raise _bad_file(path, f"the assignment is {got}, not int64 [{n}]")
    if n and (int(assignment.min()) < 0 or int(assignment.max()) >= parts):
        raise _bad_file(path, f"the assignment holds ranks outside 0..{parts - 1}")
    pieces = data["pieces"]
    if not isinstance(pieces, list) or len(pieces) != parts:
        got = len(pieces) if isinstance(pieces, list) else type(pieces).__name__
        raise _bad_file(path, f"it must hold {parts} pieces (one per part), got {got}")
    owned_total = 0
    for r, piece in enumerate(pieces):
        if not isinstance(piece, dict) or set(piece) != set(_PIECE_KEYS) or \
                not all(isinstance(v, Tensor) and v.dim() == 1 for v in piece.values()):
            raise _bad_file(path, f"piece {r} must map {', '.join(_PIECE_KEYS)} to 1-D "
                                  f"tensors")
        wrong = [k for k in _INDEX_KEYS if piece[k].dtype != torch.int64]
        if piece["col"].dtype not in (torch.int32, torch.int64):
            wrong.append("col")
        wrong += [k for k in ("value", "degree") if not piece[k].is_floating_point()]
        if wrong:
            raise _bad_file(path, f"piece {r} has {', '.join(wrong)} of the wrong dtype")
        n_own, n_halo = piece["owned"].numel(), piece["halo"].numel()
        sizes = {"rowptr": n_own + n_halo + 1, "value": piece["col"].numel(),
                 "degree": n_own + n_halo, "send_counts": parts, "recv_counts": parts}
        bad = [f"{k} has {piece[k].numel()} entries, not {v}" for k, v in sizes.items()
               if piece[k].numel() != v]
        if not bad and int(piece["rowptr"][-1]) != piece["col"].numel():
            bad.append(f"rowptr ends at {int(piece['rowptr'][-1])}, not at its "
                       f"{piece['col'].numel()} entries")
        if not bad and int(piece["recv_counts"].sum()) != n_halo:
            bad.append(f"recv_counts sum to {int(piece['recv_counts'].sum())}, not its "
                       f"{n_halo} halo nodes")
        if not bad and int(piece["send_counts"].sum()) != piece["send_index"].numel():
            bad.append(f"send_counts sum to {int(piece['send_counts'].sum())}, not its "
                       f"{piece['send_index'].numel()} sent rows")
        if bad:
            raise _bad_file(path, f"piece {r}: {'; '.join(bad)}")
        owned_total += n_own
    if owned_total != n:
        raise _bad_file(path, f"its pieces own {owned_total} nodes, not {n}")


# ----------------------------------------------------------------------- helpers --

def _as_graph(edge_index, num_nodes, edge_weight, flow: str) -> CSRGraph:
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 0:
        raise ValueError(f"num_nodes must be an integer >= 0, got {num_nodes!r}")
    flow = check_flow(flow)
    if isinstance(edge_index, CSRGraph):
        if edge_index.flow != flow:
            raise ValueError(f"the CSRGraph was built with flow={edge_index.flow!r} but "
                             f"flow={flow!r}: pass flow={edge_index.flow!r} (or build the "
                             f"graph with flow={flow!r})")
        if edge_weight is not None:
            raise ValueError("edge_weight goes into the CSRGraph: pass it to build_graph, not "
                             "with a prebuilt graph")
        if edge_index.num_nodes != num_nodes:
            raise ValueError(f"the CSRGraph has {edge_index.num_nodes} nodes but num_nodes="
                             f"{num_nodes}")
        graph = edge_index.check()
    else:
        graph = build_graph(edge_index, num_nodes, edge_weight, flow=flow)
    if graph.device.type != "cpu":
        raise ValueError(f"partition on the CPU: the graph is on {graph.device}; pass "
                         f"edge_index.cpu() (DistributedGraph moves each piece to its device)")
    return graph


def _check_assignment(assignment, num_nodes: int, parts: int) -> Tensor:
    if not isinstance(assignment, Tensor) or assignment.dim() != 1 or \
            assignment.numel() != num_nodes or assignment.is_floating_point():
        got = list(assignment.shape) if isinstance(assignment, Tensor) else repr(assignment)
        raise ValueError(f"assignment must be an integer tensor of shape [{num_nodes}] (the "
                         f"rank of every node), got {got}")
    assignment = assignment.long().cpu()
    if num_nodes and (int(assignment.min()) < 0 or int(assignment.max()) >= parts):
        raise ValueError(f"assignment holds ranks {int(assignment.min())}.."
                         f"{int(assignment.max())}, outside 0..{parts - 1} (parts={parts})")
    return assignment


def _pieces(graph: CSRGraph, assignment: Tensor, parts: int) -> List[Dict[str, Tensor]]:
    """Every rank's piece, in O(n + m log m + k * parts) for k ranks that own nodes: the
    ranks are handled all at once by sorting (a loop over pairs of ranks would take parts^2
    steps even on a tiny graph). Every rank that owns nodes has a count per peer (what
    all_to_all takes); the ranks that own none share one set of empty tensors (read only)."""
    n, m = graph.num_nodes, graph.num_edges
    rowptr, col, value = graph.rowptr, graph.col.long(), graph.value
    owned_count = torch.bincount(assignment, minlength=parts)
    order = torch.argsort(assignment, stable=True)  # owned nodes by rank, ids ascending
    owned_start = torch.cumsum(owned_count, 0) - owned_count
    pos_in_owner = torch.empty(n, dtype=torch.int64)  # a node's position among its owner's
    pos_in_owner[order] = torch.arange(n) - owned_start[assignment[order]]
    # the CSR entries grouped by the rank that owns their row, rows in owned order
    row_len = rowptr[1:] - rowptr[:-1]
    entries = _segments(rowptr, order)
    entry_count = torch.bincount(assignment, weights=row_len.double(),
                                 minlength=parts).long() if n else owned_count
    reader = torch.repeat_interleave(assignment[order], row_len[order], output_size=m)
    cols = col[entries]
    owner = assignment[cols]
    remote = reader != owner
    # the halo: (reader, node) pairs of remote entries, ordered by reader, owner, node id
    pair, inverse = torch.unique(reader[remote] * max(n, 1) + cols[remote],
                                 return_inverse=True)
    halo_reader, halo_node = pair // max(n, 1), pair % max(n, 1)
    halo_owner = assignment[halo_node]
    by_owner = torch.argsort(halo_reader * parts + halo_owner, stable=True)
    halo_reader, halo_node, halo_owner = (halo_reader[by_owner], halo_node[by_owner],
                                          halo_owner[by_owner])
    halo_count = torch.bincount(halo_reader, minlength=parts)
    halo_start = torch.cumsum(halo_count, 0) - halo_count
    slot = torch.empty_like(by_owner)  # a pair's position in the sorted halo list
    slot[by_owner] = torch.arange(by_owner.numel())
    # local ids: owned nodes first (their position), then the halo (n_own + its position)
    local = pos_in_owner[cols]
    remote_reader = reader[remote]
    local[remote] = owned_count[remote_reader] + slot[inverse] - halo_start[remote_reader]
    # send plans: rank s sends, for each r ascending, the rows of r's halo it owns, in r's
    # halo order (the pairs sorted by owner, then reader, then node id)
    by_sender = torch.argsort(halo_owner, stable=True)
    send_index_all = pos_in_owner[halo_node[by_sender]]
    send_reader = halo_reader[by_sender]
    send_count = torch.bincount(halo_owner, minlength=parts)

    empty = torch.zeros(0, dtype=torch.int64)
    zeros = torch.zeros(parts, dtype=torch.int64)
    idle = {"owned": empty, "halo": empty, "rowptr": torch.zeros(1, dtype=torch.int64),
            "col": torch.zeros(0, dtype=torch.int32), "value": value.new_zeros(0),
            "degree": graph.degree.new_zeros(0), "recv_counts": zeros, "send_index": empty,
            "send_counts": zeros}
    bounds = {name: torch.cumsum(count, 0).tolist() for name, count in (
        ("owned", owned_count), ("entries", entry_count), ("halo", halo_count),
        ("send", send_count))}
    busy = set(torch.nonzero(owned_count).flatten().tolist())
    pieces = []
    for r in range(parts):
        if r not in busy:
            pieces.append(dict(idle))
            continue
        o1, e1, h1, s1 = (bounds[k][r] for k in ("owned", "entries", "halo", "send"))
        o0, e0 = o1 - int(owned_count[r]), e1 - int(entry_count[r])
        h0, s0 = h1 - int(halo_count[r]), s1 - int(send_count[r])
        owned, halo = order[o0:o1], halo_node[h0:h1]
        n_own, n_halo = owned.numel(), halo.numel()
        local_rowptr = torch.zeros(n_own + n_halo + 1, dtype=torch.int64)
        torch.cumsum(row_len[owned], 0, out=local_rowptr[1:n_own + 1])
        local_rowptr[n_own + 1:] = local_rowptr[n_own]
        index_dtype = torch.int32 if n_own + n_halo < 2**31 - 1 else torch.int64
        pieces.append({
            "owned": owned.clone(), "halo": halo.clone(), "rowptr": local_rowptr,
            "col": local[e0:e1].to(index_dtype, copy=True), "value": value[entries[e0:e1]],
            "degree": graph.degree[torch.cat([owned, halo])],
            "recv_counts": torch.bincount(halo_owner[h0:h1], minlength=parts),
            "send_index": send_index_all[s0:s1].clone(),
            "send_counts": torch.bincount(send_reader[s0:s1], minlength=parts),
        })
    return pieces
