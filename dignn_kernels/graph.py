"""Graph preprocessing: validation, CSR build, degree, transpose, fixed Laplacian weights.

Convention (PyTorch Geometric's message flow, ``flow="source_to_target"``, the default): an
edge ``(edge_index[0, k], edge_index[1, k]) = (j, i)`` carries a message from source ``j`` to
target ``i``, so row ``i`` of the CSR lists the sources that node ``i`` aggregates from and
``a_ij = edge_weight[k]``. ``flow="target_to_source"`` reads the edge the other way, ``(i, j)``:
node ``i = edge_index[0, k]`` aggregates, as in the authors' DIGNN code; the same as passing
``edge_index.flip(0)`` (PyG's ``MessagePassing(flow=...)`` names and values). A torch sparse
tensor or a torch_sparse ``SparseTensor`` is read the way PyG reads ``adj_t``: row ``i`` is the
target (``flow="target_to_source"`` is refused there, as PyG refuses it: pass the transposed
tensor). For the undirected graphs of the paper the distinction does not matter.

Duplicate edges are summed (the Laplacian only ever sees sum_k a_k over parallel edges), so
every graph is stored coalesced. Sums of 16-bit edge weights (parallel edges, degrees D_i =
sum_j a_ij) accumulate in float32 and the graph keeps float32 values: summed in bfloat16, a hub
of 600 unit edges would get degree 256. Every torch sparse layout is read (COO, CSR, CSC, BSR,
BSC; the zeros inside a block of BSR/BSC are not edges).

Building a :class:`CSRGraph` costs a sort of the edges; :func:`cached_graph` keeps the result
for a static graph so that later forward passes skip it, keyed by a fingerprint of the graph's
contents read on every call (so it is never stale, whatever wrote the tensors). A
:class:`CSRGraph` owns its tensors (it never aliases the caller's), so it is a snapshot: later
writes to ``edge_index`` do not change it. Graphs and what they derive are made outside
``torch.inference_mode``, so a graph first seen under inference mode also serves training.

The node indices of the input are checked once, when the graph is built; the CSR built from
them is valid by construction, so the layer passes it to the ops with ``trusted=True`` and
never runs their O(edges) graph check (:func:`dignn_kernels.ops.check_graph`) per forward.

``reorder`` renumbers the nodes for locality (:mod:`dignn_kernels.reorder`): the CSR is then
that of P A P^T, ``order`` maps its positions to the caller's ids and ``position`` back, and
the layer permutes x on the way in and Z on the way out, so callers never see the new ids.
"""
from __future__ import annotations

import functools
import numbers
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple, Union

import numpy as np
import torch
import xxhash
from torch import Tensor

from .csr import csr_rows, diagonal_index, rowptr_from_sorted_rows, transpose_csr
from .reorder import check_reorder, inverse_order, node_order
from .solvers import host_reads_allowed
from . import checks

__all__ = ["CSRGraph", "build_graph", "cached_graph", "clear_graph_cache", "transpose_csr",
           "diagonal_index", "csr_rows", "LAPLACIANS"]

LAPLACIANS = ("neural", "rw", "unnormalized", "sym")

#: The torch sparse layouts a graph may come in, each read as PyG reads ``adj_t``.
SPARSE_LAYOUTS = (torch.sparse_coo, torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr,
                  torch.sparse_bsc)


def _outside_inference(method):
    """Runs ``method`` with ``torch.inference_mode`` off: tensors made under inference mode
    cannot be saved for backward, so a graph (or a derived tensor it caches) first made inside
    ``torch.inference_mode()`` would make every later training step fail. Not while
    torch.compile traces (inference mode is then not on, and the query is not traced)."""
    @functools.wraps(method)
    def run(*args, **kwargs):
        if not torch.compiler.is_compiling() and torch.is_inference_mode_enabled():
            with torch.inference_mode(False):
                return method(*args, **kwargs)
        return method(*args, **kwargs)
    return run


