"""Datasets of the paper's experiments, loaded through PyTorch Geometric, plus two generated
graphs that need no files.

Every loader returns a :class:`NodeDataset` (one graph, node labels, a list of splits) or a
:class:`GraphDataset` (many graphs, graph labels, a list of folds); :func:`load_dataset` picks
by name (one line each: task, PyG class, splits):

- ``csbm`` (node; the default): generated contextual stochastic block model, 10 seeded
  60/20/20 splits.
- ``penn94-synthetic`` (node): generated graph of Penn94's shape, 10 seeded 50/25/25 splits.
- ``cora``, ``citeseer``, ``pubmed`` (node): ``Planetoid(root, "Cora"|"CiteSeer"|"PubMed",
  split="geom-gcn")``, the 10 Geom-GCN splits, row-normalized features.
- ``chameleon``, ``squirrel`` (node): the heterophilous-graphs npz (``<name>/raw/<name>.npz``,
  the format of ``HeterophilousGraphDataset``, read here), undirected, its 10 stored splits.
- ``chameleon-directed``, ``squirrel-directed`` (node): ``WikipediaNetwork(root, name,
  geom_gcn_preprocess=True)``, the Geom-GCN release with directed links, 10 Geom-GCN splits.
- ``penn94`` (node): ``LINKXDataset(root, "penn94")``, its 5 fixed splits.
- ``amherst41``, ``cornell5``, ``johnshopkins55``, ``reed98`` (node): ``LINKXDataset(root,
  name)``, 10 seeded random 50/25/25 splits of the labeled nodes.
- ``mutag``, ``ptc-mr``, ``proteins``, ``nci1`` (graph): ``TUDataset(root, "MUTAG"|"PTC_MR"|
  "PROTEINS"|"NCI1")``, one-hot node labels, stratified 10-fold cross-validation.
- ``imdb-binary``, ``imdb-multi`` (graph): ``TUDataset(root, "IMDB-BINARY"|"IMDB-MULTI")``,
  one-hot degree features (``OneHotDegree``), stratified 10-fold cross-validation.
- ``ppi`` (multi-label, inductive): ``PPI(root, split)``, 20 train / 2 validation / 2 test
  graphs (GraphSAGE's split), 121 labels, micro-F1 (:class:`InductiveDataset`).

Data root and cache. Raw files are looked for under ``data_root`` (default ``$DIGNN_DATA``,
else the cache) in PyG's layout ``<root>/<name>/raw/...``. The data root is only ever read:
PyG writes ``processed/`` files, so the needed raw files are first copied into the cache
(``cache_dir``, default ``$DIGNN_CACHE`` or ``~/.cache/dignn``, created when missing) and PyG
runs there. With no raw files anywhere, PyG's normal download fills the cache; offline, a
:class:`DatasetUnavailableError` lists every file PyG expects, its folder and its URL.

Seeds (fixed, so that every run sees the same splits): the LINKX-style random splits and the
generated graphs use ``torch.Generator().manual_seed(k)`` for split ``k``, over the labeled
nodes only (label -1 = unlabeled), 50/25/25 as in LINKX; the TU datasets' folds are
stratified by class with seed 0 (fold ``k`` is the test set, fold ``k + 1 mod 10`` the
validation set, the other eight train).
"""
from __future__ import annotations

from functools import partial
from typing import Callable, Dict, Optional, Union

from ..catalog import DATASETS
from .core import (GraphDataset, InductiveDataset, NodeDataset, Split, edge_homophily,
                   random_splits, stratified_folds)
from .generated import csbm, penn94_synthetic
from .ppi import load_ppi
from .storage import (DatasetUnavailableError, PathLike, default_cache_dir,
                      default_data_root)
from . import linkx, planetoid, tu, wikipedia
from .custom import UserDataError, from_pyg, load_user_file  # graphs users bring

__all__ = [
    "NodeDataset", "GraphDataset", "Split", "DATASETS", "DatasetUnavailableError",
    "load_dataset", "default_data_root", "default_cache_dir", "csbm", "penn94_synthetic",
    "random_splits", "stratified_folds", "edge_homophily", "LOADERS", "GENERATORS",
    "InductiveDataset", "UserDataError", "from_pyg", "load_user_file",
]

