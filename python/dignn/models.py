"""DIGNN models (paper section 5, eq. model-in / diff / model-out, and appendix "Model
architectures") on :class:`dignn_kernels.FusedImplicitDiffusion`.

Node classification::

    X~ = h_in(A, X)                       input unit: "mlp", "adj" (A X) or "linkx"
    X~ = BatchNorm(Dropout(ReLU(Linear(X~))))   the batch norm before the implicit layer
    Z  = X~ - (1/mu) Delta Z              implicit diffusion (eq. diff), "neural" or "rw"
    y  = Linear(Dropout(BatchNorm(Z)))    linear classifier (eq. model-out)

Graph classification (batched PyG graphs)::

    X~ = BatchNorm(Dropout(ReLU(Linear(X))))    1-layer MLP
    Z  = X~ - (1/mu) Delta Z              on the block-diagonal batch graph
    g  = global_pool(MLP(Z), batch)       "add" (default), "mean" or "max"
    y  = Linear(MLP(g))                   classifier

Dropout follows every layer. The implicit layer's input ``X~`` is what the spectral check
(:mod:`dignn.spectral`) measures Delta on; :meth:`DIGNNNodeClassifier.diffusion_input` returns
it.

Across processes (:mod:`dignn.distributed`), a node classifier takes a :class:`NodeShard` in
place of ``edge_index`` and the owned rows of x: every layer then works on the owned rows, the
input unit's A X or A are the owned rows computed once from the whole graph, and each dropout
takes the owned rows of the mask the single-process model would draw for the whole graph.
"""
from __future__ import annotations

from dataclasses import dataclass
import weakref
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dignn_kernels import FusedImplicitDiffusion
from dignn_kernels.checks import check_flow
from dignn_kernels.graph import content_key

_STORAGE_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def _storage_dtype(value):
    """A storage_dtype given by name (the CLI's and TrainConfig's) as the torch dtype; a
    torch dtype or None as is (FusedImplicitDiffusion validates it)."""
    if isinstance(value, str):
        if value not in _STORAGE_DTYPES:
            raise ValueError(f"storage_dtype must be None, 'bfloat16' or 'float16', got "
                             f"{value!r}")
        return _STORAGE_DTYPES[value]
    return value

__all__ = ["INPUT_UNITS", "DIGNN_LAPLACIANS", "DIGNNNodeClassifier", "DIGNNGraphClassifier",
           "adjacency_matrix", "NodeShard"]

INPUT_UNITS = ("mlp", "adj", "linkx")
ADJ_NORMS = ("none", "rw", "sym")
DIGNN_LAPLACIANS = ("neural", "rw")


def adjacency_matrix(edge_index: Tensor, num_nodes: int, norm: str = "none",
                     dtype: torch.dtype = torch.float32,
                     flow: str = "source_to_target") -> Tensor:
    """The adjacency A as a coalesced sparse COO tensor, row i holding the sources j of the
    messages j -> i (PyG's flow; symmetric for the undirected graphs of the paper); with
    ``flow="target_to_source"`` row i holds the j of the edges (i, j), at ``edge_index[0]``
    (the authors' ``SparseTensor(row=edge_index[0], col=edge_index[1])``).
    Duplicate edges count once. ``norm``: ``"none"`` (binary A, the paper's), ``"rw"``
    (D^-1 A: neighbour means) or ``"sym"`` (D^-1/2 A D^-1/2); values of ``dtype``."""
    _check_choice("norm", norm, ADJ_NORMS)
    check_flow(flow)
    target, source = (edge_index[1], edge_index[0]) if flow == "source_to_target" else \
        (edge_index[0], edge_index[1])
    key = torch.unique(target.long() * num_nodes + source.long())
    rows, cols = key // num_nodes, key % num_nodes
    values = torch.ones(key.numel(), dtype=dtype, device=edge_index.device)
    if norm != "none":
        deg = torch.zeros(num_nodes, device=values.device).index_add_(0, rows, values)
        inv = deg.clamp_min(1.0).reciprocal()
        values = inv[rows] if norm == "rw" else (inv.sqrt()[rows] * inv.sqrt()[cols])
    return torch.sparse_coo_tensor(torch.stack([rows, cols]), values, (num_nodes, num_nodes),
                                   is_coalesced=True, check_invariants=False)