@dataclass
class CSRGraph:
    """A coalesced CSR graph and what the kernels need of it, computed once.

    Row i of the CSR lists the sources j that node i aggregates from (PyG's default flow: an
    edge ``(edge_index[0, k], edge_index[1, k]) = (j, i)``; ``flow`` records which end of
    ``edge_index`` the rows were taken from), parallel edges summed. Build it with
    :func:`build_graph` (valid by construction) or :func:`cached_graph`; a graph assembled by
    hand is checked once (:meth:`check`) when the layer first takes it. Pass it to
    :class:`~dignn_kernels.FusedImplicitDiffusion` in place of ``edge_index`` (what
    ``torch.compile(..., fullgraph=True)`` needs).

    Args:
        num_nodes: int, the number of nodes n.
        rowptr: int64 Tensor [n + 1], the CSR row pointers.
        col: int32 Tensor [m] (int64 beyond 2^31 nodes), the source of each entry.
        value: float Tensor [m], the edge values a_ij >= 0 (float32 for 16-bit input
            weights, summed over parallel edges in float32).
        degree: Tensor [n] of value's dtype, D_i = sum_j a_ij.
        symmetric: whether a_ij == a_ji for every pair (then the kernels read W^T from W's
            CSR; a directed graph marked symmetric would get wrong gradients).
        order: None (the caller's ids), or int64 Tensor [n]: the caller's id of the node at
            CSR position k (a locality renumbering, :mod:`dignn_kernels.reorder`).
        position: None, or int64 Tensor [n], the inverse of ``order``.
        reorder: the method that made ``order`` (``"none"``: no renumbering).
        flow: the ``flow`` the graph was built with (:data:`dignn_kernels.checks.FLOWS`):
            ``"source_to_target"`` (rows at ``edge_index[1]``, the default) or
            ``"target_to_source"`` (rows at ``edge_index[0]``). The CSR itself is the same
            kind of object either way; a layer given the graph checks that its own ``flow``
            is this one, so that a graph built for one convention is never solved as if it
            were the other.

    Raises:
        ValueError: from :meth:`check`, when the fields are not a valid graph.

    Example:
        >>> import torch
        >>> from dignn_kernels import build_graph
        >>> g = build_graph(torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]]), 3)  # path 0 - 1 - 2
        >>> g.rowptr, g.col, g.degree
        (tensor([0, 1, 3, 4]), tensor([1, 0, 2, 1], dtype=torch.int32), tensor([1., 2., 1.]))
        >>> g.num_edges, g.symmetric, g.flow
        (4, True, 'source_to_target')
    """

    num_nodes: int
    rowptr: Tensor  # int64 [n + 1]
    col: Tensor  # int32 (int64 beyond 2^31 nodes) [m]
    value: Tensor  # float edge values a_ij [m]
    degree: Tensor  # D_i = sum_j a_ij [n], dtype of value
    symmetric: bool  # a_ij == a_ji for every pair, so W is symmetric
    # Locality renumbering (None: the caller's ids): the node at CSR position k is the
    # caller's node order[k]; the caller's node i sits at position[i].
    order: Optional[Tensor] = None
    position: Optional[Tensor] = None
    reorder: str = "none"  # the method that made ``order`` ("none": no renumbering)
    # Which end of edge_index the rows were read from (checks.FLOWS); the layer refuses a
    # graph whose flow is not its own.
    flow: str = "source_to_target"
    _checked: bool = field(default=False, repr=False)  # valid CSR (built here, or check())
    _transposed: Optional[Tuple[Tensor, Tensor, Tensor]] = field(default=None, repr=False)
    _by_dtype: Dict = field(default_factory=dict, repr=False)

    @property
    def num_edges(self) -> int:
        """The CSR entries m (edges after parallel ones are summed)."""
        return self.col.numel()

    @property
    def device(self) -> torch.device:
        """The device of the CSR's tensors."""
        return self.rowptr.device

    def _check_rows(self, t, name: str) -> None:
        # a signal with more rows than nodes would be cut to num_nodes by the index_select
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() < 1 or t.shape[0] != self.num_nodes:
            raise ValueError(f"{name} must have one row per node ({self.num_nodes}), got shape "
                             f"{list(t.shape)}")

    def to_graph_order(self, x: Tensor) -> Tensor:
        """Rows of ``x`` (the caller's node order) in the CSR's node order."""
        self._check_rows(x, "x")
        return x if self.order is None else x.index_select(0, self.order)

    def to_user_order(self, z: Tensor) -> Tensor:
        """Rows of ``z`` (the CSR's node order) back in the caller's node order."""
        self._check_rows(z, "z")
        return z if self.position is None else z.index_select(0, self.position)

    def check(self) -> "CSRGraph":
        """Runs :func:`dignn_kernels.ops.check_graph` on the CSR once (a graph assembled by
        hand), and checks what the layer takes from the other fields: ``value`` one float per
        edge, ``degree`` its row sums, ``symmetric`` true only of a symmetric graph (the
        kernels then read W^T from W's CSR: a directed graph marked symmetric would get wrong
        gradients), ``order`` and ``position`` inverse permutations. Graphs from
        :func:`build_graph` are valid by construction and skip it."""
        if not self._checked:
            checks.check_graph(self.rowptr, self.col, self.num_nodes)
            self._check_fields()
            self._checked = True
        return self

    def _check_fields(self) -> None:
        n, m, device = self.num_nodes, self.num_edges, self.device
        for name, t, size in (("value", self.value, m), ("degree", self.degree, n)):
            if not (isinstance(t, Tensor) and t.dim() == 1 and t.numel() == size
                    and t.is_floating_point() and t.device == device):
                got = (f"{t.dtype} of shape {list(t.shape)} on {t.device}"
                       if isinstance(t, Tensor) else type(t).__name__)
                raise ValueError(f"CSRGraph.{name} must be a floating tensor of shape [{size}] "
                                 f"on {device}, got {got}")
        if not isinstance(self.symmetric, bool):
            raise TypeError(f"CSRGraph.symmetric must be True or False, got "
                            f"{self.symmetric!r}")
        if self.flow not in checks.FLOWS:
            raise ValueError(f"CSRGraph.flow must be {checks.FLOWS[0]!r} or "
                             f"{checks.FLOWS[1]!r}, got {self.flow!r}")
        rows, cols = self.rows(), self.col.long()
        wide = _accumulation_dtype(self.degree.dtype)  # 16-bit sums saturate (a 600-edge hub)
        row_sums = torch.zeros(n, dtype=wide, device=device).index_add_(0, rows,
                                                                       self.value.to(wide))
        scale = float(row_sums.abs().max()) if n else 0.0
        if n and not torch.allclose(self.degree.to(wide), row_sums, rtol=1e-4,
                                    atol=1e-6 * scale):
            i = int((self.degree - row_sums).abs().argmax())
            raise ValueError(f"CSRGraph.degree must hold the row sums of value (D_i = sum_j "
                             f"a_ij), but degree[{i}] = {float(self.degree[i]):g} and row {i} "
                             f"sums to {float(row_sums[i]):g}: build the graph with "
                             f"dignn_kernels.build_graph")
        if self.symmetric and not _is_symmetric(*_coalesce(rows, cols, self.value, n), n):
            raise ValueError("CSRGraph.symmetric is True but the graph is not symmetric (some "
                             "a_ij != a_ji): pass symmetric=False, so that the kernels use its "
                             "transposed CSR, or build the graph with dignn_kernels.build_graph")
        if (self.order is None) != (self.position is None):
            raise ValueError("CSRGraph.order and CSRGraph.position go together: pass both "
                             "(inverse permutations of the nodes) or neither")
        if self.order is not None:
            for name, t in (("order", self.order), ("position", self.position)):
                if not (isinstance(t, Tensor) and list(t.shape) == [n] and t.dtype == torch.int64
                        and t.device == device):
                    raise ValueError(f"CSRGraph.{name} must be an int64 tensor of shape [{n}] "
                                     f"on {device}")
            in_range = all(bool(((t >= 0) & (t < n)).all()) for t in (self.order,
                                                                       self.position))
            if n and not (in_range and torch.equal(self.position[self.order],
                                                   torch.arange(n, device=device))):
                raise ValueError("CSRGraph.order and CSRGraph.position must be inverse "
                                 "permutations of 0..num_nodes-1 (position[order[k]] == k)")

    @_outside_inference
    def transposed(self) -> Optional[Tuple[Tensor, Tensor, Tensor]]:
        """(t_rowptr, t_col, t_perm) for graphs that are not symmetric, else None: on a
        symmetric graph the kernels read W^T from the CSR of W itself."""
        if self.symmetric:
            return None
        if self._transposed is None:
            self._transposed = transpose_csr(self.rowptr, self.col, self.num_nodes)
        return self._transposed

    @_outside_inference
    def values(self, dtype: torch.dtype) -> Tuple[Tensor, Tensor]:
        """(a, D) in ``dtype`` (a floating dtype), converted once."""
        _check_float_dtype(dtype)
        key = ("a", dtype)
        if key not in self._by_dtype:
            self._by_dtype[key] = (self.value.to(dtype), self.degree.to(dtype))
        return self._by_dtype[key]

    @_outside_inference
    def rows(self) -> Tensor:
        """The row index of every CSR entry."""
        if "rows" not in self._by_dtype:
            self._by_dtype["rows"] = csr_rows(self.rowptr, self.num_edges)
        return self._by_dtype["rows"]

    @_outside_inference
    def diagonal_index(self) -> Tensor:
        """int64 [n]: the CSR position of row i's self-loop (i, i), or -1 where there is none.
        The solvers read W_ii there: a self-loop weight sits both in kappa_i and in W, so it
        cancels from the diagonal of L = K - W (the Jacobi preconditioner needs it)."""
        if "diag" not in self._by_dtype:
            self._by_dtype["diag"] = diagonal_index(self.rowptr, self.col)
        return self._by_dtype["diag"]

    @_outside_inference
    def fixed_laplacian(self, laplacian: str, dtype: torch.dtype) -> Tuple[Tensor, Tensor,
                                                                         Tensor]:
        """(W, chi, kappa) of a canonical Laplacian (the paper's appendix), in the form
        Delta Z = (kappa Z - W Z) / chi used by the kernels:

        - ``rw``: W = a, chi = D, kappa = D          (Delta = I - D^-1 A)
        - ``unnormalized``: W = a, chi = 1, kappa = D  (Delta = D - A)
        - ``sym``: W = D^-1/2 A D^-1/2, chi = 1, kappa = 1 (0 for isolated nodes)
          (Delta = I - D^-1/2 A D^-1/2)
        """
        if laplacian not in LAPLACIANS[1:]:
            raise ValueError(f"laplacian must be one of {LAPLACIANS[1:]} (the fixed "
                             f"Laplacians), got {laplacian!r}")
        _check_float_dtype(dtype)
        key = (laplacian, dtype)
        if key in self._by_dtype:
            return self._by_dtype[key]
        a, deg = self.values(dtype)
        out = fixed_weights(laplacian, a, deg, self.rows(), self.col.long())
        self._by_dtype[key] = out
        return out


