"""dignn.data: generated graphs, split helpers, and the real loaders on the shared datasets
(copied into a temporary cache; the data root is never written)."""
import urllib.error

import pytest
import torch

from conftest import DATA_ROOT
from dignn import data as dd
from dignn.catalog import NUM_SPLITS


def _disjoint(split, n):
    parts = [split.train, split.val, split.test]
    seen = torch.cat(parts)
    return seen.unique().numel() == seen.numel() and int(seen.max()) < n


@pytest.mark.parametrize("homophily", [0.1, 0.5, 0.9])
def test_csbm_homophily_knob(homophily):
    g = dd.csbm(num_nodes=600, num_classes=3, avg_degree=12, homophily=homophily)
    measured = dd.edge_homophily(g.edge_index, g.y)
    assert abs(measured - homophily) < 0.05
    ei = g.edge_index
    assert (ei[0] != ei[1]).all()  # no self-loops
    assert g.edge_index.size(1) == 2 * 3600  # avg_degree * n / 2 undirected pairs, both ways
    reverse = torch.sort(ei[1] * 600 + ei[0]).values
    assert torch.equal(torch.sort(ei[0] * 600 + ei[1]).values, reverse)  # symmetric
    assert torch.bincount(g.y).tolist() == [200, 200, 200]


def test_csbm_is_deterministic_and_seeded():
    a, b = dd.csbm(num_nodes=200, seed=3), dd.csbm(num_nodes=200, seed=3)
    assert torch.equal(a.edge_index, b.edge_index) and torch.equal(a.x, b.x)
    c = dd.csbm(num_nodes=200, seed=4)
    assert not torch.equal(a.edge_index, c.edge_index)
    assert len(a.splits) == 10
    for s in a.splits:
        assert _disjoint(s, 200)
        assert s.sizes() == (120, 40, 40)


@pytest.mark.parametrize("kwargs, match", [
    (dict(homophily=1.5), "homophily"), (dict(num_classes=1), "num_classes"),
    (dict(num_nodes=10, num_classes=4), "num_nodes")])
def test_csbm_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        dd.csbm(**kwargs)


def test_random_splits_use_labeled_nodes_only():
    y = torch.tensor([0, 1, -1, 1, 0, -1, 1, 0, 0, 1, -1, 0])
    splits = dd.random_splits(y, num_splits=3)
    labeled = set(torch.nonzero(y >= 0).flatten().tolist())
    for s in splits:
        assert _disjoint(s, y.numel())
        assert set(torch.cat([s.train, s.val, s.test]).tolist()) == labeled
        assert s.sizes() == (4, 2, 3)  # int(9 * .5), int(9 * .25), rest
    assert not torch.equal(splits[0].train, splits[1].train)
    again = dd.random_splits(y, num_splits=3)
    assert all(torch.equal(a.test, b.test) for a, b in zip(splits, again))


def test_stratified_folds():
    y = torch.tensor([0] * 30 + [1] * 10)
    folds = dd.stratified_folds(y, num_folds=10, seed=0)
    tests = torch.cat([f.test for f in folds])
    assert sorted(tests.tolist()) == list(range(40))  # every item tested exactly once
    for k, f in enumerate(folds):
        assert _disjoint(f, 40)
        assert torch.bincount(y[f.test], minlength=2).tolist() == [3, 1]  # stratified
        assert torch.equal(f.val, folds[(k + 1) % 10].test)
        assert f.train.numel() == 32


def test_penn94_synthetic_small():
    g = dd.penn94_synthetic(num_nodes=3000, num_edges=30000, num_features=8, num_splits=2)
    assert g.num_nodes == 3000 and g.edge_index.size(1) == 60000
    assert set(g.y.unique().tolist()) == {-1, 0, 1}
    assert 0.05 < float((g.y == -1).float().mean()) < 0.15
    assert 0.4 < float((g.y == 1).sum() / (g.y >= 0).sum()) < 0.6
    assert abs(dd.edge_homophily(g.edge_index, g.y) - 0.5) < 0.1  # like facebook100 gender
    for s in g.splits:
        assert (g.y[torch.cat([s.train, s.val, s.test])] >= 0).all()


def test_unknown_dataset():
    with pytest.raises(ValueError, match="unknown dataset"):
        dd.load_dataset("citeseer2")
    with pytest.raises(ValueError, match="no generator options"):
        dd.load_dataset("cora", homophily=0.5)


def test_missing_data_root_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="data_root .* was given but does not exist"):
        dd.load_dataset("cora", tmp_path / "nope", tmp_path / "cache")


def _refuse_downloads(monkeypatch):
    import importlib
    import torch_geometric.data
    import torch_geometric.io.fs

    def offline(*args, **kwargs):
        raise urllib.error.URLError("network unreachable")
    monkeypatch.setattr(torch_geometric.data, "download_url", offline)
    monkeypatch.setattr(torch_geometric.io.fs, "cp", offline)
    monkeypatch.setattr(importlib.import_module("torch_geometric.datasets.linkx_dataset"),
                        "download_url", offline)


def test_offline_without_files_is_a_clear_error(tmp_path, monkeypatch):
    _refuse_downloads(monkeypatch)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(dd.DatasetUnavailableError, match="--data-root") as err:
        dd.load_dataset("chameleon", empty, tmp_path / "cache")
    assert "chameleon/raw/: chameleon.npz" in str(err.value)


# ------------------------------------------------------------ real data (if present) --

needs_data = pytest.mark.skipif(not (DATA_ROOT / "Cora").exists(),
                                reason=f"shared datasets not found at {DATA_ROOT}")


def _snapshot(root):
    return sorted((str(p), p.stat().st_size) for p in root.rglob("*"))


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("dignn_cache")