def _linear_any(layer: nn.Linear, x: Tensor) -> Tensor:
    """``layer(x)`` for a dense or sparse (CSR/COO) x."""
    if x.layout == torch.strided:
        return layer(x)
    out = torch.sparse.mm(x, layer.weight.t())
    return out + layer.bias if layer.bias is not None else out


@dataclass(eq=False)
class NodeShard:
    """One process's share of a graph whose nodes are split over processes
    (:mod:`dignn.distributed`), passed to :meth:`DIGNNNodeClassifier.forward` in place of
    ``edge_index`` together with the owned rows of x.

    ``graph``: the implicit layer's graph (a ``dignn_kernels.distributed.DistributedGraph``);
    ``index``: the global ids of the owned nodes, ascending (the rows of x here);
    ``num_nodes``: of the whole graph; ``graph_features``: the owned rows of A X (input unit
    ``adj``) or of A (``linkx``), None for ``mlp``; for a sparse x, ``x_entries``: the
    positions of the owned rows' entries among the whole x's coalesced entries, and
    ``x_nnz``: how many the whole x has."""

    graph: Any
    index: Tensor
    num_nodes: int
    graph_features: Optional[Tensor] = None
    x_entries: Optional[Tensor] = None
    x_nnz: int = 0


def _dropout_any(x: Tensor, p: float, training: bool,
                 shard: Optional[NodeShard] = None) -> Tensor:
    """Dropout of a dense or sparse COO tensor (a sparse one drops its stored values). With a
    ``shard``, ``x`` holds the owned rows (or, sparse, the owned rows' entries) of the whole
    graph's tensor: the mask is the one ``F.dropout`` draws for the whole tensor on the CPU
    (the same generator calls, so the generator stays in step with a single-process run), of
    which the owned rows are taken."""
    if not training or p == 0.0:
        return x
    sparse = x.layout != torch.strided
    if sparse:
        x = x.coalesce()
    values = x.values() if sparse else x
    if shard is None:
        dropped = F.dropout(values, p, True)
    else:
        shape = (shard.x_nnz,) if sparse else (shard.num_nodes,) + tuple(x.shape[1:])
        noise = values.new_empty(shape)
        if noise.numel() == 0:  # F.dropout draws nothing for an empty tensor
            return x
        noise.bernoulli_(1 - p).div_(1 - p)
        dropped = values * noise[shard.x_entries if sparse else shard.index]
    if not sparse:
        return dropped
    return torch.sparse_coo_tensor(x.indices(), dropped, x.shape, is_coalesced=True,
                                   check_invariants=False)


def _check_counts(minimum: int, **counts) -> None:
    """Each of ``counts`` an int >= ``minimum`` (not a bool), else a ValueError naming it."""
    for name, value in counts.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(f"{name} must be "
                             f"{'a positive integer' if minimum == 1 else 'an integer >= 0'}, "
                             f"got {value!r}")


def _implicit_layer(hidden: int, storage_dtype, **options) -> FusedImplicitDiffusion:
    """The models' implicit layer on ``hidden`` channels (``storage_dtype`` by name or dtype;
    ``options``: the layer's other arguments)."""
    return FusedImplicitDiffusion(hidden, storage_dtype=_storage_dtype(storage_dtype), **options)


def _check_choice(name, value, choices):
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")


def _check_dropout(dropout, name="dropout"):
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or \
            not 0.0 <= dropout < 1.0:
        raise ValueError(f"{name} must be a number in [0, 1), got {dropout!r}")