def fixed_weights(laplacian: str, a: Tensor, deg: Tensor, rows: Tensor, cols: Tensor
                  ) -> Tuple[Tensor, Tensor, Tensor]:
    """(W, chi, kappa) of a canonical Laplacian (see :meth:`CSRGraph.fixed_laplacian`) from
    the edge values ``a`` of the entries (``rows``, ``cols``) and the degrees ``deg`` of every
    node the entries touch."""
    ones = torch.ones_like(deg)
    if laplacian == "rw":
        return a, deg, deg
    if laplacian == "unnormalized":
        return a, ones, deg
    if laplacian == "sym":
        inv_sqrt = torch.where(deg > 0, deg.clamp_min(torch.finfo(deg.dtype).tiny).rsqrt(),
                               torch.zeros_like(deg))
        w = inv_sqrt[rows] * a * inv_sqrt[cols]
        return w, ones, (deg > 0).to(deg.dtype)
    raise ValueError(f"no fixed weights for laplacian={laplacian!r}")


def _accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype sums of ``dtype`` values accumulate in: float32 for the 16-bit (and
    narrower) floats, whose sums lose every addend below their last bit (in bfloat16
    256 + 1 = 256), else ``dtype``."""
    return torch.float32 if torch.finfo(dtype).bits < 32 else dtype


def _check_float_dtype(dtype) -> None:
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"dtype must be a floating torch.dtype (torch.float32, torch.float64), "
                        f"got {dtype!r}")


# ------------------------------------------------------------------------ building --

# The build keys each edge by row * num_nodes + col in int64 (_coalesce, _is_symmetric).
MAX_NODES = 3_037_000_499  # floor(sqrt(2**63 - 1))


def _check_num_nodes(num_nodes) -> int:
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, (numbers.Integral,
                                                                  torch.SymInt)):
        raise TypeError(f"num_nodes must be an int (the number of nodes, x.size(0)), got "
                        f"{type(num_nodes).__name__} {num_nodes!r}")
    if num_nodes < 0:
        raise ValueError(f"num_nodes must be >= 0, got {num_nodes}")
    if num_nodes > MAX_NODES:
        raise ValueError(f"num_nodes must be at most {MAX_NODES} (the CSR build keys edges by "
                         f"row * num_nodes + col in int64), got {num_nodes}")
    return num_nodes if isinstance(num_nodes, torch.SymInt) else int(num_nodes)


def _check_edge_index(edge_index: Tensor, num_nodes: int) -> None:
    if not isinstance(edge_index, Tensor):
        raise TypeError(f"edge_index must be a torch.Tensor of shape [2, num_edges], got "
                        f"{type(edge_index).__name__}")
    if edge_index.layout != torch.strided:  # (the sparse layouts are read before this)
        _sparse_parts(edge_index)  # a TypeError naming the layout and what to pass
    if edge_index.dim() != 2 or edge_index.size(0) != 2:
        raise ValueError(f"edge_index must have shape [2, num_edges], got "
                         f"{list(edge_index.shape)}; transpose it if it is [num_edges, 2]")
    if edge_index.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"edge_index must hold int64 (or int32) node indices, got "
                        f"{edge_index.dtype}; convert it with edge_index.long()")
    if edge_index.numel() == 0:
        return
    if edge_index.device.type == "meta":
        raise ValueError("edge_index is on the meta device, which holds no values: pass the "
                         "graph on a device that holds it (cpu, cuda)")
    lo, hi = int(edge_index.min()), int(edge_index.max())
    if lo < 0 or hi >= num_nodes:
        bad = lo if lo < 0 else hi
        raise IndexError(f"edge_index holds node index {bad} but x has {num_nodes} nodes "
                         f"(valid indices are 0..{num_nodes - 1})")


def _check_sparse_indices(rows: Tensor, cols: Tensor, num_nodes: int) -> None:
    """The node indices of a sparse adjacency (torch does not check them unless asked)."""
    for name, index in (("row", rows), ("column", cols)):
        if index.numel() == 0:
            continue
        lo, hi = int(index.min()), int(index.max())
        if lo < 0 or hi >= num_nodes:
            raise IndexError(f"the sparse adjacency holds {name} index "
                             f"{lo if lo < 0 else hi} but x has {num_nodes} nodes (valid "
                             f"indices are 0..{num_nodes - 1})")


def _check_edge_weight(edge_weight: Optional[Tensor], num_edges: int,
                       device: torch.device, name: str = "edge_weight",
                       fix: str = "edge_weight.detach()") -> None:
    """The edge values: ``edge_weight``, or a sparse adjacency's values (``name`` says which
    and ``fix`` what to pass instead of values that require grad)."""
    if edge_weight is None:
        return
    if not isinstance(edge_weight, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or None, got "
                        f"{type(edge_weight).__name__}")
    if edge_weight.dim() != 1 or edge_weight.numel() != num_edges:
        raise ValueError(f"{name} must have shape [{num_edges}] (one weight per edge), "
                         f"got {list(edge_weight.shape)}")
    if not edge_weight.is_floating_point():
        raise TypeError(f"{name} must be a floating tensor, got {edge_weight.dtype}")
    if edge_weight.device != device:
        raise ValueError(f"{name} is on {edge_weight.device} but edge_index is on "
                         f"{device}; move both to the same device")
    if edge_weight.requires_grad:
        raise ValueError(f"{name} requires grad, but gradients with respect to edge "
                         f"weights are not supported; pass {fix}")
    if num_edges and not bool(torch.isfinite(edge_weight).all()):
        raise ValueError(f"{name} contains NaN or Inf")
    if num_edges and bool((edge_weight < 0).any()):
        raise ValueError(f"{name} must be >= 0 (the Laplacian needs non-negative edge "
                         f"values), got a minimum of {float(edge_weight.min())}")


def _coalesce(rows: Tensor, cols: Tensor, values: Tensor, n: int):
    key = rows * max(n, 1) + cols
    key, order = torch.sort(key, stable=True)
    values = values[order]
    if key.numel() > 1 and bool((key[1:] == key[:-1]).any()):
        key, inverse = torch.unique_consecutive(key, return_inverse=True)
        values = torch.zeros(key.numel(), dtype=values.dtype,
                             device=values.device).index_add_(0, inverse, values)
    return key // max(n, 1), key % max(n, 1), values


def _is_symmetric(rows: Tensor, cols: Tensor, values: Tensor, n: int) -> bool:
    if rows.numel() == 0:
        return True
    key = rows * n + cols
    t_key, order = torch.sort(cols * n + rows)
    if not torch.equal(key, t_key):
        return False
    tv = values[order]
    return bool(torch.allclose(values, tv, rtol=1e-6, atol=0.0))


def _from_coo(rows: Tensor, cols: Tensor, values: Tensor, n: int,
              reorder: str = "none") -> CSRGraph:
    # 16-bit weights are summed (parallel edges here, degrees below) and kept in float32
    values = values.to(_accumulation_dtype(values.dtype))
    rows, cols, values = _coalesce(rows.long(), cols.long(), values, n)
    if reorder != "none":
        order, method = node_order(rowptr_from_sorted_rows(rows, n), cols, n, reorder)
        if order is not None:
            position = inverse_order(order)
            graph = _from_coo(position[rows], position[cols], values, n)
            graph.order, graph.position, graph.reorder = order, position, method
            return graph
    index_dtype = torch.int32 if n < 2**31 - 1 else torch.int64
    rowptr = rowptr_from_sorted_rows(rows, n)
    degree = torch.zeros(n, dtype=values.dtype, device=values.device).index_add_(0, rows,
                                                                                values)
    return CSRGraph(num_nodes=n, rowptr=rowptr, col=cols.to(index_dtype), value=values,
                    degree=degree, symmetric=_is_symmetric(rows, cols, values, n),
                    _checked=True)


@_outside_inference
def build_graph(edge: Union[Tensor, "object"], num_nodes: int,
                edge_weight: Optional[Tensor] = None, reorder: Optional[str] = None,
                flow: str = "source_to_target") -> CSRGraph:
    """Validates and converts ``edge_index`` (+ ``edge_weight``), a torch sparse tensor or a
    torch_sparse ``SparseTensor`` into a :class:`CSRGraph`, its nodes renumbered by
    ``reorder`` (one of :data:`dignn_kernels.reorder.REORDERINGS`; None keeps the ids).

    Args:
        edge: int64 (or int32) Tensor [2, num_edges] read as PyG reads it for ``flow``
            (by default messages flow from ``edge[0]`` to ``edge[1]``: row i of the CSR
            aggregates over the edges (j, i)); or a torch sparse tensor of any layout (COO,
            CSR, CSC, BSR, BSC; the zeros inside a BSR/BSC block are not edges) or a
            torch_sparse ``SparseTensor``, of shape [num_nodes, num_nodes], read as PyG's
            ``adj_t`` (row i is the target), its values the edge weights.
        num_nodes: int >= 0, the number of nodes (x.size(0)).
        edge_weight: optional float Tensor [num_edges] of a_ij >= 0, finite, not requiring
            grad (default: 1 per edge, float32); parallel edges are summed, 16-bit weights in
            float32 (the graph's values and degrees are then float32).
        reorder: None or ``"none"`` (keep the ids), ``"rcm"``, ``"degree"``, ``"community"``
            or ``"auto"``.
        flow: PyG's ``MessagePassing(flow=...)``: ``"source_to_target"`` (default; row i
            aggregates at ``edge[1]``) or ``"target_to_source"`` (row i aggregates over the
            edges ``(i, j)``, at ``edge[0]``: the authors' DIGNN code; the same graph as
            ``edge.flip(0)`` with the default). Not ``"target_to_source"`` with a sparse
            tensor, which is already ``adj_t``: pass its transpose instead, as PyG asks.

    Returns:
        CSRGraph: the coalesced graph, checked (its O(edges) check is never run again). Its
        tensors are its own (never views of ``edge`` or ``edge_weight``), and normal tensors
        even when built under ``torch.inference_mode``.

    Raises:
        TypeError: ``edge`` not a tensor, not of an integer dtype, of a layout that holds no
            graph (mkldnn), ``num_nodes`` not an int, ``edge_weight`` not a floating tensor.
        ValueError: ``edge`` not of shape [2, num_edges]; ``edge_weight`` of the wrong
            length or device, negative, NaN/Inf or requiring grad; a sparse adjacency not
            [num_nodes, num_nodes] (batched, or with dense dimensions: not one scalar per
            edge), with malformed compressed indices, given with an ``edge_weight`` or with
            ``flow="target_to_source"``; an unknown ``reorder`` or ``flow``.
        IndexError: a node index outside 0..num_nodes-1.

    Example:
        >>> import torch
        >>> from dignn_kernels import build_graph
        >>> edge_index = torch.tensor([[0, 0, 1], [1, 1, 2]])  # 0 -> 1 twice, 1 -> 2
        >>> g = build_graph(edge_index, 3, torch.tensor([1.0, 2.0, 0.5]))
        >>> g.rowptr, g.col, g.value  # row 1 aggregates from 0 (1 + 2), row 2 from 1
        (tensor([0, 0, 1, 2]), tensor([0, 1], dtype=torch.int32), tensor([3.0000, 0.5000]))
        >>> g.symmetric
        False
        >>> t = build_graph(edge_index, 3, flow="target_to_source")  # rows at edge_index[0]
        >>> t.rowptr, t.col, t.flow  # row 0 aggregates from 1 (twice), row 1 from 2
        (tensor([0, 1, 2, 2]), tensor([1, 2], dtype=torch.int32), 'target_to_source')
        >>> adj_t = torch.sparse_coo_tensor(edge_index.flip(0), torch.ones(3), (3, 3),
        ...                                 check_invariants=True)
        >>> g.rowptr.equal(build_graph(adj_t.to_sparse_csc(), 3).rowptr)  # adj_t: row = target
        True
    """
    reorder = check_reorder(reorder)
    flow = checks.check_flow(flow)
    num_nodes = _check_num_nodes(num_nodes)
    if _is_sparse_tensor(edge):
        if flow != "source_to_target":
            # PyG refuses the same: a sparse adjacency is adj_t, its rows are the targets
            raise ValueError("flow='target_to_source' is invalid for a torch sparse tensor or "
                             "torch_sparse SparseTensor graph, which is read as PyG's adj_t "
                             "(row i is the node that aggregates): pass in the transposed "
                             "sparse tensor instead (adj_t.t()) with "
                             "flow='source_to_target'")
        if edge_weight is not None:
            raise ValueError("edge_weight must be None when the graph is a sparse tensor: the "
                             "sparse tensor's values are the edge weights")
        rows, cols, values, size = _sparse_to_coo(edge)
        if size != (num_nodes, num_nodes):
            raise ValueError(f"the sparse adjacency has shape {list(size)} but x has "
                             f"{num_nodes} nodes; it must be [{num_nodes}, {num_nodes}]")
        _check_sparse_indices(rows, cols, num_nodes)
        _check_edge_weight(values, values.numel(), values.device,
                           "the sparse adjacency's values", "adj.detach()")
        return _from_coo(rows, cols, values, num_nodes, reorder)
    _check_edge_index(edge, num_nodes)
    _check_edge_weight(edge_weight, edge.size(1), edge.device)
    values = edge_weight if edge_weight is not None else torch.ones(
        edge.size(1), dtype=torch.float32, device=edge.device)
    # The row of an edge is the node that aggregates: edge_index[1] for PyG's source_to_target,
    # edge_index[0] for target_to_source (the authors' scatter_add(..., row)).
    rows, cols = (edge[1], edge[0]) if flow == "source_to_target" else (edge[0], edge[1])
    graph = _from_coo(rows, cols, values, num_nodes, reorder)
    graph.flow = flow
    return graph


def _is_sparse_tensor(edge) -> bool:
    """A torch sparse tensor (:data:`SPARSE_LAYOUTS`) or a torch_sparse ``SparseTensor``."""
    if isinstance(edge, Tensor):
        return edge.layout in SPARSE_LAYOUTS
    return type(edge).__name__ == "SparseTensor" and hasattr(edge, "csr")


def _sparse_parts(edge) -> List[Tuple[str, Tensor]]:
    """The named tensors that hold the entries of a sparse adjacency: what the build reads and
    the cache fingerprints. A COO tensor's raw indices and values (not ``coalesce()``, which
    would sum parallel entries in the values' dtype: the build sums them, in float32 for
    16-bit values); a compressed layout's pointers, indices and values; a torch_sparse
    ``SparseTensor``'s row, col and (optional) value, as its ``coo()`` returns them."""
    if not isinstance(edge, Tensor):  # torch_sparse.SparseTensor
        row, col, value = edge.coo()
        return [("row", row), ("col", col)] + ([("value", value)] if value is not None else [])
    layout = edge.layout
    if layout == torch.sparse_coo:
        return [("indices", edge._indices()), ("values", edge._values())]
    if layout in (torch.sparse_csr, torch.sparse_bsr):
        return [("crow_indices", edge.crow_indices()), ("col_indices", edge.col_indices()),
                ("values", edge.values())]
    if layout in (torch.sparse_csc, torch.sparse_bsc):
        return [("ccol_indices", edge.ccol_indices()), ("row_indices", edge.row_indices()),
                ("values", edge.values())]
    raise TypeError(f"the graph is a tensor of layout {layout}, which holds no graph: pass "
                    f"edge_index (an int64 Tensor [2, num_edges]) or a sparse adjacency of one "
                    f"of the layouts {', '.join(str(x) for x in SPARSE_LAYOUTS)}")


