"""The facebook100 graphs of LINKX through PyG's ``LINKXDataset``: node = student, label =
gender (-1 = unlabeled), features = one-hot encodings of the other profile fields."""
from __future__ import annotations

from typing import List

from .core import NodeDataset, mask_splits, random_splits, sparse_features
from .storage import RawFiles, load_staged

__all__ = ["NAMES", "raw_files", "load"]

# Every facebook100 graph LINKXDataset knows; penn94 ships with 5 fixed splits.
NAMES = ("penn94", "amherst41", "cornell5", "johnshopkins55", "reed98")


def raw_files(name: str) -> List[RawFiles]:
    """What ``LINKXDataset(root, name)`` reads from ``<name>/raw``: ``data.mat`` (and, for
    penn94, its split file)."""
    from torch_geometric.datasets import LINKXDataset
    folder = f"{name}/raw"
    files = [RawFiles(folder, (filename,), url)
             for filename, url in LINKXDataset.datasets[name].items()]
    if name in LINKXDataset.splits:
        url = LINKXDataset.splits[name]
        files.append(RawFiles(folder, (url.split("/")[-1],), url))
    return files


def load(name: str, data_root, cache_dir, num_splits: int = 10) -> NodeDataset:
    """``LINKXDataset(root, name)``: penn94 with its 5 fixed splits, the others with
    ``num_splits`` seeded random 50/25/25 splits of the labeled nodes (as LINKX does); the
    one-hot features are kept sparse."""
    from torch_geometric.datasets import LINKXDataset
    ds = load_staged(name, data_root, cache_dir, raw_files(name),
                     lambda cache: LINKXDataset(str(cache), name))
    data = ds[0]
    y = data.y.long()
    if "train_mask" in data:
        splits = mask_splits(data.train_mask, data.val_mask, data.test_mask)
        how = f"its {len(splits)} fixed LINKX splits"
    else:
        splits = random_splits(y, num_splits)
        how = f"{num_splits} seeded random 50/25/25 splits of the labeled nodes"
    return NodeDataset(name, sparse_features(data.x), y, data.edge_index, int(y.max()) + 1,
                       splits, f"{name} (LINKXDataset(root, {name!r}), facebook100: "
                               f"{data.x.size(1)} one-hot features (sparse), gender labels, "
                               f"{how})")
