"""Datasets of the paper's experiments, loaded through PyTorch Geometric, plus two generated
graphs that need no files.

Every loader returns a :class:`NodeDataset` (one graph, node labels, a list of splits) or a
:class:`GraphDataset` (many graphs, graph labels, a list of folds); :func:`load_dataset` picks
by name:

- ``csbm`` (the default; node task): generated contextual stochastic block model, 10 seeded
  60/20/20 splits.
- ``penn94-synthetic`` (node): generated graph of Penn94's shape, 10 seeded 50/25/25 splits.
- ``cora`` (node): ``Planetoid(root, "Cora", split="geom-gcn")``, the 10 Geom-GCN splits.
- ``chameleon`` (node): the heterophilous-graphs npz (``chameleon/raw/chameleon.npz``, the
  format of ``HeterophilousGraphDataset``), undirected, 10 splits stored in the file.
- ``chameleon-directed`` (node): ``WikipediaNetwork(root, "chameleon",
  geom_gcn_preprocess=True)``, the Geom-GCN release with directed links, 10 Geom-GCN splits.
- ``amherst41``, ``cornell5`` (node): ``LINKXDataset(root, name)``, 10 seeded random
  50/25/25 splits of the labeled nodes.
- ``penn94`` (node): ``LINKXDataset(root, "penn94")``, its 5 fixed splits.
- ``mutag`` (graph): ``TUDataset(root, "MUTAG")``, stratified 10-fold cross-validation.

Data root and cache. Raw files are looked for under ``data_root`` (default ``$DIGNN_DATA``,
else the cache) in PyG's layout ``<root>/<name>/raw/...``. The data root is only ever read:
PyG writes ``processed/`` files, so the needed raw files are first copied into the cache
(``cache_dir``, default ``$DIGNN_CACHE`` or ``~/.cache/dignn``) and PyG runs there. With no raw
files anywhere, PyG's normal download fills the cache.

Seeds (fixed, so that every run sees the same splits): the LINKX-style random splits of
amherst41/cornell5 and the generated graphs use ``torch.Generator().manual_seed(k)`` for split
``k``, over the labeled nodes only (label -1 = unlabeled), 50/25/25 as in LINKX; MUTAG's folds
are stratified by class with seed 0 (fold ``k`` is the test set, fold ``k + 1 mod 10`` the
validation set, the other eight train).
"""
from __future__ import annotations

from typing import Optional, Union

from ..catalog import DATASETS
from .core import (GraphDataset, NodeDataset, Split, edge_homophily, mask_splits,
                   random_splits, row_normalize, sparse_features, stratified_folds)
from .generated import csbm, penn94_synthetic
from .storage import (DatasetUnavailableError, PathLike, default_cache_dir,
                      default_data_root)
from . import pyg as _pyg
from .custom import UserDataError, from_pyg, load_user_file  # graphs users bring

__all__ = [
    "NodeDataset", "GraphDataset", "Split", "DATASETS", "DatasetUnavailableError",
    "load_dataset", "default_data_root", "default_cache_dir", "csbm", "penn94_synthetic",
    "random_splits", "stratified_folds", "edge_homophily",
]
__all__ += ["UserDataError", "from_pyg", "load_user_file"]


def load_dataset(name: str = "csbm", data_root: Optional[PathLike] = None,
                 cache_dir: Optional[PathLike] = None, **generator_kwargs
                 ) -> Union[NodeDataset, GraphDataset]:
    """Loads a dataset by name (see the module docstring). ``generator_kwargs`` go to the
    generators of ``csbm`` and ``penn94-synthetic`` (e.g. ``homophily=0.3``)."""
    key = name.lower().replace("_", "-")
    if key not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; choose one of {sorted(DATASETS)}")
    if generator_kwargs and key not in ("csbm", "penn94-synthetic"):
        raise ValueError(f"dataset {name!r} takes no generator options, got "
                         f"{sorted(generator_kwargs)}")
    if key == "csbm":
        return csbm(**generator_kwargs)
    if key == "penn94-synthetic":
        return penn94_synthetic(**generator_kwargs)
    if key == "cora":
        return _pyg._cora(data_root, cache_dir)
    if key == "chameleon":
        return _pyg._heterophilous_npz("chameleon", data_root, cache_dir)
    if key == "chameleon-directed":
        return _pyg._chameleon_directed(data_root, cache_dir)
    if key in ("amherst41", "cornell5", "penn94"):
        return _pyg._linkx(key, data_root, cache_dir)
    return _pyg._mutag(data_root, cache_dir)
