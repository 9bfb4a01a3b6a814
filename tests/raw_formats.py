"""Writers of SMALL generated datasets in each raw format a dignn loader reads, laid out as PyG
expects them under a data root (``<root>/<name>/raw/...``), for the formats the shared data
folder lacks (and, the writers being per format, for the others too).

Each writer returns a :class:`Written`: the files it wrote (relative to the root) and the
ground truth a loader must reproduce (features, labels, edges, splits)."""
from __future__ import annotations

import collections
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np
import scipy.io
import scipy.sparse as sp


@dataclass
class Written:
    root: Path
    files: List[str]  # relative to root
    truth: Dict = field(default_factory=dict)


def _rng(name: str, seed: int) -> np.random.Generator:
    return np.random.default_rng([seed] + [ord(c) for c in name])


def _symmetric_pairs(rng, n: int, num_pairs: int, isolated=()) -> np.ndarray:
    """``num_pairs`` distinct undirected pairs (u < v) among the nodes not in ``isolated``."""
    nodes = np.array([i for i in range(n) if i not in set(isolated)])
    pairs = set()
    while len(pairs) < num_pairs:
        u, v = rng.choice(nodes, 2, replace=False)
        pairs.add((min(u, v), max(u, v)))
    return np.array(sorted(pairs), dtype=np.int64)


def _masks(rng, n: int, num_splits: int = 10, shares=(0.6, 0.2)) -> List[Tuple[np.ndarray, ...]]:
    """``num_splits`` random (train, val, test) boolean masks of n nodes."""
    out = []
    for _ in range(num_splits):
        perm = rng.permutation(n)
        a, b = int(n * shares[0]), int(n * (shares[0] + shares[1]))
        masks = [np.zeros(n, dtype=bool) for _ in range(3)]
        for m, part in zip(masks, (perm[:a], perm[a:b], perm[b:])):
            m[part] = True
        out.append(tuple(masks))
    return out


def _files(root: Path, folder: Path) -> List[str]:
    return sorted(str(p.relative_to(root)) for p in folder.rglob("*") if p.is_file())


# ----------------------------------------------------------------------------- Planetoid --

def write_planetoid(root, name: str, num_nodes: int = 560, num_features: int = 12,
                    num_classes: int = 3, seed: int = 0) -> Written:
    """``<Name>/geom-gcn/raw``: Planetoid's 8 pickled ``ind.<name>.*`` files (sparse features
    x/tx/allx, one-hot labels y/ty/ally, the adjacency dict ``graph``, the ``test.index`` text
    file; the test rows stored in shuffled index order as in the release) and 10 Geom-GCN
    split files ``<name>_split_0.6_0.2_<k>.npz``. For ``citeseer`` one index in the test range
    is left out of test.index: an isolated node with no features, as the real CiteSeer has
    (PyG gives it zero features and label 0). PyG's reader takes the 500 nodes after the
    labeled ones of ``y`` as its public validation set, so ``num_nodes`` must exceed 540."""
    pyg = {"cora": "Cora", "citeseer": "CiteSeer", "pubmed": "PubMed"}[name]
    root = Path(root)
    raw = root / pyg / "geom-gcn" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    rng = _rng(name, seed)
    n, n_all, n_train = num_nodes, num_nodes - 30, 20
    x = (rng.random((n, num_features)) < 0.3).astype(np.float32)
    x[np.arange(n), rng.integers(0, num_features, n)] = 1.0  # no empty rows
    y = rng.integers(0, num_classes, n)
    test_index = np.arange(n_all, n)
    isolated: Tuple[int, ...] = ()
    if name == "citeseer":
        gap = n_all + (n - n_all) // 2
        test_index = test_index[test_index != gap]
        x[gap], y[gap], isolated = 0.0, 0, (gap,)
    file_order = rng.permutation(test_index)
    onehot = np.eye(num_classes, dtype=np.int64)
    pairs = _symmetric_pairs(rng, n, 2 * n, isolated)
    graph = collections.defaultdict(list)
    for u, v in pairs:
        graph[int(u)].append(int(v))
        graph[int(v)].append(int(u))
    for i in isolated:
        graph[i] = []
    parts = {"x": sp.csr_matrix(x[:n_train]), "tx": sp.csr_matrix(x[file_order]),
             "allx": sp.csr_matrix(x[:n_all]), "y": onehot[y[:n_train]],
             "ty": onehot[y[file_order]], "ally": onehot[y[:n_all]], "graph": graph}
    for part, obj in parts.items():
        with open(raw / f"ind.{name}.{part}", "wb") as f:
            pickle.dump(obj, f)
    (raw / f"ind.{name}.test.index").write_text("".join(f"{i}\n" for i in file_order))
    splits = _masks(rng, n)
    for k, (tr, va, te) in enumerate(splits):
        np.savez(raw / f"{name}_split_0.6_0.2_{k}.npz", train_mask=tr, val_mask=va,
                 test_mask=te)
    return Written(root, _files(root, raw), dict(x=x, y=y, pairs=pairs, splits=splits,
                                                 isolated=isolated))


