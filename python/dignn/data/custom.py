"""Graphs users bring: a PyTorch Geometric ``Data`` (node classification) or a collection of
graphs with one label each (graph classification), as objects or as files written by
``torch.save``.

Node classification (:func:`from_pyg` on a ``Data``, or on a dataset of one graph): ``x``
[num_nodes, num_features] (dense or sparse; converted to float), ``edge_index`` [2,
num_edges] (used as given: PyG's flow, node ``edge_index[1]`` aggregates over
``edge_index[0]``; add reverse edges yourself for an undirected graph), ``y`` [num_nodes] of
integer classes, -1 on unlabeled nodes (``num_classes`` = largest label + 1). Splits come
from boolean ``train_mask``/``val_mask``/``test_mask`` of shape [num_nodes] (one split) or
[num_nodes, S] (S splits; a [num_nodes] mask beside [num_nodes, S] ones is used in every
split) when the graph has them, else from ``split_ratio=(train, val, test)``: seeded random
splits of the labeled nodes, split ``k`` drawn with seed ``seed + k`` (as
:func:`~dignn.data.core.random_splits` draws LINKX's). Other attributes (``edge_attr``,
``edge_weight``, ...) are not used.

Graph classification (a ``Dataset``/``InMemoryDataset``, a list of ``Data``, or a file of
PyG's ``InMemoryDataset.save`` format): every graph has ``x`` with the same number of
columns, ``edge_index`` and one integer label in ``y`` (-1: unlabeled, left out of every
fold). Splits: ``split_ratio`` as above over the labeled graphs, else stratified
``num_splits``-fold cross-validation (:func:`~dignn.data.core.stratified_folds`, seed
``seed``).

Features are required: a graph without ``x`` is refused rather than given made-up features,
since what stands in for missing features (a constant, one-hot degrees, random vectors)
changes the task; the error says how to add them (e.g. PyG's ``OneHotDegree`` transform).
Every problem with the input raises :class:`UserDataError` (a ``ValueError``) that names what
is wrong and how to fix it.
"""
from __future__ import annotations

import math
import os
import pickle
import re
import warnings
from pathlib import Path
from typing import List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from ..files import archive_damage, describe_load_error
from .core import GraphDataset, NodeDataset, Split, random_splits, stratified_folds

__all__ = ["UserDataError", "from_pyg", "load_user_file"]

_MASKS = ("train_mask", "val_mask", "test_mask")
_SET_NAMES = ("training", "validation", "test")
_INTEGER_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


class UserDataError(ValueError):
    """A user's graph or file cannot be trained on as it is; the message says why and what to
    change. A ``ValueError``.

    Example:
        >>> import torch
        >>> from dignn import UserDataError, from_pyg
        >>> try:
        ...     from_pyg({"edge_index": torch.tensor([[0], [1]]), "y": torch.tensor([0, 1])})
        ... except UserDataError as err:
        ...     print("refused:", str(err)[:40])
        refused: ...
    """


def _plain(t: Tensor) -> Tensor:
    """A plain tensor (PyG's ``Index``/``EdgeIndex`` subclasses dropped)."""
    return t.as_subclass(Tensor) if type(t) is not Tensor else t


def _ids(mask: Tensor, limit: int = 5) -> str:
    ids = torch.nonzero(mask).flatten()
    shown = ", ".join(str(i) for i in ids[:limit].tolist())
    return shown + (", ..." if ids.numel() > limit else "")


def _check_ratio(split_ratio) -> Tuple[float, float, float]:
    try:
        ratio = tuple(float(r) for r in split_ratio)
    except (TypeError, ValueError):
        ratio = ()
    if len(ratio) != 3:
        raise UserDataError(f"split_ratio must be three shares (train, val, test) such as "
                            f"(0.6, 0.2, 0.2), got {split_ratio!r}")
    if not all(0.0 < r < 1.0 for r in ratio) or sum(ratio) > 1.0 + 1e-9:
        raise UserDataError(f"split_ratio shares must each be in (0, 1) and sum to at most 1, "
                            f"got {split_ratio!r} (sum {sum(ratio):g})")
    return ratio


def _check_num_splits(num_splits) -> int:
    if isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 1:
        raise UserDataError(f"num_splits must be a positive integer, got {num_splits!r}")
    return num_splits