@needs_data
def test_cora(cache):
    before = _snapshot(DATA_ROOT / "Cora")
    g = dd.load_dataset("cora", DATA_ROOT, cache)
    assert _snapshot(DATA_ROOT / "Cora") == before  # the data root is never written
    assert (cache / "Cora" / "geom-gcn" / "processed").exists()
    assert (g.num_nodes, g.num_features, g.num_classes) == (2708, 1433, 7)
    assert g.edge_index.size(1) == 10556 and len(g.splits) == 10
    torch.testing.assert_close(g.x.sum(1), torch.ones(2708))  # row-normalized
    for s in g.splits:
        assert _disjoint(s, 2708)
        assert s.sizes() == (1192, 796, 497)  # Geom-GCN's Cora splits
    assert len(g.splits) == NUM_SPLITS["cora"]  # what `dignn train --splits` is checked by
    assert repr(g) == ("NodeDataset('cora', x=[2708, 1433], y=[2708], edge_index=[2, 10556], "
                       "num_classes=7, splits=10 x (train 1192, val 796, test 497))")


@needs_data
def test_chameleon(cache):
    g = dd.load_dataset("chameleon", DATA_ROOT, cache)
    assert (g.num_nodes, g.num_features, g.num_classes) == (2277, 2325, 5)
    assert g.edge_index.size(1) == 2 * 31371  # undirected pairs, both directions
    assert [s.sizes() for s in g.splits] == [(1092, 729, 456)] * 10
    assert dd.edge_homophily(g.edge_index, g.y) < 0.3  # heterophilous
    assert len(g.splits) == NUM_SPLITS["chameleon"]


@needs_data
def test_amherst41(cache):
    g = dd.load_dataset("amherst41", DATA_ROOT, cache)
    assert (g.num_nodes, g.num_features, g.num_classes) == (2235, 1193, 2)
    assert g.edge_index.size(1) == 181908
    assert not g.x.layout == torch.strided  # one-hot features kept sparse
    labeled = int((g.y >= 0).sum())
    assert len(g.splits) == NUM_SPLITS["amherst41"]
    assert repr(g).startswith("NodeDataset('amherst41', x=[2235, 1193] (sparse), ")
    for s in g.splits:
        assert _disjoint(s, 2235)
        assert s.train.numel() == labeled // 2
        assert (g.y[torch.cat([s.train, s.val, s.test])] >= 0).all()


@needs_data
@pytest.mark.slow  # about 4 s: PyG builds cornell5's dense one-hot features (18,660 x 4,735)
def test_cornell5(cache):
    g = dd.load_dataset("cornell5", DATA_ROOT, cache)
    assert (g.num_nodes, g.num_features, g.num_classes) == (18660, 4735, 2)
    assert g.edge_index.size(1) == 1581554 and len(g.splits) == 10
    labeled = int((g.y >= 0).sum())
    assert [s.train.numel() for s in g.splits] == [labeled // 2] * 10


@needs_data
def test_chameleon_directed(cache):
    """The Geom-GCN link list with the npz: 36,101 directed links; made undirected, the npz's
    31,371 pairs plus 50 self-loops; features, labels and splits those of chameleon."""
    from torch_geometric.utils import remove_self_loops, to_undirected
    d = dd.load_dataset("chameleon-directed", DATA_ROOT, cache)
    u = dd.load_dataset("chameleon", DATA_ROOT, cache)
    assert d.num_nodes == 2277 and d.edge_index.size(1) == 36101
    assert len(d.splits) == NUM_SPLITS["chameleon-directed"]
    assert int((d.edge_index[0] == d.edge_index[1]).sum()) == 50
    undirected = to_undirected(d.edge_index)
    assert undirected.size(1) == 2 * 31371 + 50
    assert torch.equal(remove_self_loops(undirected)[0], to_undirected(u.edge_index))
    assert torch.equal(d.x, u.x) and torch.equal(d.y, u.y)
    for a, b in zip(d.splits, u.splits):
        assert all(torch.equal(p, q) for p, q in zip((a.train, a.val, a.test),
                                                     (b.train, b.val, b.test)))


@needs_data
def test_penn94_without_its_graph_file_names_what_is_missing(tmp_path, monkeypatch):
    """The shared folder has Penn94's split file but not Penn94.mat."""
    _refuse_downloads(monkeypatch)
    with pytest.raises(dd.DatasetUnavailableError) as err:
        dd.load_dataset("penn94", DATA_ROOT, tmp_path / "cache")
    assert "missing from the cache: penn94/raw/data.mat" in str(err.value)
    assert "Penn94.mat (saved as data.mat)" in str(err.value)


@needs_data
def test_nci1(cache):
    g = dd.load_dataset("nci1", DATA_ROOT, cache)
    assert g.task == "graph" and len(g.graphs) == 4110
    assert len(g.splits) == NUM_SPLITS["nci1"]
    assert (g.num_features, g.num_classes) == (37, 2)
    assert sum(graph.edge_index.size(1) for graph in g.graphs) == 265506
    assert sorted(torch.cat([s.test for s in g.splits]).tolist()) == list(range(4110))


@needs_data
def test_mutag(cache):
    g = dd.load_dataset("mutag", DATA_ROOT, cache)
    assert g.task == "graph" and len(g.graphs) == 188
    assert (g.num_features, g.num_classes) == (7, 2)
    assert len(g.splits) == NUM_SPLITS["mutag"]
    assert repr(g) == ("GraphDataset('mutag', graphs=188, num_features=7, num_classes=2, "
                       "splits=10 x (~train 150, val 19, test 19))")  # not 188 Data objects
    assert sorted(torch.cat([s.test for s in g.splits]).tolist()) == list(range(188))