# The generators take options (load_dataset's keyword arguments) and no files; looked up in
# this module at call time, so that tests can replace ``dignn.data.csbm``.
GENERATORS: Dict[str, Callable] = {
    "csbm": lambda **options: csbm(**options),
    "penn94-synthetic": lambda **options: penn94_synthetic(**options),
}

# name -> loader(data_root, cache_dir); one line per dataset.
LOADERS: Dict[str, Callable] = {
    "cora": partial(planetoid.load, "cora"),
    "citeseer": partial(planetoid.load, "citeseer"),
    "pubmed": partial(planetoid.load, "pubmed"),
    "chameleon": partial(wikipedia.load_npz, "chameleon"),
    "squirrel": partial(wikipedia.load_npz, "squirrel"),
    "chameleon-directed": partial(wikipedia.load_directed, "chameleon-directed"),
    "squirrel-directed": partial(wikipedia.load_directed, "squirrel-directed"),
    "penn94": partial(linkx.load, "penn94"),
    "amherst41": partial(linkx.load, "amherst41"),
    "cornell5": partial(linkx.load, "cornell5"),
    "johnshopkins55": partial(linkx.load, "johnshopkins55"),
    "reed98": partial(linkx.load, "reed98"),
    "mutag": partial(tu.load, "mutag"),
    "ptc-mr": partial(tu.load, "ptc-mr"),
    "proteins": partial(tu.load, "proteins"),
    "nci1": partial(tu.load, "nci1"),
    "imdb-binary": partial(tu.load, "imdb-binary"),
    "imdb-multi": partial(tu.load, "imdb-multi"),
    "ppi": load_ppi,
}


def load_dataset(name: str = "csbm", data_root: Optional[PathLike] = None,
                 cache_dir: Optional[PathLike] = None, **generator_kwargs
                 ) -> Union[NodeDataset, GraphDataset]:
    """Loads a dataset by name (see the module docstring; ``_`` and ``-`` are the same).
    ``generator_kwargs`` go to the generators of ``csbm`` and ``penn94-synthetic`` (e.g.
    ``homophily=0.3``).

    Args:
        name: a name of :data:`DATASETS` (case-insensitive; default ``"csbm"``, generated).
        data_root: where raw files are looked for (PyG's layout ``<root>/<name>/raw/...``;
            default ``$DIGNN_DATA``, else the cache); only ever read.
        cache_dir: where PyG runs and writes ``processed/`` (default ``$DIGNN_CACHE`` or
            ``~/.cache/dignn``).
        **generator_kwargs: options of :func:`csbm` or :func:`penn94_synthetic`
            (``num_nodes``, ``homophily``, ``num_splits``, ``seed``, ...).

    Returns:
        NodeDataset, GraphDataset or InductiveDataset: by the dataset's task.

    Raises:
        ValueError: an unknown name (the message lists the known ones), or generator
            options for a dataset read from files.
        DatasetUnavailableError: the raw files are missing and cannot be downloaded (the
            message lists every expected file, its folder and its URL).

    Example:
        >>> from dignn import load_dataset
        >>> data = load_dataset("csbm", num_nodes=40, num_splits=2)
        >>> data.x.shape, data.num_classes, len(data.splits)
        (torch.Size([40, 32]), 4, 2)
        >>> data.splits[0].sizes()  # seeded 60/20/20 of the labeled nodes
        (24, 8, 8)
    """
    key = name.lower().replace("_", "-")
    if key not in DATASETS or key not in {**GENERATORS, **LOADERS}:
        raise ValueError(f"unknown dataset {name!r}; choose one of {sorted(DATASETS)}")
    if key in GENERATORS:
        return GENERATORS[key](**generator_kwargs)
    if generator_kwargs:
        raise ValueError(f"dataset {name!r} takes no generator options, got "
                         f"{sorted(generator_kwargs)}")
    return LOADERS[key](data_root, cache_dir)