def _describe_ratio(ratio, count: int, seed: int) -> str:
    seeds = f"seed {seed}" if count == 1 else f"seeds {seed}..{seed + count - 1}"
    return (f"{count} seeded random {'/'.join(f'{100 * r:g}' for r in ratio)} "
            f"split{'s' if count > 1 else ''} ({seeds})")


def _ratio_splits(y: Tensor, ratio, num_splits: int, seed: int, items: str) -> List[Split]:
    """Seeded random splits of the labeled items; when the shares sum to 1 the test set
    takes every item the first two leave (no item lost to rounding)."""
    train, val, test = ratio
    whole = math.isclose(train + val + test, 1.0, abs_tol=1e-9)
    splits = random_splits(y, num_splits, train, val, first_seed=seed,
                           test=None if whole else test)
    n = int((y >= 0).sum())
    for name, size in zip(_SET_NAMES, splits[0].sizes()):
        if size == 0:
            raise UserDataError(f"split_ratio {tuple(ratio)} leaves the {name} set empty: "
                                f"there are only {n} labeled {items}; raise its share or "
                                f"label more {items}")
    return splits


def _check_splits(splits: List[Split], how: str, items: str, fix: str = "") -> None:
    for k, split in enumerate(splits):
        for name, size in zip(_SET_NAMES, split.sizes()):
            if size == 0:
                raise UserDataError(f"split {k} ({how}) has no {name} {items}; every split "
                                    f"needs training, validation and test {items}{fix}")


def _features(x, what: str, num_nodes: Optional[int]) -> Tensor:
    if x is None:
        raise UserDataError(
            f"{what} has no node features 'x'; DIGNN's input unit needs them. Add them before "
            f"saving, e.g. data.x = torch.ones(data.num_nodes, 1) for a constant feature or "
            f"torch_geometric.transforms.OneHotDegree(max_degree)(data) for one-hot degrees")
    if not isinstance(x, Tensor):
        raise UserDataError(f"{what}'s 'x' must be a tensor [num_nodes, num_features], got "
                            f"{type(x).__name__}")
    x = _plain(x)
    if x.dim() != 2:
        raise UserDataError(f"{what}'s 'x' must have shape [num_nodes, num_features], got "
                            f"{list(x.shape)}; for one feature per node use x.view(-1, 1)")
    if x.is_complex():
        raise UserDataError(f"{what}'s 'x' is complex ({x.dtype}); DIGNN needs real features")
    if num_nodes is not None and x.size(0) != num_nodes:
        raise UserDataError(f"{what}'s 'x' has {x.size(0)} rows but the graph has "
                            f"{num_nodes} nodes")
    x = x.float()
    if x.is_sparse:
        x = x.coalesce()
    finite = torch.isfinite(x.values() if x.is_sparse else x)
    if not bool(finite.all()):
        rows = (x.indices()[0][~finite] if x.is_sparse else
                torch.nonzero(~finite.all(1)).flatten())
        raise UserDataError(f"{what}'s 'x' holds NaN or infinite values (in "
                            f"{int(torch.unique(rows).numel())} rows, e.g. row "
                            f"{int(rows[0])}); replace them (e.g. torch.nan_to_num) before "
                            f"saving")
    return x


def _edges(edge_index, what: str, num_nodes: int) -> Tensor:
    if edge_index is None:
        raise UserDataError(f"{what} has no 'edge_index'; save the edges as an integer tensor "
                            f"of shape [2, num_edges] (a SparseTensor 'adj_t' can be turned "
                            f"into one with torch_geometric.utils.to_edge_index)")
    if not isinstance(edge_index, Tensor) or edge_index.dim() != 2 or edge_index.size(0) != 2:
        shape = list(edge_index.shape) if isinstance(edge_index, Tensor) else \
            type(edge_index).__name__
        hint = ("; it looks transposed: save edge_index.t()"
                if isinstance(edge_index, Tensor) and edge_index.dim() == 2
                and edge_index.size(1) == 2 else "")
        raise UserDataError(f"{what}'s 'edge_index' must have shape [2, num_edges], got "
                            f"{shape}{hint}")
    edge_index = _plain(edge_index)
    if edge_index.dtype not in _INTEGER_DTYPES:
        raise UserDataError(f"{what}'s 'edge_index' must hold integer node indices, got "
                            f"{edge_index.dtype}; convert with edge_index.long()")
    edge_index = edge_index.long().contiguous()
    if edge_index.numel():
        low, high = int(edge_index.min()), int(edge_index.max())
        if low < 0 or high >= num_nodes:
            bad = low if low < 0 else high
            raise UserDataError(f"{what}'s 'edge_index' names node {bad}, but the graph has "
                                f"{num_nodes} nodes (indices 0..{num_nodes - 1}); drop those "
                                f"edges or add the missing nodes' rows to x and y")
    return edge_index


