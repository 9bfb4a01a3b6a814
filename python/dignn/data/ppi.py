"""PPI (protein-protein interaction graphs, Zitnik & Leskovec 2017) for multi-label node
classification across graphs: the paper's appendix "Semi-supervised node classification on
homophilic graphs", table tab:tab4 (micro-F1), with GraphSAGE's split of 20 training, 2
validation and 2 test graphs, as PyG's ``PPI(root, split="train"|"val"|"test")`` reads it.

Each node has 50 features and 121 binary labels (gene ontology sets). The task is inductive:
the model never sees the validation and test graphs while it trains.
"""
from __future__ import annotations

from pathlib import Path
from typing import List

from .core import InductiveDataset, Split
from .storage import DatasetUnavailableError, RawFiles, load_staged

__all__ = ["InductiveDataset", "PPI_URL", "PPI_RAW_FILES", "load_ppi"]

# PyG's PPI.url: the zip holds the twelve raw files below, unzipped into <root>/ppi/raw.
PPI_URL = "https://data.dgl.ai/dataset/ppi.zip"
# PyG's PPI.raw_file_names: for each of the three splits the node features, the graph id of
# each node, the networkx node-link JSON of the split's graphs and the node labels.
PPI_RAW_FILES = tuple(f"{split}_{part}" for split in ("train", "valid", "test")
                      for part in ("feats.npy", "graph_id.npy", "graph.json", "labels.npy"))


def raw_files() -> List[RawFiles]:
    """The twelve files ``PPI(root)`` reads from ``ppi/raw`` and the zip they come in."""
    return [RawFiles("ppi/raw", PPI_RAW_FILES, f"{PPI_URL} (unzipped)")]


def load_ppi(data_root=None, cache_dir=None) -> InductiveDataset:
    """PPI from ``<data_root>/ppi/raw/`` (the twelve files of :data:`PPI_RAW_FILES`), copied
    into ``<cache>/ppi/raw`` where PyG's ``PPI`` writes ``processed/``; PyG downloads
    :data:`PPI_URL` when they are absent. Without the files and without network:
    :class:`DatasetUnavailableError` naming every file, its folder and the URL."""
    import torch
    from torch_geometric.datasets import PPI

    def construct(cache: Path):
        return [list(PPI(str(cache / "ppi"), split=s)) for s in ("train", "val", "test")]
    parts = load_staged("ppi", data_root, cache_dir, raw_files(), construct)
    graphs = [g for part in parts for g in part]
    ends = torch.tensor([len(p) for p in parts]).cumsum(0).tolist()
    split = Split(torch.arange(0, ends[0]), torch.arange(ends[0], ends[1]),
                  torch.arange(ends[1], ends[2]))
    if not all(split.sizes()):
        raise DatasetUnavailableError(f"dataset 'ppi': the raw files in ppi/raw "
                                      f"hold {split.sizes()} train/validation/test graphs; "
                                      f"each split needs at least one")
    num_labels = graphs[0].y.size(1)
    n_train, n_val, n_test = split.sizes()
    return InductiveDataset(
        "ppi", graphs, graphs[0].x.size(1), num_labels, [split],
        f"PPI (GraphSAGE's split: {n_train} train / {n_val} validation / {n_test} test graphs, "
        f"{num_labels} labels per node, micro-F1)")