# ------------------------------------------------------------------ Wikipedia (two forms) --

def wikipedia_graph(name: str, num_nodes: int = 30, num_features: int = 10,
                    num_classes: int = 5, seed: int = 0) -> Dict:
    """One small Wikipedia-like graph both releases are written from: directed links (some
    reciprocal, two self-loops), dense 0/1 features, labels and 10 splits."""
    rng = _rng(name, seed)
    n = num_nodes
    x = (rng.random((n, num_features)) < 0.4).astype(np.float32)
    x[np.arange(n), rng.integers(0, num_features, n)] = 1.0
    y = rng.integers(0, num_classes, n)
    pairs = _symmetric_pairs(rng, n, 3 * n)
    links = [tuple(p) if rng.random() < 0.5 else tuple(p[::-1]) for p in pairs]
    links += [tuple(p[::-1]) for p in pairs[::4]]  # a quarter of the pairs linked both ways
    links += [(3, 3), (7, 7)]
    return dict(x=x, y=y, links=np.array(sorted(set(links)), dtype=np.int64),
                pairs=pairs, splits=_masks(rng, n, shares=(0.48, 0.32)))


def write_heterophilous_npz(root, name: str, graph: Optional[Dict] = None) -> Written:
    """``<name>/raw/<name>.npz`` in the heterophilous-graphs format: node_features,
    node_labels, edges (each undirected pair once, no self-loops) and [10, n] boolean
    train/val/test_masks."""
    graph = graph or wikipedia_graph(name)
    root = Path(root)
    raw = root / name / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    masks = [np.stack([s[i] for s in graph["splits"]]) for i in range(3)]
    np.savez(raw / f"{name}.npz", node_features=graph["x"], node_labels=graph["y"],
             edges=graph["pairs"], train_masks=masks[0], val_masks=masks[1],
             test_masks=masks[2])
    return Written(root, _files(root, raw), graph)


def write_geom_gcn_wikipedia(root, name: str, graph: Optional[Dict] = None,
                             folder: str = "geom_gcn", links_only: bool = False) -> Written:
    """``<name>/<folder>/raw`` as the Geom-GCN release (PyG's WikipediaNetwork with
    geom_gcn_preprocess=True): ``out1_node_feature_label.txt`` (header, then
    ``id<TAB>f1,f2,...<TAB>label``), ``out1_graph_edges.txt`` (header, then
    ``source<TAB>target``) and 10 ``<name>_split_0.6_0.2_<k>.npz``; with ``links_only`` just
    the link list."""
    graph = graph or wikipedia_graph(name)
    root = Path(root)
    raw = root / name / folder / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    rows = ["node_id\tnode_id"] + [f"{u}\t{v}" for u, v in graph["links"]]
    (raw / "out1_graph_edges.txt").write_text("\n".join(rows) + "\n")
    if not links_only:
        rows = ["node_id\tfeature\tlabel"] + [
            f"{i}\t{','.join(str(int(v)) for v in graph['x'][i])}\t{graph['y'][i]}"
            for i in range(len(graph["y"]))]
        (raw / "out1_node_feature_label.txt").write_text("\n".join(rows) + "\n")
        for k, (tr, va, te) in enumerate(graph["splits"]):
            np.savez(raw / f"{name}_split_0.6_0.2_{k}.npz", train_mask=tr.astype(np.uint8),
                     val_mask=va.astype(np.uint8), test_mask=te.astype(np.uint8))
    return Written(root, _files(root, raw), graph)


# -------------------------------------------------------------------------------- LINKX --

def write_linkx_mat(root, name: str, num_nodes: int = 40, seed: int = 0,
                    num_fixed_splits: int = 0) -> Written:
    """``<name>/raw/data.mat`` as the facebook100 ``.mat`` files LINKXDataset reads: ``A``
    (sparse symmetric adjacency) and ``local_info`` (int [n, 7]: student/faculty, gender with
    0 = unknown, major, second major, dorm, year, high school). With ``num_fixed_splits``
    also penn94's split file ``fb100-Penn94-splits.npy`` (an object array of dicts with
    train/valid/test index arrays)."""
    root = Path(root)
    raw = root / name / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    rng = _rng(name, seed)
    n = num_nodes
    pairs = _symmetric_pairs(rng, n, 3 * n)
    a = sp.coo_matrix((np.ones(2 * len(pairs)), (np.r_[pairs[:, 0], pairs[:, 1]],
                                                  np.r_[pairs[:, 1], pairs[:, 0]])),
                      shape=(n, n)).tocsc()
    value_counts = [2, 3, 5, 4, 3, 4, 6]
    info = np.stack([rng.integers(0, c, n) for c in value_counts], axis=1).astype(np.float64)
    info[:4, 1] = [0, 1, 2, 1]  # gender: unknown, and both labels present
    scipy.io.savemat(raw / "data.mat", {"A": a, "local_info": info})
    y = info[:, 1].astype(np.int64) - 1
    width = sum(len(np.unique(info[:, c])) for c in range(7) if c != 1)
    splits = []
    if num_fixed_splits:
        labeled = np.nonzero(y >= 0)[0]
        for _ in range(num_fixed_splits):
            perm = rng.permutation(labeled)
            a_, b_ = len(perm) // 2, 3 * len(perm) // 4
            splits.append({"train": perm[:a_], "valid": perm[a_:b_], "test": perm[b_:]})
        np.save(raw / "fb100-Penn94-splits.npy", np.array(splits, dtype=object),
                allow_pickle=True)
    return Written(root, _files(root, raw), dict(y=y, pairs=pairs, feature_width=width,
                                                 splits=splits))