def _labels(y, what: str) -> Tensor:
    if y is None:
        raise UserDataError(f"{what} has no labels 'y'; save integer class labels (-1 for an "
                            f"unlabeled node or graph)")
    if not isinstance(y, Tensor):
        raise UserDataError(f"{what}'s 'y' must be a tensor of integer class labels, got "
                            f"{type(y).__name__}")
    y = _plain(y)
    if y.dim() == 2 and y.size(1) == 1:
        y = y.flatten()
    if y.dim() > 1:
        raise UserDataError(f"{what}'s 'y' has shape {list(y.shape)}: that is multi-label (or "
                            f"multi-target) data; DIGNN trains single-label classification, "
                            f"so save one integer class per node, shape [num_nodes]")
    if y.dtype not in _INTEGER_DTYPES:
        kind = " (floating point: regression targets?)" if y.is_floating_point() else ""
        raise UserDataError(f"{what}'s 'y' must hold integer class labels, got {y.dtype}"
                            f"{kind}; DIGNN classifies, so save class ids with y.long() "
                            f"(and -1 for unlabeled)")
    y = y.long()
    if y.numel() and int(y.min()) < -1:
        raise UserDataError(f"{what}'s 'y' holds label {int(y.min())}; labels must be class "
                            f"ids 0..C-1, or -1 for unlabeled")
    return y


def _num_classes(y: Tensor, what: str, items: str) -> int:
    labeled = y[y >= 0]
    if labeled.numel() == 0:
        raise UserDataError(f"{what} has no labeled {items} (every label is -1)")
    classes = torch.unique(labeled)
    if classes.numel() < 2:
        raise UserDataError(f"{what}'s labeled {items} are all of class {int(classes[0])}; "
                            f"classification needs at least two classes")
    num_classes = int(labeled.max()) + 1
    # The model gets one output per class id up to the largest: ids far beyond the number
    # of labeled items are not class ids 0..C-1 (raw ids, hashes), and would size the
    # output layer by them.
    if num_classes > labeled.numel():
        raise UserDataError(
            f"{what}'s 'y' holds class id {num_classes - 1} but only {labeled.numel()} "
            f"{items} are labeled ({classes.numel()} distinct classes); labels must be class "
            f"ids 0..C-1 with C at most the number of labeled {items}: renumber them, e.g. "
            f"y[y >= 0] = torch.unique(y[y >= 0], return_inverse=True)[1]")
    return num_classes