def _expanded_pointers(pointers: Tensor, name: str, count: int, entries: int) -> Tensor:
    """The index along the compressed dimension of each of ``entries`` entries, after checking
    ``pointers`` (``name``: count + 1 non-decreasing offsets from 0 to entries), which torch
    does not check unless asked: a malformed one would give other entries, or a cryptic
    error."""
    if pointers.dim() != 1 or pointers.numel() != count + 1:
        raise ValueError(f"the sparse adjacency's {name} must hold {count + 1} offsets, got "
                         f"shape {list(pointers.shape)}")
    if int(pointers[0]) != 0 or int(pointers[-1]) != entries or \
            bool((pointers[1:] < pointers[:-1]).any()):
        raise ValueError(f"the sparse adjacency's {name} must be non-decreasing offsets from 0 "
                         f"to its {entries} entries: build the tensor with "
                         f"check_invariants=True to find the bad one")
    return csr_rows(pointers.long(), entries)


def _sparse_to_coo(edge):
    """(rows, cols, values, size) of a sparse adjacency, its rows the targets (PyG's
    ``adj_t``)."""
    if isinstance(edge, Tensor):
        layout = edge.layout
        parts = dict(_sparse_parts(edge))  # (a TypeError for a layout that holds no graph)
        if edge.dense_dim() != 0:
            raise ValueError(f"the sparse adjacency ({layout}) must hold one scalar per edge, "
                             f"but it has {edge.dense_dim()} dense dimension(s) (shape "
                             f"{list(edge.shape)}): pass one weight per edge")
        if edge.dim() != 2:
            raise ValueError(f"the sparse adjacency ({layout}) must be 2-D [num_nodes, "
                             f"num_nodes], got shape {list(edge.shape)}: pass one graph (a "
                             f"batch of graphs is one block-diagonal adjacency, as PyG's "
                             f"Batch makes it)")
        size = tuple(edge.shape)
        values = parts.pop("values")
        by_row = layout in (torch.sparse_csr, torch.sparse_bsr)  # else by column (CSC, BSC)
        if layout == torch.sparse_coo:
            rows, cols = parts["indices"]
        elif layout in (torch.sparse_csr, torch.sparse_csc):
            (pointer_name, pointers), (_, index) = parts.items()
            compressed = _expanded_pointers(pointers, pointer_name, size[0 if by_row else 1],
                                            index.numel())
            rows, cols = (compressed, index) if by_row else (index, compressed)
        else:  # BSR, BSC: values [blocks, R, C]; entry (b, r, c) at (R brow_b + r, C bcol_b + c)
            (pointer_name, pointers), (_, index) = parts.items()
            r, c = values.shape[1:]
            blocks = size[0] // r if by_row else size[1] // c
            compressed = _expanded_pointers(pointers, pointer_name, blocks, index.numel())
            brow, bcol = (compressed, index) if by_row else (index, compressed)
            rows = (brow.long().view(-1, 1, 1) * r +
                    torch.arange(r, device=values.device).view(1, -1, 1)).expand(values.shape)
            cols = (bcol.long().view(-1, 1, 1) * c +
                    torch.arange(c, device=values.device).view(1, 1, -1)).expand(values.shape)
            # a block stores its zeros too: they are the block's padding, not edges (the
            # adjacency is edge.to_dense(), whose zeros are no edges)
            keep = values != 0
            rows, cols, values = rows[keep], cols[keep], values[keep]
    else:  # torch_sparse.SparseTensor
        parts = _sparse_parts(edge)
        rows, cols = parts[0][1], parts[1][1]
        values = parts[2][1] if len(parts) > 2 else None
        size = tuple(edge.sizes())
        if values is None:
            values = torch.ones(rows.numel(), dtype=torch.float32, device=rows.device)
    if values.dim() != 1:
        raise ValueError("the sparse adjacency must hold one scalar per edge")
    if not values.is_floating_point():
        values = values.float()
    return rows, cols, values.detach() if not values.requires_grad else values, size


