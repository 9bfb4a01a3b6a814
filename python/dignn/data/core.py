"""The containers every loader returns (:class:`NodeDataset`, :class:`GraphDataset`,
:class:`InductiveDataset`, :class:`Split`) and the split and feature helpers they share."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import torch
from torch import Tensor

__all__ = ["Split", "NodeDataset", "GraphDataset", "InductiveDataset", "random_splits",
           "stratified_folds", "mask_splits", "edge_homophily", "row_normalize", "sparse_features"]


def _shape(t) -> str:
    """``[2708, 1433]`` (PyG's way of showing a tensor in a repr), with its layout when
    sparse and its device when not the CPU."""
    if not isinstance(t, Tensor):
        return type(t).__name__
    notes = [n for n in ("sparse" if t.layout != torch.strided else None,
                         str(t.device) if t.device.type != "cpu" else None) if n]
    return f"[{', '.join(map(str, t.shape))}]" + (f" ({', '.join(notes)})" if notes else "")


def _splits_repr(splits) -> str:
    """``10 x (train 1624, val 541, test 543)`` (the first split's sizes; "~" when they
    differ between splits)."""
    if not splits:
        return "0"
    sizes = [s.sizes() if isinstance(s, Split) else None for s in splits]
    if sizes[0] is None:
        return str(len(splits))
    same = all(z == sizes[0] for z in sizes)
    train, val, test = sizes[0]
    return f"{len(splits)} x ({'' if same else '~'}train {train}, val {val}, test {test})"


@dataclass
class Split:
    """Node (or graph) indices of one train/validation/test split."""

    train: Tensor
    val: Tensor
    test: Tensor

    def __repr__(self) -> str:
        return f"Split(train={_shape(self.train)}, val={_shape(self.val)}, " \
               f"test={_shape(self.test)})"

    def sizes(self) -> Tuple[int, int, int]:
        """(train, validation, test) counts."""
        return self.train.numel(), self.val.numel(), self.test.numel()

    def to(self, device, non_blocking: bool = False) -> "Split":
        """The split's indices on ``device``."""
        return Split(*(t.to(device, non_blocking=non_blocking)
                       for t in (self.train, self.val, self.test)))


@dataclass
class NodeDataset:
    """One graph for node classification. ``y`` is -1 on unlabeled nodes; ``x`` may be a
    sparse COO tensor (the one-hot facebook100 features).

    Args:
        name: the dataset's name in results.
        x: float Tensor [num_nodes, num_features], dense or sparse COO.
        y: int64 Tensor [num_nodes], the classes (-1: unlabeled).
        edge_index: int64 Tensor [2, num_edges] in PyG's convention (node
            ``edge_index[1]`` aggregates over ``edge_index[0]``).
        num_classes: the classifier's output width.
        splits: the :class:`Split` s (node indices) to train and evaluate on.
        description: one line for the logs.

    Example:
        >>> import torch
        >>> from dignn import NodeDataset
        >>> from dignn.data import Split
        >>> split = Split(torch.tensor([0, 1]), torch.tensor([2]), torch.tensor([3]))
        >>> data = NodeDataset("tiny", torch.eye(4), torch.tensor([0, 1, 0, 1]),
        ...                    torch.tensor([[0, 1, 2], [1, 2, 3]]), 2, [split])
        >>> data.num_nodes, data.num_features, data.device
        (4, 4, device(type='cpu'))
    """

    name: str
    x: Tensor
    y: Tensor
    edge_index: Tensor
    num_classes: int
    splits: List[Split]
    description: str = ""

    task = "node"

    def __repr__(self) -> str:
        """One line, as PyG shows a ``Data``: the tensors' shapes, not their values
        (``NodeDataset('csbm', x=[1500, 32], y=[1500], edge_index=[2, 15000], num_classes=4,
        splits=10 x (train 900, val 300, test 300))``)."""
        return (f"NodeDataset({self.name!r}, x={_shape(self.x)}, y={_shape(self.y)}, "
                f"edge_index={_shape(self.edge_index)}, num_classes={self.num_classes}, "
                f"splits={_splits_repr(self.splits)})")

    @property
    def device(self) -> torch.device:
        """Where the labels (and, after :meth:`to`, everything) are."""
        return self.y.device

    @property
    def num_nodes(self) -> int:
        """The graph's nodes (the length of ``y``)."""
        return self.y.numel()

    @property
    def num_features(self) -> int:
        """The feature width (columns of ``x``)."""
        return self.x.size(1)

    def to(self, device) -> "NodeDataset":
        """The same dataset with features (dense or sparse), labels, edges and every split's
        indices on ``device`` (itself when they are there already)."""
        device = torch.device(device)
        if self.y.device == device:
            return self
        return dataclasses.replace(self, x=self.x.to(device), y=self.y.to(device),
                                   edge_index=self.edge_index.to(device),
                                   splits=[s.to(device) for s in self.splits])


@dataclass
class GraphDataset:
    """Many small graphs for graph classification (a PyG dataset) and its folds.

    Args:
        name: the dataset's name in results.
        graphs: a sequence of PyG ``Data`` with ``x`` [n, num_features], ``edge_index`` and
            one class in ``y``.
        num_features: the node feature width.
        num_classes: the classifier's output width.
        splits: the :class:`Split` s (graph indices), e.g. :func:`stratified_folds`.
        description: one line for the logs.

    Example:
        >>> import torch
        >>> from torch_geometric.data import Data
        >>> from dignn import GraphDataset
        >>> from dignn.data import stratified_folds
        >>> graphs = [Data(x=torch.ones(2, 3), edge_index=torch.tensor([[0, 1], [1, 0]]),
        ...                y=torch.tensor([k % 2])) for k in range(6)]
        >>> data = GraphDataset("pairs", graphs, 3, 2, stratified_folds(torch.arange(6) % 2, 3))
        >>> len(data.splits), data.task
        (3, 'graph')
    """

    name: str
    graphs: Sequence  # PyG Data objects with x, edge_index, y
    num_features: int
    num_classes: int
    splits: List[Split]
    description: str = ""

    task = "graph"

    def __repr__(self) -> str:
        """One line: the number of graphs, not the graphs (``GraphDataset('mutag', graphs=188,
        num_features=7, num_classes=2, splits=10 x (~train 150, val 19, test 19))``)."""
        return (f"GraphDataset({self.name!r}, graphs={len(self.graphs)}, "
                f"num_features={self.num_features}, num_classes={self.num_classes}, "
                f"splits={_splits_repr(self.splits)})")


def random_splits(y: Tensor, num_splits: int = 10, train: float = 0.5, val: float = 0.25,
                  first_seed: int = 0, test: Optional[float] = None) -> List[Split]:
    """LINKX's random splits of the labeled nodes (y >= 0): split ``k`` permutes them with
    ``torch.Generator().manual_seed(first_seed + k)`` and takes the first ``train`` share for
    training, the next ``val`` share for validation and the rest for testing, or, when
    ``test`` is given, only the next ``test`` share (the other labeled nodes go unused)."""
    labeled = torch.nonzero(y >= 0).flatten()
    n = labeled.numel()
    n_train, n_val = int(n * train), int(n * val)
    end = n if test is None else n_train + n_val + int(n * test)
    splits = []
    for k in range(num_splits):
        gen = torch.Generator().manual_seed(first_seed + k)
        perm = labeled[torch.randperm(n, generator=gen)]
        splits.append(Split(perm[:n_train], perm[n_train:n_train + n_val],
                            perm[n_train + n_val:end]))
    return splits


def stratified_folds(y: Tensor, num_folds: int = 10, seed: int = 0) -> List[Split]:
    """Stratified ``num_folds``-fold cross-validation: each class's items are shuffled (seeded)
    and dealt round-robin to the folds, so every fold holds each class in proportion. Split
    ``k`` tests on fold ``k``, validates on fold ``k + 1`` and trains on the rest."""
    if num_folds < 3:
        raise ValueError(f"num_folds must be >= 3 (train, validation and test folds), got "
                         f"{num_folds}")
    gen = torch.Generator().manual_seed(seed)
    fold_of = torch.empty(y.numel(), dtype=torch.long)
    offset = 0
    for c in torch.unique(y).tolist():
        members = torch.nonzero(y == c).flatten()
        members = members[torch.randperm(members.numel(), generator=gen)]
        fold_of[members] = (torch.arange(members.numel()) + offset) % num_folds
        offset += members.numel()
    splits = []
    for k in range(num_folds):
        test = torch.nonzero(fold_of == k).flatten()
        val = torch.nonzero(fold_of == (k + 1) % num_folds).flatten()
        train = torch.nonzero((fold_of != k) & (fold_of != (k + 1) % num_folds)).flatten()
        splits.append(Split(train, val, test))
    return splits


def mask_splits(train: Tensor, val: Tensor, test: Tensor) -> List[Split]:
    """Splits from boolean masks of shape [num_nodes, num_splits]."""
    return [Split(torch.nonzero(train[:, k]).flatten(), torch.nonzero(val[:, k]).flatten(),
                  torch.nonzero(test[:, k]).flatten()) for k in range(train.size(1))]


def edge_homophily(edge_index: Tensor, y: Tensor) -> float:
    """The share of edges (between labeled nodes) that join nodes of the same class."""
    src, dst = edge_index
    keep = (y[src] >= 0) & (y[dst] >= 0)
    if not bool(keep.any()):
        return float("nan")
    return float((y[src[keep]] == y[dst[keep]]).double().mean())


def row_normalize(x: Tensor) -> Tensor:
    """Each feature row divided by its sum (PyG's NormalizeFeatures; all-zero rows stay 0),
    the preprocessing the paper's authors apply to Cora and Chameleon."""
    x = x.float()
    return x / x.sum(dim=1, keepdim=True).clamp_min(1e-12)


def sparse_features(x: Tensor, density: float = 0.05) -> Tensor:
    """A sparse (COO) copy of a float feature matrix when it is mostly zeros (one-hot)."""
    x = x.float()
    if x.numel() and float((x != 0).float().mean()) < density:
        return x.to_sparse().coalesce()
    return x


@dataclass
class InductiveDataset:
    """Node classification across graphs: training graphs, then validation and test graphs
    the model does not see while it trains. ``graphs`` holds PyG ``Data`` objects (``x``
    [n, num_features], ``edge_index``, ``y`` [n, num_labels] of 0/1), the training graphs
    first; the single split holds the positions of each set's graphs in ``graphs``."""

    name: str
    graphs: List  # PyG Data objects
    num_features: int
    num_labels: int
    splits: List[Split]
    description: str = ""

    task = "multilabel"

    def __repr__(self) -> str:
        """One line: the number of graphs, not the graphs."""
        return (f"InductiveDataset({self.name!r}, graphs={len(self.graphs)}, "
                f"num_features={self.num_features}, num_labels={self.num_labels}, "
                f"splits={_splits_repr(self.splits)})")

    @property
    def num_classes(self) -> int:
        """The classifier's output width: one logit per label."""
        return self.num_labels

    def _graphs_of(self, index) -> List:
        return [self.graphs[i] for i in index.tolist()]

    @property
    def train(self) -> List:
        """The training graphs."""
        return self._graphs_of(self.splits[0].train)

    @property
    def val(self) -> List:
        """The validation graphs (not seen in training)."""
        return self._graphs_of(self.splits[0].val)

    @property
    def test(self) -> List:
        """The test graphs (not seen in training)."""
        return self._graphs_of(self.splits[0].test)