def _mask_splits(data, y: Tensor, what: str) -> Optional[List[Split]]:
    """The splits of ``data``'s masks (None when it has none), checked."""
    present = {k: getattr(data, k, None) for k in _MASKS}
    if all(v is None for v in present.values()):
        return None
    missing = [k for k, v in present.items() if v is None]
    if missing:
        raise UserDataError(f"{what} has {', '.join(k for k in _MASKS if k not in missing)} "
                            f"but no {', '.join(missing)}; save all three masks (model "
                            f"selection needs validation nodes) or none and pass "
                            f"split_ratio (--split-ratio)")
    n = y.numel()
    masks = []
    for key, mask in present.items():
        if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
            kind = mask.dtype if isinstance(mask, Tensor) else type(mask).__name__
            raise UserDataError(f"{what}'s {key} must be a bool tensor, got {kind}; convert "
                                f"with {key}.bool() (or build it from node indices with "
                                f"torch_geometric.utils.index_to_mask)")
        mask = _plain(mask)
        if mask.dim() not in (1, 2) or mask.size(0) != n:
            raise UserDataError(f"{what}'s {key} has shape {list(mask.shape)}; it must be "
                                f"[num_nodes] or [num_nodes, num_splits] with num_nodes = {n}")
        masks.append(mask.view(n, -1))
    counts = {m.size(1) for m in masks} - {1}
    if len(counts) > 1:
        raise UserDataError(f"{what}'s masks hold different numbers of splits "
                            f"({', '.join(f'{k}: {m.size(1)}' for k, m in zip(_MASKS, masks))})"
                            f"; give every mask the same number of columns")
    num_splits = counts.pop() if counts else 1
    masks = [m.expand(n, num_splits) for m in masks]
    train, val, test = masks
    splits = []
    for k in range(num_splits):
        where = f" in split {k}" if num_splits > 1 else ""
        for (a, b), (na, nb) in zip(((train, val), (train, test), (val, test)),
                                    ((0, 1), (0, 2), (1, 2))):
            both = a[:, k] & b[:, k]
            if bool(both.any()):
                raise UserDataError(f"{what}'s {_MASKS[na]} and {_MASKS[nb]} overlap{where} "
                                    f"({int(both.sum())} nodes, e.g. {_ids(both)}); a node "
                                    f"may be in at most one set of a split")
        for key, m in zip(_MASKS, masks):
            unlabeled = m[:, k] & (y < 0)
            if bool(unlabeled.any()):
                raise UserDataError(f"{what}'s {key} selects unlabeled nodes (y = -1){where}: "
                                    f"{int(unlabeled.sum())} nodes, e.g. {_ids(unlabeled)}; "
                                    f"label them or drop them from the mask")
        splits.append(Split(*(torch.nonzero(m[:, k]).flatten() for m in masks)))
    _check_splits(splits, "from the masks", "nodes")
    return splits


def _node_dataset(data, name: str, split_ratio, num_splits: int, seed: int) -> NodeDataset:
    what = f"graph {name}"
    y = _labels(getattr(data, "y", None), what)
    x = getattr(data, "x", None)
    n = x.size(0) if isinstance(x, Tensor) and x.dim() >= 1 else y.numel()
    if y.numel() != n:
        hint = (" (one label for the whole graph: graph classification needs many graphs, "
                "saved as an InMemoryDataset or a list of Data)" if y.numel() == 1 else "")
        raise UserDataError(f"{what}'s 'y' has {y.numel()} entries but the graph has {n} "
                            f"nodes{hint}; node classification needs one label per node")
    x = _features(x, what, n)
    edge_index = _edges(getattr(data, "edge_index", None), what, n)
    num_classes = _num_classes(y, what, "nodes")
    splits = _mask_splits(data, y, what)
    if splits is not None:
        if split_ratio is not None:
            warnings.warn(f"{what} has train/val/test masks, which are used; split_ratio "
                          f"{tuple(split_ratio)} is ignored (delete the masks to use it)",
                          UserWarning, stacklevel=3)
        how = f"{len(splits)} split(s) from its masks"
    elif split_ratio is not None:
        ratio = _check_ratio(split_ratio)
        splits = _ratio_splits(y, ratio, _check_num_splits(num_splits), seed, "nodes")
        how = _describe_ratio(ratio, len(splits), seed) + " of the labeled nodes"
    else:
        raise UserDataError(f"{what} has no train_mask/val_mask/test_mask; save the masks "
                            f"with the graph, or pass split_ratio=(train, val, test) "
                            f"(--split-ratio 0.6,0.2,0.2) for seeded random splits")
    labeled = int((y >= 0).sum())
    desc = (f"{name} (user data: {n} nodes, {edge_index.size(1)} edges, {x.size(1)} "
            f"features, {num_classes} classes, {labeled} labeled nodes, {how})")
    return NodeDataset(name, x, y, edge_index, num_classes, splits, desc)