# ------------------------------------------------------------------------- caching --
#
# The cache is keyed by what the graph is made of, read on every call: the kind and shape of
# the graph, and per tensor that holds it (edge_index, edge_weight, a sparse tensor's indices
# and values, a SparseTensor's row, col and value) its name, dtype, shape, device,
# requires_grad and a fingerprint of its contents. A tensor's identity and version counter
# cannot stand for its contents: writes through ``.data``, numpy, DLPack, ``set_()`` aliases or
# a shared storage bump no counter, a freed tensor's id and address come back with other
# contents, and inference tensors have no counter at all. Keyed by contents, a changed graph
# is a new key, and an unchanged one hits even when it is a new tensor (a copy, a reload).

# The multiply-xorshift mix of the device fingerprint (splitmix64's finalizer, a bijection of
# the 64-bit words), its constants as the int64 values of their bits.
_GOLDEN = 0x9E3779B97F4A7C15 - 2**64
_MIX1 = 0xBF58476D1CE4E5B9 - 2**64
_MIX2 = 0x94D049BB133111EB - 2**64
_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_UNSIGNED_OF_SIZE = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _elements(t: Tensor) -> Tensor:
    """The elements of ``t`` in C order as integers of their width (their bits), flat and
    contiguous: a view of a contiguous tensor, a copy of another. Not a subclass (PyG's
    EdgeIndex), not tracked by autograd."""
    t = t.detach()
    if type(t) is not Tensor:
        t = t.as_subclass(Tensor)
    return t.resolve_neg().contiguous().reshape(-1).view(_INT_OF_SIZE[t.element_size()])