class LINKXInput(nn.Module):
    """LINKX's input unit (Lim et al. 2021): MLP(concat(MLP(A), MLP(X))) with the two
    branches also added to the output, h = ReLU(W [h_A; h_X] + h_A + h_X) followed by a
    linear layer. ``A`` is the n x n adjacency read as node features (transductive: the
    model is tied to ``num_nodes``)."""

    def __init__(self, num_nodes: int, in_channels: int, hidden: int, dropout: float,
                 input_dropout: float = 0.0):
        super().__init__()
        self.num_nodes = num_nodes
        self.input_dropout = input_dropout
        self.lin_a = nn.Linear(num_nodes, hidden)
        self.lin_x = nn.Linear(in_channels, hidden)
        self.lin_cat = nn.Linear(2 * hidden, hidden)
        self.lin_out = nn.Linear(hidden, hidden)
        self.dropout = dropout

    def forward(self, x: Tensor, adj: Tensor, shard: Optional[NodeShard] = None) -> Tensor:
        """``adj``: the rows of A of x's rows; ``shard``: see :class:`NodeShard`."""
        x = _dropout_any(x, self.input_dropout, self.training, shard)
        h_a = _linear_any(self.lin_a, adj)
        h_x = _linear_any(self.lin_x, x)
        h = F.relu(self.lin_cat(torch.cat([h_a, h_x], dim=1)) + h_a + h_x)
        h = _dropout_any(h, self.dropout, self.training, shard)
        return self.lin_out(h)