def _graph_dataset(graphs: Sequence, name: str, split_ratio, num_splits: int,
                   seed: int) -> GraphDataset:
    from torch_geometric.data import Data, InMemoryDataset
    clean, labels, width = [], [], None
    for i, g in enumerate(graphs):
        what = f"graph {i} of {name}"
        if not isinstance(g, Data):
            raise UserDataError(f"{what} is a {type(g).__name__}, not a torch_geometric Data")
        y = _labels(getattr(g, "y", None), what)
        if y.numel() != 1:
            raise UserDataError(
                f"{what}'s 'y' has {y.numel()} entries; graph classification needs one label "
                f"per graph (for node classification save a single Data, merging several "
                f"graphs with torch_geometric.data.Batch.from_data_list if need be)")
        x = _features(getattr(g, "x", None), what, None)
        if width is not None and x.size(1) != width:
            raise UserDataError(f"{what} has {x.size(1)} features, graph 0 has {width}; "
                                f"every graph needs the same feature columns")
        width = x.size(1)
        edge_index = _edges(getattr(g, "edge_index", None), what, x.size(0))
        clean.append(Data(x=x.to_dense() if x.is_sparse else x, edge_index=edge_index,
                          y=y.view(1)))
        labels.append(y.view(1))
    if not clean:
        raise UserDataError(f"{name!r} holds no graphs")
    y = torch.cat(labels)
    num_classes = _num_classes(y, name, "graphs")
    labeled = torch.nonzero(y >= 0).flatten()
    if split_ratio is not None:
        ratio = _check_ratio(split_ratio)
        splits = _ratio_splits(y, ratio, _check_num_splits(num_splits), seed, "graphs")
        how = _describe_ratio(ratio, len(splits), seed) + " of the labeled graphs"
    else:
        folds = _check_num_splits(num_splits)
        if folds < 3:
            raise UserDataError(f"num_splits is the number of cross-validation folds, at "
                                f"least 3 (train, validation, test), got {folds}; or pass "
                                f"split_ratio")
        splits = [Split(*(labeled[idx] for idx in (s.train, s.val, s.test)))
                  for s in stratified_folds(y[labeled], folds, seed)]
        _check_splits(splits, f"{folds}-fold cross-validation of {labeled.numel()} labeled "
                      "graphs", "graphs", ": lower num_splits (--num-splits) or pass "
                      "split_ratio")
        how = f"stratified {folds}-fold cross-validation, seed {seed}"
    dataset = InMemoryDataset()
    dataset._data, dataset.slices = InMemoryDataset.collate(clean)
    desc = (f"{name} (user data: {len(clean)} graphs, {width} features, {num_classes} "
            f"classes, {how})")
    return GraphDataset(name, dataset, width, num_classes, splits, desc)


def _graph_list(obj) -> Optional[list]:
    """The graphs of a PyG dataset, a list/tuple of Data, or PyG's collated formats
    ``(data, slices)`` and ``(data.to_dict(), slices, Data)``; None for anything else."""
    from torch_geometric.data import Data, Dataset, InMemoryDataset
    if isinstance(obj, Dataset):
        return [obj[i] for i in range(len(obj))]
    if isinstance(obj, tuple) and len(obj) in (2, 3) and isinstance(obj[1], (dict, type(None))):
        data = obj[0]
        if isinstance(data, dict) and len(obj) == 3 and isinstance(obj[2], type):
            data = obj[2].from_dict(data)
        if isinstance(data, Data):
            if obj[1] is None:
                return [data]
            collated = InMemoryDataset()
            collated._data, collated.slices = data, obj[1]
            return [collated[i] for i in range(len(collated))]
    if isinstance(obj, (list, tuple)) and obj and all(isinstance(g, Data) for g in obj):
        return list(obj)
    return None


