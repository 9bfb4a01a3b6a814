"""The graph classification benchmarks of the paper (appendix "Graph classification": MUTAG,
PTC, PROTEINS, NCI1, IMDB-BINARY, IMDB-MULTI) through PyG's ``TUDataset``."""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Tuple

from .core import GraphDataset, stratified_folds
from .storage import RawFiles, load_staged, require_complete

__all__ = ["PYG_NAMES", "raw_files", "load"]

# dignn's name -> TUDataset's name
PYG_NAMES = {"mutag": "MUTAG", "ptc-mr": "PTC_MR", "proteins": "PROTEINS", "nci1": "NCI1",
             "imdb-binary": "IMDB-BINARY", "imdb-multi": "IMDB-MULTI"}

# The files of each release the loader needs (besides <NAME>_A.txt and
# <NAME>_graph_indicator.txt, which every release has). The social graphs have no node labels.
_NEEDED: Dict[str, Tuple[str, ...]] = {
    "MUTAG": ("graph_labels", "node_labels"), "PTC_MR": ("graph_labels", "node_labels"),
    "PROTEINS": ("graph_labels", "node_labels"), "NCI1": ("graph_labels", "node_labels"),
    "IMDB-BINARY": ("graph_labels",), "IMDB-MULTI": ("graph_labels",),
}


def raw_files(name: str) -> List[RawFiles]:
    """The text files of the TU release that ``TUDataset(root, <NAME>)`` reads from
    ``<NAME>/raw`` (PyG downloads the release's zip and unpacks it there)."""
    from torch_geometric.datasets import TUDataset
    pyg = PYG_NAMES[name]
    parts = ("A", "graph_indicator") + _NEEDED[pyg]
    return [RawFiles(f"{pyg}/raw", tuple(f"{pyg}_{p}.txt" for p in parts),
                     f"{TUDataset.url}/{pyg}.zip (unpacked)")]


def _max_degree(graphs) -> int:
    from torch_geometric.utils import degree
    return max((int(degree(g.edge_index[0], g.num_nodes).max()) for g in graphs
                if g.num_nodes), default=0)


def load(name: str, data_root, cache_dir) -> GraphDataset:
    """``TUDataset(root, <NAME>)``: node features are the one-hot node labels (node
    attributes, such as PROTEINS', are left out as TUDataset does by default); the IMDB
    graphs have none, so their features are one-hot node degrees as in GIN's protocol
    (``OneHotDegree(max_degree)`` with the largest degree of the dataset). Folds: stratified
    10-fold cross-validation, seed 0 (:func:`stratified_folds`)."""
    from torch_geometric.datasets import TUDataset
    from torch_geometric.transforms import OneHotDegree
    pyg = PYG_NAMES[name]
    raw = raw_files(name)

    def construct(cache: Path):
        if not (cache / pyg / "processed" / "data.pt").exists():
            # TUDataset checks only the A and graph_indicator files before processing
            require_complete(name, data_root, cache_dir, raw)
        return TUDataset(str(cache), pyg)

    ds = load_staged(name, data_root, cache_dir, raw, construct)
    if "node_labels" in _NEEDED[pyg]:
        features = f"{ds.num_features} one-hot node labels"
    else:
        max_degree = _max_degree(ds)
        ds.transform = OneHotDegree(max_degree)
        features = (f"no node features: one-hot degrees, OneHotDegree({max_degree}), "
                    f"{max_degree + 1} columns")
    y = ds.y.long()
    folds = stratified_folds(y)
    return GraphDataset(name, ds, ds.num_features, ds.num_classes, folds,
                        f"{pyg} (TUDataset(root, {pyg!r}), {len(ds)} graphs, {features}; "
                        f"stratified {len(folds)}-fold CV, seed 0)")