def _logical_shift(z: Tensor, bits: int) -> Tensor:
    """z >> bits on the 64 bits of z as unsigned (torch shifts int64 arithmetically)."""
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def _host_fingerprint(t: Tensor) -> Tuple[int, int]:
    """(XXH3-64 of the bytes, the wrapping 64-bit sum of the elements as unsigned integers) of
    a CPU tensor: both stream the memory once, with no copy of a contiguous tensor."""
    words = _elements(t).numpy().view(_UNSIGNED_OF_SIZE[t.element_size()])
    return xxhash.xxh3_64_intdigest(words), int(words.sum(dtype=np.uint64))


def _device_fingerprint(t: Tensor) -> Tensor:
    """int64 [2] on t's device, with torch ops only (no host read): the wrapping sum over the
    elements w_k of mix(w_k ^ k * GOLDEN), mix a bijection of the 64-bit words
    (splitmix64's finalizer), and the wrapping sum of the w_k."""
    w = _elements(t).to(torch.int64)
    z = w ^ (torch.arange(w.numel(), device=w.device) * _GOLDEN)
    z = (z ^ _logical_shift(z, 30)) * _MIX1
    z = (z ^ _logical_shift(z, 27)) * _MIX2
    z = z ^ _logical_shift(z, 31)
    return torch.stack([z.sum(), w.sum()])