# ------------------------------------------------------------------------------- TU txt --

def write_tu(root, pyg_name: str, num_graphs: int = 24, num_classes: int = 2,
             node_label_values: int = 0, node_attributes: bool = False,
             edge_labels: bool = False, seed: int = 0) -> Written:
    """``<NAME>/raw`` as the TU graph kernel release: ``<NAME>_A.txt`` (1-based global node
    pairs ``u, v``, both directions), ``_graph_indicator.txt`` (a graph id per node),
    ``_graph_labels.txt`` (labels -1/1 for two classes, as MUTAG's release writes them, else
    1..C); ``_node_labels.txt`` when ``node_label_values`` > 0, ``_node_attributes.txt`` and
    ``_edge_labels.txt`` when asked. Graphs have 4-11 nodes, no self-loops; every class and
    node label value occurs."""
    root = Path(root)
    raw = root / pyg_name / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    rng = _rng(pyg_name, seed)
    edges, indicator, node_labels, graph_nodes, graph_pairs = [], [], [], [], []
    offset = 0
    for g in range(num_graphs):
        n = int(rng.integers(4, 12))
        pairs = _symmetric_pairs(rng, n, min(int(rng.integers(n - 1, 2 * n)),
                                             n * (n - 1) // 2))
        for u, v in pairs:
            edges += [(offset + u + 1, offset + v + 1), (offset + v + 1, offset + u + 1)]
        indicator += [g + 1] * n
        if node_label_values:
            node_labels += list(rng.integers(0, node_label_values, n))
        graph_nodes.append(n)
        graph_pairs.append(pairs)
        offset += n
    if node_label_values:
        node_labels[:node_label_values] = range(node_label_values)
    classes = np.arange(num_graphs) % num_classes
    rng.shuffle(classes)
    stored = np.where(classes == 0, -1, 1) if num_classes == 2 else classes + 1
    (raw / f"{pyg_name}_A.txt").write_text("".join(f"{u}, {v}\n" for u, v in edges))
    (raw / f"{pyg_name}_graph_indicator.txt").write_text("".join(f"{g}\n" for g in indicator))
    (raw / f"{pyg_name}_graph_labels.txt").write_text("".join(f"{c}\n" for c in stored))
    if node_label_values:
        (raw / f"{pyg_name}_node_labels.txt").write_text(
            "".join(f"{c}\n" for c in node_labels))
    if node_attributes:
        (raw / f"{pyg_name}_node_attributes.txt").write_text(
            "".join(f"{v:.3f}\n" for v in rng.random(offset)))
    if edge_labels:
        (raw / f"{pyg_name}_edge_labels.txt").write_text(
            "".join(f"{c}\n" for c in rng.integers(0, 3, len(edges))))
    return Written(root, _files(root, raw),
                   dict(num_nodes=graph_nodes, pairs=graph_pairs, y=classes,
                        node_labels=np.array(node_labels, dtype=np.int64)))


# The TU releases of the paper's graph datasets, as written by write_tu.
TU_RELEASES = {
    "mutag": dict(pyg_name="MUTAG", node_label_values=7, edge_labels=True),
    "ptc-mr": dict(pyg_name="PTC_MR", node_label_values=18, edge_labels=True),
    "proteins": dict(pyg_name="PROTEINS", node_label_values=3, node_attributes=True),
    "nci1": dict(pyg_name="NCI1", node_label_values=37),
    "imdb-binary": dict(pyg_name="IMDB-BINARY"),
    "imdb-multi": dict(pyg_name="IMDB-MULTI", num_classes=3),
}


def write_dataset(root, name: str) -> Written:
    """The fixture of dignn dataset ``name`` under ``root``, in the format its loader reads."""
    if name in ("cora", "citeseer", "pubmed"):
        return write_planetoid(root, name)
    if name in ("chameleon", "squirrel"):
        return write_heterophilous_npz(root, name)
    if name in ("chameleon-directed", "squirrel-directed"):
        return write_geom_gcn_wikipedia(root, name[:-len("-directed")])
    if name in ("penn94", "amherst41", "cornell5", "johnshopkins55", "reed98"):
        return write_linkx_mat(root, name, num_fixed_splits=5 if name == "penn94" else 0)
    if name in TU_RELEASES:
        return write_tu(root, **TU_RELEASES[name])
    if name == "ppi":
        from ppi_raw_format import write_ppi_raw
        write_ppi_raw(root)
        return Written(Path(root), _files(Path(root), Path(root) / "ppi" / "raw"))
    raise ValueError(f"no fixture writer for dataset {name!r}")
