"""The citation graphs Cora, CiteSeer and PubMed through PyG's ``Planetoid`` class, with the
10 Geom-GCN splits the paper uses (appendix "Semi-supervised node classification on
homophilic graphs": the standard splits of Geom-GCN)."""
from __future__ import annotations

from typing import List

from .core import NodeDataset, mask_splits, row_normalize
from .storage import RawFiles, load_staged

__all__ = ["PYG_NAMES", "raw_files", "load"]

# dignn's name -> Planetoid's name
PYG_NAMES = {"cora": "Cora", "citeseer": "CiteSeer", "pubmed": "PubMed"}

_IND_PARTS = ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")


def raw_files(name: str) -> List[RawFiles]:
    """What ``Planetoid(root, <name>, split="geom-gcn")`` reads: the 8 ``ind.<name>.*`` files
    of the Planetoid release and the 10 Geom-GCN split files, all in
    ``<Name>/geom-gcn/raw``."""
    from torch_geometric.datasets import Planetoid
    folder = f"{PYG_NAMES[name]}/geom-gcn/raw"
    return [RawFiles(folder, tuple(f"ind.{name}.{part}" for part in _IND_PARTS),
                     f"{Planetoid.url}/<file>"),
            RawFiles(folder, tuple(f"{name}_split_0.6_0.2_{k}.npz" for k in range(10)),
                     f"{Planetoid.geom_gcn_url}/splits/<file>")]


def load(name: str, data_root, cache_dir) -> NodeDataset:
    """``Planetoid(root, <Name>, split="geom-gcn")``: the 10 Geom-GCN splits, features
    row-normalized (as the paper's authors do)."""
    from torch_geometric.datasets import Planetoid
    pyg = PYG_NAMES[name]
    ds = load_staged(name, data_root, cache_dir, raw_files(name),
                     lambda cache: Planetoid(str(cache), pyg, split="geom-gcn"))
    data = ds[0]
    splits = mask_splits(data.train_mask, data.val_mask, data.test_mask)
    return NodeDataset(name, row_normalize(data.x), data.y.long(), data.edge_index,
                       ds.num_classes, splits,
                       f"{pyg} (Planetoid(root, {pyg!r}, split='geom-gcn'): "
                       f"{len(splits)} fixed Geom-GCN splits, row-normalized features)")