class DIGNNNodeClassifier(nn.Module):
    """DIGNN for (semi-supervised, transductive) node classification.

    Args:
        in_channels: node feature width.
        hidden: width of X~ and Z (the paper's "num hid").
        num_classes: output classes.
        input_unit: ``"mlp"`` (a linear layer on X), ``"adj"`` (on A X, the paper's input for
            Chameleon/Squirrel) or ``"linkx"`` (MLP(concat(MLP(A), MLP(X))), for facebook100).
        num_nodes: the graph's size; required by ``"linkx"`` (its A-branch has one weight
            row per node).
        input_dropout: dropout on the input unit's input (X, A X or the features of
            ``"linkx"``; default: ``dropout``). LINKX itself drops no input: 0 there.
        adj_norm: the A of the ``"adj"`` and ``"linkx"`` units: ``"none"`` (binary, as in
            the paper), ``"rw"`` (D^-1 A) or ``"sym"`` (D^-1/2 A D^-1/2).
        laplacian: ``"neural"`` (graph neural Laplacian, eq. 12-14) or ``"rw"``.
        mu, max_iter, tol: the implicit layer's mu (> lambda_max(Delta) for the fixed point
            to converge), iteration cap (sweeps) and relative tolerance
            ||Z_t - Z_{t-1}||_F <= tol ||Z_t||_F (the authors' ``threshold`` is absolute).
        dropout: dropout rate after each layer.
        metric_channels: width h of the neural Laplacian's projections (default ``hidden``).
        backend: the implicit layer's backend (see :class:`FusedImplicitDiffusion`).
        storage_dtype: None, ``"bfloat16"`` or ``"float16"`` (or the torch dtype): the
            implicit layer's iterates stored in 16 bits (see :class:`FusedImplicitDiffusion`).
        reorder: the implicit layer's node renumbering for locality (``"none"``, ``"auto"``,
            ``"rcm"``, ``"degree"``, ``"community"``; see :mod:`dignn_kernels.reorder`).
        solver: the implicit layer's solver: ``"auto"`` (default: the layer's per-graph
            rule, cg on undirected graphs and anderson on directed ones, both converging for
            every mu > 0), ``"fixed_point"`` (the paper's iteration), ``"cg"`` or
            ``"anderson"``.
        flow: how ``edge_index`` is read, as PyG's ``MessagePassing(flow=...)``:
            ``"source_to_target"`` (default: node ``edge_index[1]`` aggregates over
            ``edge_index[0]``) or ``"target_to_source"`` (node ``edge_index[0]`` aggregates,
            as in the authors' code), by the implicit layer and by the A of the ``"adj"`` and
            ``"linkx"`` input units alike (see :class:`FusedImplicitDiffusion`).
        cached: PyG's ``cached=True`` for transductive training on one graph that never
            changes: the implicit layer's graph and the input unit's A X or A are built at
            the first forward and reused, with no read of their contents, while the same
            ``x`` and ``edge_index`` objects come back (the layer's ``cached``). Default
            False: their contents are checked on every forward.

    ``forward(x, edge_index)`` returns logits [num_nodes, num_classes]. ``x`` may be a sparse
    CSR/COO tensor (one-hot features). A X (for ``"adj"``) and A (for ``"linkx"``) are built
    once per graph and cached. ``forward(x_owned, shard)`` with a :class:`NodeShard` returns
    the owned rows' logits on one process of a partitioned graph (:mod:`dignn.distributed`).
    ``edge_index`` is read as PyG reads it (node ``edge_index[1]`` aggregates over
    ``edge_index[0]``); the authors' code aggregates at ``edge_index[0]``: pass
    ``flow="target_to_source"`` (or, equivalently, ``edge_index.flip(0)``) to reproduce it on
    a directed graph.

    Raises:
        ValueError: a width not a positive integer, an unknown ``input_unit``, ``adj_norm``,
            ``laplacian``, ``flow``, a dropout outside [0, 1), ``"linkx"`` without
            ``num_nodes``, or an argument the implicit layer refuses (see
            :class:`~dignn_kernels.FusedImplicitDiffusion`).

    Example:
        >>> import torch
        >>> from dignn import DIGNNNodeClassifier
        >>> _ = torch.manual_seed(0)
        >>> model = DIGNNNodeClassifier(3, hidden=8, num_classes=2, laplacian="rw")
        >>> x = torch.randn(4, 3)
        >>> edge_index = torch.tensor([[0, 1, 1, 2, 2, 3], [1, 0, 2, 1, 3, 2]])  # a path
        >>> model(x, edge_index).shape
        torch.Size([4, 2])
        >>> model.diffusion.iterations <= 10
        True
    """

    #: How ``edge_index`` is read (the ``flow`` argument); the class default is what a model
    #: pickled before the argument existed reads back.
    flow: str = "source_to_target"
    _graph_held = None

    def __init__(self, in_channels: int, hidden: int, num_classes: int, *,
                 input_unit: str = "mlp", num_nodes: Optional[int] = None,
                 laplacian: str = "neural", mu: float = 2.2, max_iter: int = 10,
                 tol: float = 1e-6, dropout: float = 0.5,
                 metric_channels: Optional[int] = None, backend: str = "auto",
                 adj_norm: str = "none", solver: str = "auto",
                 input_dropout: Optional[float] = None, storage_dtype=None,
                 reorder: str = "none", flow: str = "source_to_target", cached: bool = False):
        super().__init__()
        _check_counts(1, in_channels=in_channels, hidden=hidden, num_classes=num_classes)
        _check_choice("input_unit", input_unit, INPUT_UNITS)
        _check_choice("adj_norm", adj_norm, ADJ_NORMS)
        self.adj_norm = adj_norm
        self.flow = check_flow(flow)
        _check_choice("laplacian", laplacian, DIGNN_LAPLACIANS)
        _check_dropout(dropout)
        if input_dropout is None:
            input_dropout = dropout
        _check_dropout(input_dropout, "input_dropout")
        self.input_dropout = input_dropout
        if input_unit == "linkx" and (not isinstance(num_nodes, int) or num_nodes < 1):
            raise ValueError("input_unit='linkx' needs num_nodes (the graph's node count): "
                             "its A-branch has one weight row per node")
        self.input_unit = input_unit
        self.num_nodes = num_nodes
        self.dropout = dropout
        if input_unit == "linkx":
            self.linkx = LINKXInput(num_nodes, in_channels, hidden, dropout, input_dropout)
            self.lin_in = nn.Linear(hidden, hidden)
        else:
            self.lin_in = nn.Linear(in_channels, hidden)
        self.norm_in = nn.BatchNorm1d(hidden)
        self.diffusion = _implicit_layer(
            hidden, storage_dtype, mu=mu, laplacian=laplacian, metric_channels=metric_channels,
            max_iter=max_iter, tol=tol, backend=backend, solver=solver, reorder=reorder,
            flow=flow, cached=cached)
        self.norm_out = nn.BatchNorm1d(hidden)
        self.classifier = nn.Linear(hidden, num_classes)
        self._graph_key = None
        self._graph_cache = None
        self._graph_held = None

    # -------------------------------------------------------------------- graph cache --
    def _graph_features(self, x: Tensor, edge_index: Tensor) -> Tensor:
        """A X (``adj``) or A (``linkx``), computed again only when the contents of x (for
        ``adj``) or edge_index change: keyed by their fingerprints, like the layer's graph
        cache (:func:`dignn_kernels.cached_graph`), so no write that bypasses a tensor's
        version counter (``.data``, numpy, ``set_()``) leaves it stale. With ``cached`` the
        same ``x`` and ``edge_index`` objects reuse it unread."""
        cached = self.diffusion.cached
        held = self._graph_held
        if cached and held is not None and held[0]() is x and held[1]() is edge_index and \
                self._graph_cache is not None:
            return self._graph_cache
        key = content_key(*((x, edge_index) if self.input_unit == "adj" else (edge_index,)))
        key += (x.size(0), x.device, self.lin_in.weight.dtype)
        if self._graph_key != key:
            dtype = self.lin_in.weight.dtype
            adj = adjacency_matrix(edge_index, x.size(0), self.adj_norm, dtype,
                                   self.flow).to(x.device)
            if self.input_unit == "adj":
                dense_x = x.to_dense() if x.layout != torch.strided else x
                feats = torch.sparse.mm(adj, dense_x.to(dtype))
            else:
                feats = adj
            self._graph_key = key
            self._graph_cache = feats
        if cached:
            try:
                self._graph_held = (weakref.ref(x), weakref.ref(edge_index))
            except TypeError:  # (an object without weak references is checked every call)
                self._graph_held = None
        return self._graph_cache

    def __getstate__(self):
        # the held references name objects that a copy or a pickle does not carry
        state = dict(super().__getstate__() if hasattr(super(), "__getstate__") else
                     self.__dict__)
        state["_graph_held"] = None
        return state

    def _check_inputs(self, x: Tensor, edge_index: Tensor) -> None:
        if not isinstance(x, Tensor) or x.dim() != 2:
            raise ValueError(f"x must be a 2-D tensor [num_nodes, in_channels], got "
                             f"{getattr(x, 'shape', type(x).__name__)}")
        if not isinstance(edge_index, Tensor) or edge_index.dim() != 2 or \
                edge_index.size(0) != 2:
            raise ValueError(f"edge_index must be a [2, num_edges] tensor, got "
                             f"{getattr(edge_index, 'shape', type(edge_index).__name__)}")
        if self.input_unit == "linkx" and x.size(0) != self.num_nodes:
            raise ValueError(f"this linkx model was built for num_nodes={self.num_nodes} but "
                             f"x has {x.size(0)} rows")

    # ----------------------------------------------------------------------- forward --
    def _input_graph(self, x: Tensor, edge_index) -> Tensor:
        """A X or A for the input unit: of the shard's owned rows, or of the whole graph."""
        if isinstance(edge_index, NodeShard):
            if edge_index.graph_features is None:
                raise ValueError(f"input_unit={self.input_unit!r} needs the shard's rows of "
                                 f"{'A X' if self.input_unit == 'adj' else 'A'}: build the "
                                 f"NodeShard with graph_features (dignn.distributed does)")
            return edge_index.graph_features
        return self._graph_features(x, edge_index)

    def diffusion_input(self, x: Tensor, edge_index) -> Tensor:
        """X~, the input of the implicit layer (after the batch norm)."""
        shard = edge_index if isinstance(edge_index, NodeShard) else None
        if shard is None:
            self._check_inputs(x, edge_index)
        x = x.to(self.lin_in.weight.dtype)  # a no-op when the features are of the model's
        if self.input_unit == "linkx":
            h = self.linkx(x, self._input_graph(x, edge_index), shard)
            h = _dropout_any(h, self.dropout, self.training, shard)
            h = self.lin_in(h)
        else:
            h = self._input_graph(x, edge_index) if self.input_unit == "adj" else x
            h = _linear_any(self.lin_in,
                            _dropout_any(h, self.input_dropout, self.training, shard))
        h = _dropout_any(F.relu(h), self.dropout, self.training, shard)
        return self.norm_in(h)

    def forward(self, x: Tensor, edge_index) -> Tensor:
        """Logits [num_nodes, num_classes] (the owned rows' with a :class:`NodeShard`).

        Args:
            x: float Tensor [num_nodes, in_channels], dense or sparse (CSR/COO).
            edge_index: int64 Tensor [2, num_edges] (read for ``flow``), or a :class:`NodeShard`
                (then x holds the owned rows).

        Returns:
            Tensor: the logits, in the model's dtype.

        Raises:
            ValueError: x not 2-D, edge_index not [2, num_edges], or a linkx model given a
                graph of another size.
        """
        shard = edge_index if isinstance(edge_index, NodeShard) else None
        h = self.diffusion_input(x, edge_index)
        z = self.diffusion(h, edge_index if shard is None else shard.graph)
        z = _dropout_any(self.norm_out(z), self.dropout, self.training, shard)
        return self.classifier(z)