def _on_host(t: Tensor) -> bool:
    """Whether ``t``'s fingerprint is read on the host (CPU memory) or made on its device."""
    return t.device.type == "cpu"


def _fingerprints(tensors: List[Tensor]) -> List[Tuple[int, int]]:
    """A 128-bit fingerprint of each tensor's contents: on the CPU :func:`_host_fingerprint`,
    on another device :func:`_device_fingerprint`, read back in one host sync per device.
    Read with torch.func's transforms switched off: under ``jvp``/``grad``/``vmap`` a graph
    tensor is wrapped (even detached) and holds no storage of its own to read."""
    with torch._C._DisableFuncTorch():
        return _unwrapped_fingerprints(tensors)


def _unwrapped_fingerprints(tensors: List[Tensor]) -> List[Tuple[int, int]]:
    out: List = [None] * len(tensors)
    on_device: Dict[torch.device, List[int]] = {}
    for i, t in enumerate(tensors):
        if _on_host(t):
            out[i] = _host_fingerprint(t)
        else:
            on_device.setdefault(t.device, []).append(i)
    for where in on_device.values():
        lanes = torch.stack([_device_fingerprint(tensors[i]) for i in where]).tolist()
        for i, pair in zip(where, lanes):
            out[i] = tuple(pair)
    return out


def content_key(*tensors: Tensor) -> tuple:
    """A hashable key of the contents of dense or sparse tensors: each one's layout, dtype,
    shape and device, and the fingerprint :func:`cached_graph` takes of every tensor that
    holds its entries (one host sync per call on a GPU). Two calls give equal keys when the
    tensors hold the same values, whatever wrote them; a change of any single entry always
    changes the key. For caches of what is computed from a graph and its features.

    Args:
        *tensors: dense (strided) or sparse (COO, CSR, CSC, BSR, BSC) tensors.

    Returns:
        tuple: the key.

    Raises:
        TypeError: a tensor of another layout, or not a tensor.

    Example:
        >>> import torch
        >>> from dignn_kernels.graph import content_key
        >>> x = torch.eye(3)
        >>> content_key(x) == content_key(x.clone()), content_key(x) == content_key(2 * x)
        (True, False)
    """
    key, parts = [], []
    for t in tensors:
        if not isinstance(t, Tensor):
            raise TypeError(f"content_key takes tensors, got {type(t).__name__}")
        mine = [t] if t.layout == torch.strided else [p for _, p in _sparse_parts(t)]
        key.append((str(t.layout), t.dtype, tuple(t.shape), t.device, len(mine)))
        parts += mine
    return tuple(key) + tuple(_fingerprints(parts))


def _graph_parts(edge, edge_weight) -> Optional[List[Tuple[str, Tensor]]]:
    """The named tensors the graph is built from, or None when ``edge`` or ``edge_weight`` is
    not a graph the build takes (the build then names what is wrong)."""
    if isinstance(edge, Tensor) and edge.layout == torch.strided:
        parts = [("edge_index", edge)]
    elif _is_sparse_tensor(edge):
        parts = _sparse_parts(edge)
    else:
        return None
    if edge_weight is not None:
        if not isinstance(edge_weight, Tensor):
            return None
        parts.append(("edge_weight", edge_weight))
    if not all(t.layout == torch.strided and t.device.type != "meta" and not t.is_complex()
               and not t.is_quantized and t.element_size() in _INT_OF_SIZE for _, t in parts):
        return None
    return parts


def _graph_kind(edge) -> tuple:
    if isinstance(edge, Tensor):
        return str(edge.layout), tuple(edge.shape)
    return "SparseTensor", tuple(edge.sizes())


class _Seen:
    """The graph last built or found for these tensor objects (the lookup while a CUDA graph is
    being captured, when contents cannot be read)."""
    __slots__ = ("refs", "versions", "graph")

    def __init__(self, refs, versions, graph):
        self.refs, self.versions, self.graph = refs, versions, graph


_CACHE: "OrderedDict[tuple, CSRGraph]" = OrderedDict()
_SEEN: "OrderedDict[tuple, _Seen]" = OrderedDict()
_CACHE_SIZE = 16


def clear_graph_cache() -> None:
    """Forgets every preprocessed graph that :func:`cached_graph` keeps (the graphs stay
    valid; the next call for them builds them again).

    Example:
        >>> import torch
        >>> from dignn_kernels import cached_graph, clear_graph_cache
        >>> edge_index = torch.tensor([[0, 1], [1, 0]])
        >>> g = cached_graph(edge_index, 2)
        >>> clear_graph_cache()
        >>> cached_graph(edge_index, 2) is g
        False
    """
    _CACHE.clear()
    _SEEN.clear()


def _objects(edge, edge_weight) -> list:
    return [o for o in (edge, edge_weight) if o is not None]


def _version(o) -> Optional[int]:
    """The version counter of a strided, non-inference tensor (inference tensors have none)."""
    if isinstance(o, Tensor) and o.layout == torch.strided and not o.is_inference():
        return o._version
    return None


def _identity(edge, edge_weight, parts, settings) -> tuple:
    return (tuple(id(o) for o in _objects(edge, edge_weight)),
            tuple((t.data_ptr(), tuple(t.shape), t.stride(), t.dtype) for _, t in parts),
            settings)