def from_pyg(data, name: Optional[str] = None,
             split_ratio: Optional[Sequence[float]] = None, num_splits: int = 10,
             seed: int = 0) -> Union[NodeDataset, GraphDataset]:
    """A :class:`NodeDataset` from a ``Data`` (or a dataset of one graph with per-node
    labels), or a :class:`GraphDataset` from a ``Dataset``/``InMemoryDataset``/list of
    ``Data`` with one label per graph; see the module docstring for what is expected.

    ``name``: the dataset's name in results (default: ``data.name`` when it is a string, else
    ``"graph-data"``). ``split_ratio=(train, val, test)`` (shares in (0, 1) summing to at most
    1): ``num_splits`` seeded random splits, used when the graph has no masks (masks win, with
    a warning). Without masks or ``split_ratio``, node data is refused; graphs get stratified
    ``num_splits``-fold cross-validation.

    Args:
        data: a PyG ``Data`` (or a dict of its tensors) for node classification; a
            ``Dataset``/``InMemoryDataset`` or list of ``Data`` with one label each for graph
            classification. ``edge_index`` is used as given (PyG's flow: node
            ``edge_index[1]`` aggregates over ``edge_index[0]``; add reverse edges for an
            undirected graph).
        name: the name in results.
        split_ratio: (train, val, test) shares, or None.
        num_splits: the random splits (or folds) to make, >= 1.
        seed: split ``k`` is drawn with seed ``seed + k``.

    Returns:
        NodeDataset or GraphDataset.

    Raises:
        UserDataError: anything the model cannot train on (no features, bad shapes, labels,
            masks or ratios; a HeteroData), with what to change.

    Example:
        >>> import torch
        >>> from torch_geometric.data import Data
        >>> from dignn import from_pyg
        >>> data = Data(x=torch.randn(8, 3), y=torch.tensor([0, 1] * 4),
        ...             edge_index=torch.tensor([[0, 1, 2, 3], [1, 0, 3, 2]]))
        >>> dataset = from_pyg(data, split_ratio=(0.5, 0.25, 0.25), num_splits=2)
        >>> dataset.num_classes, len(dataset.splits), dataset.splits[0].sizes()
        (2, 2, (4, 2, 2))
    """
    from torch_geometric.data import Data, HeteroData
    name = name or (getattr(data, "name", None) if isinstance(getattr(data, "name", None), str)
                    else None) or "graph-data"
    if isinstance(data, HeteroData):
        raise UserDataError(f"{name!r} is a HeteroData (heterogeneous graph); DIGNN takes "
                            f"one node and edge type: convert with data.to_homogeneous()")
    if isinstance(data, dict) and data and all(isinstance(k, str) for k in data):
        data = Data(**data)  # a plain dict of tensors: x, edge_index, y, masks
    if isinstance(data, Data):
        return _node_dataset(data, name, split_ratio, num_splits, seed)
    graphs = _graph_list(data)
    if graphs is None:
        raise UserDataError(
            f"{name!r} is a {type(data).__module__}.{type(data).__name__}, not a "
            f"torch_geometric Data, Dataset/InMemoryDataset or list of Data; save the graph "
            f"with torch.save(data, path) (node classification) or the graphs with "
            f"InMemoryDataset.save(list_of_data, path) (graph classification)")
    if not graphs:
        raise UserDataError(f"{name!r} holds no graphs")
    first_y = getattr(graphs[0], "y", None)
    if len(graphs) == 1 and isinstance(first_y, Tensor) and first_y.numel() != 1:
        return _node_dataset(graphs[0], name, split_ratio, num_splits, seed)
    return _graph_dataset(graphs, name, split_ratio, num_splits, seed)


def _safe_globals() -> list:
    """The PyG classes a pickled ``Data`` (and PyG's collated dataset files) refer to."""
    from torch_geometric.data import Data
    from torch_geometric.data.data import DataEdgeAttr, DataTensorAttr
    from torch_geometric.data.storage import EdgeStorage, GlobalStorage, NodeStorage
    return [Data, DataEdgeAttr, DataTensorAttr, GlobalStorage, NodeStorage, EdgeStorage]


# How to opt in to unpickling a dataset file (which runs any code the file names).
_OPT_IN = ("pass --trust-pickle (dignn train/sweep) or allow_pickle=True (load_user_file, "
           "train_graph_data)")
TRUST_PICKLE_HINT = f"only if you trust this file (unpickling runs any code it names), {_OPT_IN}"