class DIGNNGraphClassifier(nn.Module):
    """DIGNN for graph classification on PyG mini-batches (``Batch``: disjoint graphs, one
    block-diagonal edge_index, ``batch`` vector).

    Args:
        in_channels: node feature width.
        hidden: width of X~ and Z.
        num_classes: output classes.
        laplacian: ``"neural"`` (graph neural Laplacian, eq. 12-14) or ``"rw"``.
        mu, max_iter, tol: the implicit layer's mu, iteration cap (sweeps) and relative
            tolerance ||Z_t - Z_{t-1}||_F <= tol ||Z_t||_F.
        dropout: dropout rate after each layer (default 0).
        pooling: ``"add"`` (default), ``"mean"`` or ``"max"``.
        node_layers: Linear + ReLU layers on Z before pooling (>= 0, default 1).
        graph_layers: Linear + ReLU layers on the pooled vector before the linear classifier
            (>= 0, default 1); the authors' code uses 3 and 3.
        metric_channels, backend, solver, storage_dtype, reorder: as for
            :class:`DIGNNNodeClassifier`.
        flow: how the implicit layer reads ``edge_index``: ``"source_to_target"`` (PyG's
            default) or ``"target_to_source"`` (the authors' code; see
            :class:`~dignn_kernels.FusedImplicitDiffusion`).

    ``forward(x, edge_index, batch, num_graphs=None)`` returns logits [num_graphs,
    num_classes].

    Raises:
        ValueError: as for :class:`DIGNNNodeClassifier`, an unknown ``pooling``, or negative
            ``node_layers``/``graph_layers``.

    Example:
        >>> import torch
        >>> from dignn import DIGNNGraphClassifier
        >>> _ = torch.manual_seed(0)
        >>> model = DIGNNGraphClassifier(3, hidden=8, num_classes=2, laplacian="rw").eval()
        >>> x = torch.randn(5, 3)
        >>> edge_index = torch.tensor([[0, 1, 2, 3, 3, 4], [1, 0, 3, 2, 4, 3]])
        >>> batch = torch.tensor([0, 0, 1, 1, 1])  # graph 0: nodes 0-1, graph 1: nodes 2-4
        >>> model(x, edge_index, batch, num_graphs=2).shape
        torch.Size([2, 2])
    """

    POOLINGS = ("add", "mean", "max")

    def __init__(self, in_channels: int, hidden: int, num_classes: int, *,
                 laplacian: str = "neural", mu: float = 2.2, max_iter: int = 10,
                 tol: float = 1e-6, dropout: float = 0.0, pooling: str = "add",
                 node_layers: int = 1, graph_layers: int = 1,
                 metric_channels: Optional[int] = None, backend: str = "auto",
                 solver: str = "auto", storage_dtype=None, reorder: str = "none",
                 flow: str = "source_to_target"):
        super().__init__()
        _check_counts(1, in_channels=in_channels, hidden=hidden, num_classes=num_classes)
        _check_choice("laplacian", laplacian, DIGNN_LAPLACIANS)
        _check_choice("pooling", pooling, self.POOLINGS)
        _check_dropout(dropout)
        _check_counts(0, node_layers=node_layers, graph_layers=graph_layers)
        self.dropout = dropout
        self.pooling = pooling
        self.lin_in = nn.Linear(in_channels, hidden)
        self.norm_in = nn.BatchNorm1d(hidden)
        self.diffusion = _implicit_layer(
            hidden, storage_dtype, mu=mu, laplacian=laplacian, metric_channels=metric_channels,
            max_iter=max_iter, tol=tol, backend=backend, solver=solver, reorder=reorder,
            flow=flow)
        self.node_mlp = nn.ModuleList(nn.Linear(hidden, hidden) for _ in range(node_layers))
        self.graph_mlp = nn.ModuleList(nn.Linear(hidden, hidden) for _ in range(graph_layers))
        self.classifier = nn.Linear(hidden, num_classes)

    def diffusion_input(self, x: Tensor, edge_index: Tensor) -> Tensor:
        """X~, the input of the implicit layer (after the batch norm)."""
        h = F.dropout(F.relu(self.lin_in(x.to(self.lin_in.weight.dtype))), self.dropout,
                      self.training)
        return self.norm_in(h)

    def forward(self, x: Tensor, edge_index: Tensor, batch: Tensor,
                num_graphs: Optional[int] = None) -> Tensor:
        """Logits [num_graphs, num_classes] of a PyG mini-batch.

        Args:
            x: float Tensor [num_nodes, in_channels] of the batch's nodes.
            edge_index: int64 Tensor [2, num_edges], the block-diagonal batch graph.
            batch: int64 Tensor [num_nodes], each node's graph.
            num_graphs: the graphs in the batch (default: ``batch.max() + 1``).

        Returns:
            Tensor: the logits.

        Raises:
            ValueError: ``batch`` not one graph id per node.
        """
        from torch_geometric.nn import global_add_pool, global_max_pool, global_mean_pool
        if batch.dim() != 1 or batch.numel() != x.size(0):
            raise ValueError(f"batch must be a vector with one graph id per node "
                             f"({x.size(0)}), got shape {list(batch.shape)}")
        h = self.diffusion_input(x, edge_index)
        z = self.diffusion(h, edge_index)
        for lin in self.node_mlp:
            z = F.dropout(F.relu(lin(z)), self.dropout, self.training)
        pool = {"add": global_add_pool, "mean": global_mean_pool,
                "max": global_max_pool}[self.pooling]
        g = pool(z, batch, size=num_graphs)
        for lin in self.graph_mlp:
            g = F.dropout(F.relu(lin(g)), self.dropout, self.training)
        return self.classifier(g)