def _remember(edge, edge_weight, parts, settings, graph: CSRGraph) -> None:
    """Records the graph of these objects for the lookup under CUDA graph capture."""
    objects = _objects(edge, edge_weight)
    try:
        refs = [weakref.ref(o) for o in objects]
    except TypeError:  # not weak-referenceable: never found under capture
        return
    key = _identity(edge, edge_weight, parts, settings)
    _SEEN[key] = _Seen(refs, [_version(o) for o in objects], graph)
    _SEEN.move_to_end(key)
    if len(_SEEN) > _CACHE_SIZE:
        _SEEN.popitem(last=False)


def _seen_while_capturing(edge, edge_weight, parts, settings) -> CSRGraph:
    """The graph last seen for the same objects, at the same addresses and versions, while a
    CUDA graph is being captured: no host read is allowed there, so neither a fingerprint nor
    a build; a replay reads the captured memory, whatever the tensors hold later."""
    seen = _SEEN.get(_identity(edge, edge_weight, parts, settings))
    objects = _objects(edge, edge_weight)
    if seen is not None and all(r() is o for r, o in zip(seen.refs, objects)) and \
            seen.versions == [_version(o) for o in objects]:
        return seen.graph
    raise RuntimeError("the graph cannot be built or checked while a CUDA graph is being "
                       "captured (that reads values on the host): run a forward on this graph "
                       "before the capture (the warm-up a capture needs), or pass a prebuilt "
                       "graph, dignn_kernels.build_graph(edge_index, num_nodes, edge_weight)")


@torch.compiler.disable
def cached_graph(edge, num_nodes: int, edge_weight: Optional[Tensor] = None,
                 reorder: Optional[str] = None, flow: str = "source_to_target") -> CSRGraph:
    """:func:`build_graph`, remembered for graphs of the same contents (with the same
    ``num_nodes``, ``reorder`` and ``flow``: a graph built for one flow is never returned
    for the other): what the layer calls on every forward. The last 16 graphs are kept.

    Never stale: every call reads the contents of every tensor the graph is made of
    (``edge_index``, ``edge_weight``, a sparse tensor's indices and values, a
    ``SparseTensor``'s row, col and value) into a 128-bit fingerprint, part of the cache key
    with each tensor's dtype, shape and device, so a call on changed graph data gets the
    changed graph's answer whatever wrote it (in-place ops, ``.data``, numpy or DLPack
    aliases, ``set_()``, a view's base, another tensor at a freed one's address), and an
    unchanged graph hits even as a new tensor (a copy, a reload). On the CPU the fingerprint
    is XXH3-64 of the bytes and the wrapping 64-bit sum of the elements (two passes over the
    memory at its speed, no copy; ``bench/layer/graph_cache_check.py`` measures its share of a
    training step); on a GPU the wrapping sums of a multiply-xorshift mix of each
    element with its position and of the elements, torch ops read back in one host sync per
    call. What it guarantees: a change of any single entry always changes the fingerprint
    (the element sum changes by the entry's difference, which is not 0 mod 2^64; on a GPU
    the mixed sum too, the mix being a bijection); other changes go unnoticed with a
    probability of about 2^-64 (a fingerprint, not a cryptographic hash: inputs made to
    collide can collide).

    Two paths skip the check by design. While a CUDA graph is being captured no host read
    is allowed: the graph last seen for the same tensor objects (alive, at the same
    addresses and versions) is returned unchecked, as a replay reads the captured memory
    anyway; a graph never seen before is an error there. A prebuilt :class:`CSRGraph`
    (:func:`build_graph`) passed to the layer is a snapshot that owns its tensors: no check
    and no sync per call (what ``torch.compile(fullgraph=True)`` and sync-free GPU steps
    take), and later writes to ``edge_index`` do not change it.

    Args:
        edge: as for :func:`build_graph`.
        num_nodes: int, the number of nodes.
        edge_weight: optional float Tensor [num_edges], as for :func:`build_graph`.
        reorder: as for :func:`build_graph`.
        flow: as for :func:`build_graph`; part of the cache key.

    Returns:
        CSRGraph: the cached graph, or a new one (then cached).

    Raises:
        TypeError, ValueError, IndexError: as :func:`build_graph`.
        RuntimeError: a graph not seen before, or changed, while a CUDA graph is being
            captured.

    Example:
        >>> import torch
        >>> from dignn_kernels import cached_graph
        >>> edge_index = torch.tensor([[0, 1], [1, 0]])
        >>> g = cached_graph(edge_index, 2)
        >>> cached_graph(edge_index, 2) is g, cached_graph(edge_index.clone(), 2) is g
        (True, True)
        >>> edge_index.numpy()[0, 0] = 1  # a write no version counter sees
        >>> h = cached_graph(edge_index, 2)
        >>> h is g, h.col, g.col  # the new graph; g, a snapshot, is unchanged
        (False, tensor([1, 1], dtype=torch.int32), tensor([1, 0], dtype=torch.int32))
        >>> t = cached_graph(edge_index, 2, flow="target_to_source")  # one entry per flow
        >>> t is h, t.flow
        (False, 'target_to_source')
    """
    reorder = check_reorder(reorder)
    flow = checks.check_flow(flow)
    num_nodes = _check_num_nodes(num_nodes)  # before the lookup: 2.0 must not find 2's graph
    parts = _graph_parts(edge, edge_weight)
    if parts is None:
        return build_graph(edge, num_nodes, edge_weight, reorder, flow)
    settings = (num_nodes, reorder, flow)
    if not host_reads_allowed(parts[0][1]):
        return _seen_while_capturing(edge, edge_weight, parts, settings)
    names = [name for name, _ in parts]
    tensors = [t for _, t in parts]
    key = (_graph_kind(edge), settings) + tuple(
        (name, t.dtype, tuple(t.shape), t.device, t.requires_grad, fingerprint)
        for name, t, fingerprint in zip(names, tensors, _fingerprints(tensors)))
    graph = _CACHE.get(key)
    if graph is None:
        graph = build_graph(edge, num_nodes, edge_weight, reorder, flow)
        _CACHE[key] = graph
        if len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    else:
        _CACHE.move_to_end(key)
    _remember(edge, edge_weight, parts, settings, graph)
    return graph
