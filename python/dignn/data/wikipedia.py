"""The Wikipedia graphs Chameleon and Squirrel, in two releases:

- ``chameleon``, ``squirrel``: the heterophilous-graphs npz (the format of PyG's
  ``HeterophilousGraphDataset``, which only accepts its own five names, so the npz is read
  here), undirected, with the 10 splits stored in the file;
- ``chameleon-directed``, ``squirrel-directed``: the Geom-GCN release through PyG's
  ``WikipediaNetwork(root, name, geom_gcn_preprocess=True)``, with directed hyperlinks and
  the 10 Geom-GCN splits (what the paper's authors train on)."""
from __future__ import annotations

from pathlib import Path
from typing import List

import numpy as np
import torch

from .core import NodeDataset, mask_splits, row_normalize
from .storage import RawFiles, load_staged

__all__ = ["NAMES", "npz_raw_files", "geom_gcn_raw_files", "load_npz", "load_directed"]

NAMES = ("chameleon", "squirrel")


def npz_raw_files(name: str) -> List[RawFiles]:
    """The heterophilous-graphs npz, ``<name>/raw/<name>.npz``."""
    from torch_geometric.datasets import HeterophilousGraphDataset
    return [RawFiles(f"{name}/raw", (f"{name}.npz",),
                     f"{HeterophilousGraphDataset.url}/{name}.npz")]


def geom_gcn_raw_files(name: str) -> List[RawFiles]:
    """What ``WikipediaNetwork(root, name, geom_gcn_preprocess=True)`` reads from
    ``<name>/geom_gcn/raw``: the node file, the link list and 10 split files."""
    from torch_geometric.datasets import WikipediaNetwork
    folder = f"{name}/geom_gcn/raw"
    base = WikipediaNetwork.processed_url
    return [RawFiles(folder, ("out1_node_feature_label.txt", "out1_graph_edges.txt"),
                     f"{base}/new_data/{name}/<file>"),
            RawFiles(folder, tuple(f"{name}_split_0.6_0.2_{k}.npz" for k in range(10)),
                     f"{base}/splits/<file>")]


def _read_npz(name: str, path: Path) -> NodeDataset:
    from torch_geometric.utils import to_undirected
    raw = np.load(path)
    x = row_normalize(torch.from_numpy(raw["node_features"]))
    y = torch.from_numpy(raw["node_labels"]).long()
    edge_index = to_undirected(torch.from_numpy(raw["edges"]).t().long().contiguous(),
                               num_nodes=x.size(0))
    masks = [torch.from_numpy(raw[k]).t().contiguous() for k in
             ("train_masks", "val_masks", "test_masks")]
    splits = mask_splits(*masks)
    return NodeDataset(name, x, y, edge_index, int(y.max()) + 1, splits,
                       f"{name} (heterophilous-graphs npz, undirected edges, {len(splits)} "
                       f"fixed splits from the file, row-normalized features)")


def load_npz(name: str, data_root, cache_dir) -> NodeDataset:
    """The heterophilous-graphs npz (keys node_features, node_labels, edges,
    train/val/test_masks), read as PyG's HeterophilousGraphDataset reads it (edges made
    undirected), downloaded with PyG's ``download_url`` when missing."""
    raw = npz_raw_files(name)

    def construct(cache: Path) -> NodeDataset:
        from torch_geometric.data import download_url
        path = cache / raw[0].folder / raw[0].names[0]
        if not path.exists():
            download_url(raw[0].url, str(path.parent))
        return _read_npz(name, path)

    return load_staged(name, data_root, cache_dir, raw, construct)


def _read_link_list(path: Path) -> torch.Tensor:
    """Geom-GCN's ``out1_graph_edges.txt``: a header line, then ``source<TAB>target`` rows;
    returned as a coalesced [2, E] tensor, as PyG's WikipediaNetwork reads it."""
    from torch_geometric.utils import coalesce
    rows = path.read_text().split("\n")[1:]
    pairs = [[int(v) for v in r.split("\t")] for r in rows if r.strip()]
    return coalesce(torch.tensor(pairs, dtype=torch.long).t().contiguous())


def load_directed(name: str, data_root, cache_dir) -> NodeDataset:
    """``<base>-directed``: the Geom-GCN release as PyG's ``WikipediaNetwork(root, base,
    geom_gcn_preprocess=True)`` stores it, with *directed* hyperlinks (chameleon: 36,101),
    which is what the paper's authors train on; the heterophilous-graphs npz behind ``<base>``
    keeps only the undirected pairs (chameleon: 31,371). Edges are flipped so that, as in the
    authors' code, each page aggregates over the pages it links to (PyG's flow aggregates at
    ``edge_index[1]``).

    The release's folder may be spelled ``<base>/geom_gcn/raw`` (PyG) or
    ``<base>/geom-gcn/raw`` (Planetoid's spelling) under the data root. Offline, when the
    release's node file is missing but its link list ``out1_graph_edges.txt`` and the npz
    ``<base>/raw/<base>.npz`` are there, features, labels and the 10 splits come from the npz
    (the same features, the same node order, splits identical to Geom-GCN's) and the links
    from the list."""
    from torch_geometric.datasets import WikipediaNetwork
    base = name[:-len("-directed")]
    raw = geom_gcn_raw_files(base)
    folder = raw[0].folder
    npz = npz_raw_files(base)[0]

    def construct(cache: Path) -> NodeDataset:
        links = cache / folder / "out1_graph_edges.txt"
        npz_path = cache / npz.folder / npz.names[0]
        if (not (cache / folder / "out1_node_feature_label.txt").exists() and links.exists()
                and npz_path.exists()):
            undirected = _read_npz(base, npz_path)
            edge_index = _read_link_list(links)
            if int(edge_index.max()) >= undirected.num_nodes:
                raise ValueError(f"{links} names node {int(edge_index.max())}, but "
                                 f"{npz_path} has {undirected.num_nodes} nodes: the two files "
                                 f"are not the same release")
            return NodeDataset(name, undirected.x, undirected.y, edge_index.flip(0),
                               undirected.num_classes, undirected.splits,
                               f"{base} (Geom-GCN's {edge_index.size(1)} directed links from "
                               f"out1_graph_edges.txt, features and {len(undirected.splits)} "
                               f"fixed splits from the heterophilous-graphs npz, "
                               f"row-normalized features)")
        ds = WikipediaNetwork(str(cache), base, geom_gcn_preprocess=True)
        data = ds[0]
        splits = mask_splits(data.train_mask, data.val_mask, data.test_mask)
        y = data.y.long()
        return NodeDataset(name, row_normalize(data.x), y, data.edge_index.flip(0),
                           int(y.max()) + 1, splits,
                           f"{base} (WikipediaNetwork(root, {base!r}, geom_gcn_preprocess="
                           f"True): Geom-GCN release, {data.edge_index.size(1)} directed "
                           f"links, {len(splits)} fixed Geom-GCN splits, row-normalized "
                           f"features)")

    note = (f"Offline alternative: {npz.folder}/{npz.names[0]} together with the link list "
            f"{folder}/out1_graph_edges.txt (or {base}/geom-gcn/raw/out1_graph_edges.txt); "
            f"features, labels and splits then come from the npz.")
    return load_staged(name, data_root, cache_dir, raw, construct,
                       also_stage=[(f"{base}/geom-gcn/raw", folder), npz.folder],
                       offline_note=note)
