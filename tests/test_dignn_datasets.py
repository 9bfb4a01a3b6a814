"""Every loader of dignn.data on small generated raw files (tests/raw_formats.py) with the
network refused: shapes, splits, features, the data root left unwritten, the offline error's
file names and URLs; and a preset for every dataset."""
import importlib
import urllib.error

import numpy as np
import pytest
import torch

import raw_formats as rf
from dignn import data as dd
from dignn.catalog import DATASETS
from dignn.presets import _GENERATED, preset_config


@pytest.fixture
def offline(monkeypatch):
    """PyG's downloaders refuse (as with no network) and record what was asked for."""
    attempts = []

    def refuse(url, *args, **kwargs):
        attempts.append(str(url))
        raise urllib.error.URLError("network unreachable (test)")
    import torch_geometric.data
    import torch_geometric.io.fs
    monkeypatch.setattr(torch_geometric.data, "download_url", refuse)
    monkeypatch.setattr(torch_geometric.io.fs, "cp", refuse)
    for module in ("linkx_dataset", "wikipedia_network", "heterophilous_graph_dataset", "ppi"):
        mod = importlib.import_module(f"torch_geometric.datasets.{module}")
        monkeypatch.setattr(mod, "download_url", refuse)
    return attempts


def _snapshot(root):
    return sorted((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*"))


def _load(tmp_path, name, written):
    """Loads ``name`` from the fixture's root into a fresh cache; checks that the root is
    left as it was."""
    before = _snapshot(written.root)
    g = dd.load_dataset(name, written.root, tmp_path / "cache")
    assert _snapshot(written.root) == before  # the data root is never written
    assert g.task == DATASETS[name]
    return g


def _edge_set(edge_index):
    return sorted(map(tuple, edge_index.t().tolist()))


def _both_ways(pairs):
    pairs = np.asarray(pairs)
    return sorted(map(tuple, np.concatenate([pairs, pairs[:, ::-1]]).tolist()))


def _assert_splits(splits, masks):
    assert len(splits) == len(masks)
    for s, m in zip(splits, masks):
        for got, want in zip((s.train, s.val, s.test), m):
            assert got.tolist() == np.nonzero(want)[0].tolist()


def _row_normalized(x):
    x = torch.as_tensor(x, dtype=torch.float32)
    return x / x.sum(1, keepdim=True).clamp_min(1e-12)


def test_every_catalog_dataset_has_a_loader():
    assert set(dd.GENERATORS) | set(dd.LOADERS) == set(DATASETS)
    assert not set(dd.GENERATORS) & set(dd.LOADERS)
    assert all(n == n.lower() and "_" not in n for n in DATASETS)


# ----------------------------------------------------------------------------- Planetoid --

@pytest.mark.parametrize("name", ["citeseer", "pubmed", "cora"])
def test_planetoid_from_fixture(tmp_path, offline, name):
    w = rf.write_planetoid(tmp_path / "root", name)
    g = _load(tmp_path, name, w)
    t = w.truth
    assert (g.num_nodes, g.num_features, g.num_classes) == (560, 12, 3)
    torch.testing.assert_close(g.x, _row_normalized(t["x"]))
    assert g.y.tolist() == t["y"].tolist()
    assert _edge_set(g.edge_index) == _both_ways(t["pairs"])
    _assert_splits(g.splits, t["splits"])
    if name == "citeseer":  # the index missing from test.index: an isolated, featureless node
        (gap,) = t["isolated"]
        assert float(g.x[gap].abs().sum()) == 0.0 and gap not in g.edge_index
    assert "Planetoid" in g.description and "geom-gcn" in g.description
    assert (tmp_path / "cache" / w.files[0].split("/")[0] / "geom-gcn" / "processed").exists()
    assert offline == []  # everything came from the files


# ------------------------------------------------------------------------------ Wikipedia --

@pytest.mark.parametrize("name", ["squirrel", "chameleon"])
def test_heterophilous_npz_from_fixture(tmp_path, offline, name):
    w = rf.write_heterophilous_npz(tmp_path / "root", name)
    g = _load(tmp_path, name, w)
    assert (g.num_nodes, g.num_features) == (30, 10)
    torch.testing.assert_close(g.x, _row_normalized(w.truth["x"]))
    assert _edge_set(g.edge_index) == _both_ways(w.truth["pairs"])  # undirected
    _assert_splits(g.splits, w.truth["splits"])
    assert offline == []


@pytest.mark.parametrize("name, folder", [("squirrel-directed", "geom_gcn"),
                                          ("squirrel-directed", "geom-gcn"),
                                          ("chameleon-directed", "geom_gcn")])
def test_geom_gcn_release_from_fixture(tmp_path, offline, name, folder):
    """The full Geom-GCN release (WikipediaNetwork, geom_gcn_preprocess=True), in PyG's or
    Planetoid's spelling of the folder: directed links kept, flipped so that a page
    aggregates over the pages it links to."""
    base = name.split("-")[0]
    w = rf.write_geom_gcn_wikipedia(tmp_path / "root", base, folder=folder)
    g = _load(tmp_path, name, w)
    t = w.truth
    assert g.num_nodes == 30 and g.num_classes == int(t["y"].max()) + 1
    assert _edge_set(g.edge_index) == sorted((v, u) for u, v in t["links"].tolist())
    assert _edge_set(g.edge_index) != _edge_set(g.edge_index.flip(0))  # really directed
    torch.testing.assert_close(g.x, _row_normalized(t["x"]))
    _assert_splits(g.splits, t["splits"])
    assert "WikipediaNetwork" in g.description
    assert (tmp_path / "cache" / base / "geom_gcn" / "processed").exists()
    assert offline == []


def test_directed_offline_from_npz_and_link_list(tmp_path, offline):
    """No node file: features, labels and splits from the npz, links from the list."""
    graph = rf.wikipedia_graph("squirrel")
    root = tmp_path / "root"
    rf.write_heterophilous_npz(root, "squirrel", graph)
    w = rf.write_geom_gcn_wikipedia(root, "squirrel", graph, folder="geom-gcn",
                                    links_only=True)
    assert w.files == ["squirrel/geom-gcn/raw/out1_graph_edges.txt"]
    g = _load(tmp_path, "squirrel-directed", w)
    und = dd.load_dataset("squirrel", root, tmp_path / "cache")
    assert _edge_set(g.edge_index) == sorted((v, u) for u, v in graph["links"].tolist())
    torch.testing.assert_close(g.x, und.x)
    assert torch.equal(g.y, und.y)
    assert all(torch.equal(a.test, b.test) and torch.equal(a.train, b.train)
               for a, b in zip(g.splits, und.splits))
    from torch_geometric.utils import remove_self_loops, to_undirected
    assert _edge_set(remove_self_loops(to_undirected(g.edge_index))[0]) == \
        _edge_set(und.edge_index)
    assert "npz" in g.description and offline == []


# ---------------------------------------------------------------------------------- LINKX --

@pytest.mark.parametrize("name", ["johnshopkins55", "reed98", "amherst41"])
def test_linkx_from_fixture(tmp_path, offline, name):
    w = rf.write_linkx_mat(tmp_path / "root", name)
    g = _load(tmp_path, name, w)
    t = w.truth
    x = g.x.to_dense()
    assert x.shape == (40, t["feature_width"])
    assert x.sum(1).tolist() == [6.0] * 40  # one one-hot block per profile field
    assert g.y.tolist() == t["y"].tolist() and g.num_classes == 2
    assert _edge_set(g.edge_index) == _both_ways(t["pairs"])
    labeled = int((g.y >= 0).sum())
    assert len(g.splits) == 10
    for s in g.splits:
        assert s.sizes() == (labeled // 2, labeled // 4, labeled - labeled // 2 - labeled // 4)
        assert (g.y[torch.cat([s.train, s.val, s.test])] >= 0).all()
    assert "LINKXDataset" in g.description and offline == []


def test_penn94_fixed_splits_from_fixture(tmp_path, offline):
    w = rf.write_linkx_mat(tmp_path / "root", "penn94", num_fixed_splits=5)
    g = _load(tmp_path, "penn94", w)
    assert len(g.splits) == 5
    for s, want in zip(g.splits, w.truth["splits"]):
        assert s.train.tolist() == sorted(want["train"].tolist())
        assert s.val.tolist() == sorted(want["valid"].tolist())
        assert s.test.tolist() == sorted(want["test"].tolist())
    assert "5 fixed" in g.description


# ------------------------------------------------------------------------------------ TU --

@pytest.mark.parametrize("name", ["ptc-mr", "proteins", "mutag", "nci1"])
def test_tu_node_labelled_from_fixture(tmp_path, offline, name):
    w = rf.write_dataset(tmp_path / "root", name)
    g = _load(tmp_path, name, w)
    t = w.truth
    values = rf.TU_RELEASES[name]["node_label_values"]
    assert len(g.graphs) == 24 and g.num_classes == 2
    assert g.num_features == values  # one-hot node labels; PROTEINS' attributes left out
    x = torch.cat([graph.x for graph in g.graphs])
    assert x.argmax(1).tolist() == t["node_labels"].tolist()
    assert [int(graph.y) for graph in g.graphs] == t["y"].tolist()
    assert [graph.num_nodes for graph in g.graphs] == t["num_nodes"]
    assert sorted(torch.cat([s.test for s in g.splits]).tolist()) == list(range(24))
    assert "TUDataset" in g.description and offline == []


@pytest.mark.parametrize("name, classes", [("imdb-binary", 2), ("imdb-multi", 3)])
def test_imdb_one_hot_degree_features(tmp_path, offline, name, classes):
    """No node features in the release: one-hot degrees as in GIN, as wide as the largest
    degree of the dataset plus one, also on the subsets training takes."""
    w = rf.write_dataset(tmp_path / "root", name)
    g = _load(tmp_path, name, w)
    t = w.truth
    degrees = [np.bincount(np.asarray(p).ravel(), minlength=n)
               for p, n in zip(t["pairs"], t["num_nodes"])]
    width = max(int(d.max()) for d in degrees) + 1
    assert g.num_features == width and g.num_classes == classes
    for graph, d in zip(g.graphs, degrees):
        assert graph.x.shape == (len(d), width)
        assert graph.x.argmax(1).tolist() == d.tolist() and graph.x.sum().item() == len(d)
    subset = g.graphs[g.splits[0].train]
    assert subset[0].x.size(1) == width
    assert f"OneHotDegree({width - 1})" in g.description


def test_tu_incomplete_raw_folder_is_a_clear_error(tmp_path, offline):
    w = rf.write_dataset(tmp_path / "root", "ptc-mr")
    (w.root / "PTC_MR" / "raw" / "PTC_MR_node_labels.txt").unlink()
    with pytest.raises(dd.DatasetUnavailableError, match="incomplete") as err:
        dd.load_dataset("ptc-mr", w.root, tmp_path / "cache")
    assert "PTC_MR/raw/PTC_MR_node_labels.txt" in str(err.value)


# ------------------------------------------------------------------------ offline errors --

def test_planetoid_without_its_split_files_names_them(tmp_path, offline):
    """Planetoid checks only the ind.* files before processing; the missing split files are
    named all the same."""
    w = rf.write_planetoid(tmp_path / "root", "citeseer")
    for k in (3, 7):
        (w.root / "CiteSeer" / "geom-gcn" / "raw" / f"citeseer_split_0.6_0.2_{k}.npz").unlink()
    with pytest.raises(dd.DatasetUnavailableError) as err:
        dd.load_dataset("citeseer", w.root, tmp_path / "cache")
    assert ("missing from the cache: CiteSeer/geom-gcn/raw/citeseer_split_0.6_0.2_3.npz, "
            "CiteSeer/geom-gcn/raw/citeseer_split_0.6_0.2_7.npz") in str(err.value)


_OPTIONAL = ("_edge_labels.txt", "_node_attributes.txt")  # in the releases, not needed


@pytest.mark.parametrize("name", sorted(dd.LOADERS))
def test_offline_error_names_every_file_and_the_url(tmp_path, offline, name):
    """With nothing under the data root nor in the cache, PyG's download is tried and the
    error lists every file (in its folder) the fixture of that format has, and the URL."""
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(dd.DatasetUnavailableError) as err:
        dd.load_dataset(name, empty, tmp_path / "cache")
    message = str(err.value)
    assert offline, "PyG's download was not tried"
    assert offline[0].rsplit("/", 1)[0] in message  # where PyG downloads from
    expected = rf.write_dataset(tmp_path / "fixture", name).files
    for path in expected:
        if path.endswith(_OPTIONAL):
            continue
        folder, filename = path.rsplit("/", 1)
        assert f"{folder}/:" in message and filename in message, path
    assert "--data-root" in message and "data_root=" in message
    assert str(empty) in message and list(empty.iterdir()) == []


def test_offline_error_urls_come_from_pyg():
    from torch_geometric.datasets import (LINKXDataset, Planetoid, TUDataset,
                                          WikipediaNetwork)
    from dignn.data import linkx, planetoid, tu, wikipedia
    urls = [g.url for g in planetoid.raw_files("pubmed")]
    assert urls == [f"{Planetoid.url}/<file>", f"{Planetoid.geom_gcn_url}/splits/<file>"]
    assert [g.url for g in linkx.raw_files("johnshopkins55")] == \
        [LINKXDataset.datasets["johnshopkins55"]["data.mat"]]
    assert [g.names[0] for g in linkx.raw_files("penn94")] == ["data.mat",
                                                               "fb100-Penn94-splits.npy"]
    assert tu.raw_files("imdb-multi")[0].url.startswith(f"{TUDataset.url}/IMDB-MULTI.zip")
    assert wikipedia.geom_gcn_raw_files("squirrel")[0].url.startswith(
        WikipediaNetwork.processed_url)


def test_chameleon_directed_offline_error_names_the_npz_alternative(tmp_path, offline):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(dd.DatasetUnavailableError) as err:
        dd.load_dataset("chameleon-directed", empty, tmp_path / "cache")
    assert "chameleon/raw/chameleon.npz" in str(err.value)
    assert "out1_node_feature_label.txt" in str(err.value)


# ---------------------------------------------------------------------- data root / cache --

def test_no_data_root_and_no_cache_yet_creates_the_cache(tmp_path, offline, monkeypatch):
    """With no data root given the cache is the root: it is created, and the offline error
    talks about the missing files, not about a missing data root."""
    monkeypatch.delenv("DIGNN_DATA", raising=False)
    cache = tmp_path / "not" / "yet"
    monkeypatch.setenv("DIGNN_CACHE", str(cache))
    with pytest.raises(dd.DatasetUnavailableError, match="no data root was given") as err:
        dd.load_dataset("reed98")
    assert "does not exist" not in str(err.value) and cache.is_dir()
    rf.write_linkx_mat(cache, "reed98")  # files put into the cache are then used
    assert dd.load_dataset("reed98").num_nodes == 40


def test_given_data_root_that_does_not_exist(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match="was given but does not exist"):
        dd.load_dataset("citeseer", tmp_path / "nope", tmp_path / "cache")
    monkeypatch.setenv("DIGNN_DATA", str(tmp_path / "gone"))
    with pytest.raises(FileNotFoundError, match=r"\$DIGNN_DATA"):
        dd.load_dataset("citeseer", None, tmp_path / "cache")


# ------------------------------------------------------------------------------- presets --

def test_every_dataset_has_a_preset():
    graph_defaults = dict(batch_size=128, pooling="add", input_unit="mlp")
    for name, task in DATASETS.items():
        if name in _GENERATED or name == "ppi":
            continue
        for laplacian in ("neural", "rw"):
            for preset in ("paper", "tuned"):
                c = preset_config(name, laplacian, preset)
                assert c.laplacian == laplacian and c.tol == 1e-6
                if task == "graph":
                    assert {k: getattr(c, k) for k in graph_defaults} == graph_defaults
                elif name in ("penn94", "amherst41", "cornell5", "johnshopkins55", "reed98"):
                    assert c.input_unit == "linkx"


def test_graph_presets_follow_the_paper_tables():
    # (mu rw, mu neural, hidden, lr, weight decay, max iter): tables 6 and 7
    want = {"ptc-mr": (2.5, 1.25, 64, 0.001, 0, 10), "proteins": (2.5, 1.25, 64, 0.001, 0, 10),
            "nci1": (2.4, 1.25, 64, 0.001, 1e-5, 4), "imdb-binary": (2.5, 2.5, 128, 0.001, 0, 10),
            "imdb-multi": (2.5, 1.25, 64, 0.001, 1e-5, 20)}
    for name, (mu_rw, mu_neural, hidden, lr, wd, max_iter) in want.items():
        rw, neural = preset_config(name, "rw", "paper"), preset_config(name, "neural", "paper")
        assert (rw.mu, neural.mu) == (mu_rw, mu_neural)
        for c in (rw, neural):
            assert (c.hidden, c.lr, c.weight_decay, c.max_iter, c.dropout) == \
                (hidden, lr, wd, max_iter, 0.0)
    assert preset_config("ptc_mr", "rw", "paper") == preset_config("ptc-mr", "rw", "paper")


def test_rows_borrowed_from_another_dataset():
    for laplacian in ("neural", "rw"):
        # the same row; only the solver follows the graph (preset_solver: anderson when directed)
        assert preset_config("squirrel-directed", laplacian, "tuned") == \
            preset_config("squirrel", laplacian, "tuned", solver="anderson")
        for name in ("johnshopkins55", "reed98"):
            assert preset_config(name, laplacian, "paper") == \
                preset_config("amherst41", laplacian, "paper")