def load_user_file(path: Union[str, os.PathLike], name: Optional[str] = None,
                   split_ratio: Optional[Sequence[float]] = None, num_splits: int = 10,
                   seed: int = 0, allow_pickle: bool = False
                   ) -> Union[NodeDataset, GraphDataset]:
    """Reads a file written by ``torch.save`` and passes what it holds to :func:`from_pyg`
    (``name`` defaults to the file's stem).

    The file is read with ``torch.load(weights_only=True)``, allowing PyG's ``Data``
    classes: that covers ``torch.save(data, path)``, a list of ``Data``, a dict of tensors
    and PyG's ``InMemoryDataset.save(list_of_data, path)``, and runs no code from the file.
    Anything else (a whole dataset object, ``torch.save(dataset, path)``, which pickles its
    class; a ``Data`` holding other objects) is refused with :class:`UserDataError`, unless
    ``allow_pickle=True`` (the CLI's ``--trust-pickle``): then the file is **unpickled**
    (``weights_only=False``), which can run arbitrary code: only for files you trust.

    Args:
        path: the file.
        name: the name in results (default: the file's stem).
        split_ratio, num_splits, seed: as for :func:`from_pyg`.
        allow_pickle: unpickle a file ``weights_only=True`` refuses (runs its code).

    Returns:
        NodeDataset or GraphDataset.

    Raises:
        UserDataError: a missing, empty, damaged or foreign file, one that needs unpickling
            without ``allow_pickle``, or data :func:`from_pyg` refuses.

    Example:
        >>> import os, tempfile, torch
        >>> from torch_geometric.data import Data
        >>> from dignn import load_user_file
        >>> path = os.path.join(tempfile.mkdtemp(), "graph.pt")
        >>> torch.save(Data(x=torch.randn(8, 3), y=torch.tensor([0, 1] * 4),
        ...                 edge_index=torch.tensor([[0, 1], [1, 0]])), path)
        >>> dataset = load_user_file(path, split_ratio=(0.5, 0.25, 0.25), num_splits=1)
        >>> dataset.name, dataset.x.shape
        ('graph', torch.Size([8, 3]))
    """
    path = Path(path).expanduser()
    if not path.is_file():
        where = "is a folder" if path.is_dir() else "does not exist"
        raise UserDataError(f"dataset file {str(path)!r} {where}; pass the path of a file "
                            f"written by torch.save(data, path), or a dataset name")
    name = name or path.stem
    if path.stat().st_size == 0:
        raise UserDataError(f"dataset file {str(path)!r} is empty (0 bytes): not a file "
                            f"written by torch.save; save the graph again")
    damage = archive_damage(path, required=False)
    if damage is not None:
        raise UserDataError(f"dataset file {str(path)!r} is damaged: {damage}; save the "
                            f"graph again (or copy it again)")
    try:
        with torch.serialization.safe_globals(_safe_globals()):
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as safe_error:  # noqa: BLE001 - any failure: explained below
        text = str(safe_error)
        first = (text.splitlines() or [""])[0][:200]
        if "Weights only load failed" not in text:
            raise UserDataError(f"{str(path)!r} is not a file written by torch.save "
                                f"({type(safe_error).__name__}: {first})") from None
        unsupported = re.findall(r"GLOBAL ([\w.]+)", text)
        if not allow_pickle and not unsupported:  # garbage, or a pickle of odd opcodes
            raise UserDataError(
                f"{str(path)!r} is not a file written by torch.save of PyG data "
                f"({describe_load_error(safe_error)}); save the graph with "
                f"torch.save(data, path), or, if it is a pickle you trust, "
                f"{_OPT_IN}") from None
        if not allow_pickle:
            raise UserDataError(
                f"{str(path)!r} needs unpickling to load (it pickles "
                f"{unsupported[0][:120]}); re-save the graphs as plain PyG data with "
                f"torch.save(data, path) or InMemoryDataset.save(list(dataset), path), or, "
                f"{TRUST_PICKLE_HINT}") from None
        try:
            obj = torch.load(path, map_location="cpu", weights_only=False)
        except (ImportError, AttributeError) as err:
            raise UserDataError(
                f"{str(path)!r} pickles a class that cannot be imported here ({err}); save "
                f"plain PyG objects instead: torch.save(data, path) for one graph, "
                f"InMemoryDataset.save(list(dataset), path) for many") from None
        except Exception as err:  # noqa: BLE001
            what = ("is not a file written by torch.save" if isinstance(
                err, pickle.UnpicklingError) else "could not be read by torch.load")
            raise UserDataError(f"{str(path)!r} {what} ({type(err).__name__}: "
                                f"{' '.join(str(err).split())[:200]})") from None
    try:
        return from_pyg(obj, name=name, split_ratio=split_ratio, num_splits=num_splits,
                        seed=seed)
    except UserDataError as err:
        raise UserDataError(f"{path}: {err}") from None
