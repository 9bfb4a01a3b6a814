"""Users' own graphs: dignn.data.custom (from_pyg, load_user_file), `dignn train --dataset FILE`
with masks or --split-ratio, dignn.train_graph_data, and the errors for bad files."""
import json
import sys
import types
import warnings

import pytest
import torch
from torch_geometric.data import Data, HeteroData, InMemoryDataset

import dignn
import dignn.training
from dignn import cli
from dignn.data import GraphDataset, NodeDataset, csbm
from dignn.data.custom import UserDataError, from_pyg, load_user_file
from dignn.presets import USER_DATA, preset_config

pytestmark = pytest.mark.usefixtures("one_thread")

N = 200
TINY = ["--epochs", "2", "--hidden", "8", "--max-iter", "3", "--no-progress",
        "--device", "cpu"]


def node_data(masks: bool = True, num_splits: int = 2) -> Data:
    """A 200-node, 3-class CSBM graph as a PyG Data, with [N, num_splits] masks from the
    generator's splits when ``masks``."""
    g = csbm(num_nodes=N, num_classes=3, num_features=8, avg_degree=6, num_splits=num_splits)
    data = Data(x=g.x, edge_index=g.edge_index, y=g.y)
    if masks:
        for key, part in zip(("train_mask", "val_mask", "test_mask"), range(3)):
            mask = torch.zeros(N, num_splits, dtype=torch.bool)
            for k, s in enumerate(g.splits):
                mask[(s.train, s.val, s.test)[part], k] = True
            data[key] = mask
    return data


def tiny_graphs(count: int = 12):
    """``count`` small graphs, two classes (paths labeled 0, cycles labeled 1)."""
    graphs = []
    for i in range(count):
        n = 4 + i % 3
        src = torch.arange(n - 1 + (i % 2))
        ei = torch.stack([src, (src + 1) % n])
        graphs.append(Data(x=torch.randn(n, 3, generator=torch.Generator().manual_seed(i)),
                           edge_index=torch.cat([ei, ei.flip(0)], 1), y=torch.tensor([i % 2])))
    return graphs


class TinyGraphs(InMemoryDataset):
    """A whole dataset object, which torch.save pickles with its class."""

    def __init__(self, graphs):
        super().__init__(None)
        self._data, self.slices = self.collate(graphs)


def run_cli(args, capsys):
    rc = cli.main(["train", *args])
    return rc, capsys.readouterr()


# --- node classification through the command line ---------------------------------------

def test_cli_trains_a_saved_data_with_masks(tmp_path, capsys):
    path = tmp_path / "my_graph.pt"
    torch.save(node_data(), path)
    out = tmp_path / "run.json"
    rc, io = run_cli(["--dataset", str(path), *TINY, "--json", str(out)], capsys)
    assert rc == 0, io.err
    record = json.loads(out.read_text())
    assert record["dataset"] == "my_graph"  # the file's stem
    assert len(record["test_acc"]) == 2  # the masks' two columns
    assert record["preset"] == "user-data (generic)"
    assert record["config"]["hidden"] == 8 and record["config"]["mu"] == 3.0
    assert "2 split(s) from its masks" in io.out


@pytest.mark.parametrize("command", ["train", "sweep"])
def test_cli_applies_the_solver_rule_to_a_directed_file(tmp_path, capsys, command):
    # The preset is built before the file is read; once read, a directed graph gets the
    # rule's anderson (cg would fall back to it with a warning), unless --solver says.
    data = node_data()
    keep = data.edge_index[0] < data.edge_index[1]  # one direction of each pair
    data.edge_index = data.edge_index[:, keep]
    path = tmp_path / "directed.pt"
    torch.save(data, path)
    out = tmp_path / "run.json"
    extra = ["--grid", "dropout=0.5"] if command == "sweep" else []
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="solver='cg' needs a symmetric W")
        rc = cli.main([command, "--dataset", str(path), *TINY, "--splits", "0", *extra,
                       "--json", str(out)])
    io = capsys.readouterr()
    assert rc == 0, io.err
    record = json.loads(out.read_text())
    config = record["config"] if command == "train" else record["chosen"]["config"]
    assert config["solver"] == "anderson"
    rc = cli.main(["train", "--dataset", str(path), *TINY, "--splits", "0", "--solver",
                   "fixed_point", "--json", str(out)])
    assert rc == 0 and json.loads(out.read_text())["config"]["solver"] == "fixed_point"
    capsys.readouterr()


def test_cli_split_ratio_and_num_splits(tmp_path, capsys):
    path = tmp_path / "unsplit.pt"
    torch.save(node_data(masks=False), path)
    out = tmp_path / "run.json"
    rc, io = run_cli(["--dataset", str(path), *TINY, "--split-ratio", "0.5,0.25,0.25",
                      "--num-splits", "3", "--splits", "0,2", "--json", str(out)], capsys)
    assert rc == 0, io.err
    record = json.loads(out.read_text())
    assert record["splits"] == [0, 2] and record["dataset"] == "unsplit"
    assert "3 seeded random 50/25/25 splits" in io.out


def test_cli_file_without_masks_or_ratio(tmp_path, capsys):
    path = tmp_path / "unsplit.pt"
    torch.save(node_data(masks=False), path)
    rc, io = run_cli(["--dataset", str(path), *TINY], capsys)
    assert rc == 2
    assert "no train_mask/val_mask/test_mask" in io.err and "--split-ratio" in io.err


def test_cli_unknown_name_lists_names_and_paths(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["train", "--dataset", "no-such-graph"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'no-such-graph'" in err
    assert "cora" in err and "mutag" in err and "torch.save" in err


def test_cli_split_options_on_named_datasets(capsys):
    rc, io = run_cli(["--dataset", "cora", "--split-ratio", "0.6,0.2,0.2"], capsys)
    assert rc == 2 and "apply to a dataset file" in io.err
    rc, io = run_cli(["--dataset", "cora", "--num-splits", "3"], capsys)
    assert rc == 2 and "--num-splits apply to a dataset file" in io.err
    # generated graphs take --num-splits: csbm then has 2 splits, so split 2 does not exist
    rc, io = run_cli(["--dataset", "csbm", "--num-splits", "2", "--splits", "2", *TINY],
                     capsys)
    assert rc == 2 and "--splits: 2 out of range" in io.err and "0..1" in io.err
    with pytest.raises(SystemExit):
        cli.main(["train", "--split-ratio", "0.6,0.4"])
    assert "three shares" in capsys.readouterr().err


# --- the Python entry point ------------------------------------------------------------

def test_train_graph_data_takes_a_data_object():
    data = node_data()
    data.name = "mine"
    run = dignn.train_graph_data(data, epochs=2, hidden=8, max_iter=3, device="cpu")
    assert isinstance(run, dignn.RunResult)
    assert run.dataset == "mine" and len(run.splits) == 2
    assert run.config.epochs == 2 and run.config.hidden == 8
    assert run.config.spectral_norm and run.config.mu == 3.0  # the generic preset
    run = dignn.train_graph_data(node_data(masks=False), laplacian="rw",
                                 split_ratio=(0.6, 0.2, 0.2), num_splits=3, splits=[1],
                                 epochs=2, hidden=8, max_iter=3, device="cpu")
    assert [s.split for s in run.splits] == [1] and run.dataset == "graph-data"
    assert run.laplacian == "rw" and not run.config.spectral_norm


def test_generic_preset():
    neural = preset_config(USER_DATA, "neural")
    assert (neural.hidden, neural.lr, neural.weight_decay, neural.max_iter, neural.dropout,
            neural.epochs, neural.input_unit) == (64, 0.01, 5e-4, 10, 0.5, 200, "mlp")
    assert neural.spectral_norm and neural.mu == 3.0 and neural.solver == "cg"
    assert preset_config(USER_DATA, "neural", "paper") == neural  # same under both presets
    assert not preset_config(USER_DATA, "rw").spectral_norm
    assert preset_config(USER_DATA, hidden=16).hidden == 16


# --- graph classification ----------------------------------------------------------------

@pytest.mark.parametrize("how", ["inmemory_save", "list", "dataset_object"])
def test_graph_level_files(tmp_path, how):
    path = tmp_path / "tiny.pt"
    graphs = tiny_graphs()
    if how == "inmemory_save":
        InMemoryDataset.save(graphs, str(path))  # PyG's format, loads weights-only
    elif how == "list":
        torch.save(graphs, path)
    else:
        torch.save(TinyGraphs(graphs), path)  # needs unpickling
    ds = load_user_file(path, num_splits=4, allow_pickle=how == "dataset_object")
    assert isinstance(ds, GraphDataset) and ds.name == "tiny"
    assert (len(ds.graphs), ds.num_features, ds.num_classes, len(ds.splits)) == (12, 3, 2, 4)
    for s in ds.splits:  # folds partition the graphs, each class in each fold
        assert sorted(torch.cat([s.train, s.val, s.test]).tolist()) == list(range(12))
        assert set(torch.cat([ds.graphs[int(i)].y for i in s.test]).tolist()) == {0, 1}
    if how == "dataset_object":
        with pytest.raises(UserDataError, match="needs unpickling.*TinyGraphs.*"
                                                "--trust-pickle.*allow_pickle=True"):
            load_user_file(path)  # unpickling is opt-in


def test_cli_graph_level(tmp_path, capsys):
    path = tmp_path / "tiny_graphs.pt"
    InMemoryDataset.save(tiny_graphs(), str(path))
    out = tmp_path / "run.json"
    rc, io = run_cli(["--dataset", str(path), *TINY, "--num-splits", "3", "--splits", "0",
                      "--json", str(out)], capsys)
    assert rc == 0, io.err
    record = json.loads(out.read_text())
    assert record["dataset"] == "tiny_graphs" and record["splits"] == [0]
    assert "stratified 3-fold cross-validation" in io.out


def test_graph_split_ratio_and_unlabeled_graphs():
    graphs = tiny_graphs(20)
    graphs[0].y = torch.tensor([-1])
    ds = from_pyg(graphs, name="g", split_ratio=(0.5, 0.25, 0.25), num_splits=2)
    for s in ds.splits:
        used = torch.cat([s.train, s.val, s.test])
        assert 0 not in used.tolist() and used.numel() == 19
    folds = from_pyg(graphs, name="g", num_splits=3).splits
    assert all(0 not in torch.cat([s.train, s.val, s.test]).tolist() for s in folds)


def test_class_that_cannot_be_imported(tmp_path, monkeypatch):
    module = types.ModuleType("vanishing_module")

    class Gone(InMemoryDataset):
        def __init__(self, graphs):
            super().__init__(None)
            self._data, self.slices = self.collate(graphs)
    Gone.__module__ = "vanishing_module"
    Gone.__qualname__ = "Gone"
    module.Gone = Gone
    monkeypatch.setitem(sys.modules, "vanishing_module", module)
    path = tmp_path / "gone.pt"
    torch.save(Gone(tiny_graphs()), path)
    monkeypatch.delitem(sys.modules, "vanishing_module")
    with pytest.raises(UserDataError, match="pickles a class that cannot be imported"):
        load_user_file(path, allow_pickle=True)


# --- splits --------------------------------------------------------------------------------

def test_split_ratio_splits_are_seeded():
    data = node_data(masks=False)
    data.y[:20] = -1  # unlabeled nodes are in no split
    a = from_pyg(data, split_ratio=(0.6, 0.2, 0.2), num_splits=3, seed=5)
    b = from_pyg(data, split_ratio=(0.6, 0.2, 0.2), num_splits=3, seed=5)
    c = from_pyg(data, split_ratio=(0.6, 0.2, 0.2), num_splits=3, seed=6)
    for sa, sb in zip(a.splits, b.splits):
        assert all(torch.equal(u, v) for u, v in zip((sa.train, sa.val, sa.test),
                                                     (sb.train, sb.val, sb.test)))
    assert torch.equal(a.splits[1].train, c.splits[0].train)  # split k uses seed + k
    assert not torch.equal(a.splits[0].train, c.splits[0].train)
    for s in a.splits:
        used = torch.cat([s.train, s.val, s.test])
        assert used.unique().numel() == used.numel() == 180 and bool((data.y[used] >= 0).all())
        assert s.sizes() == (108, 36, 36)
    partial = from_pyg(data, split_ratio=(0.5, 0.2, 0.1), num_splits=1).splits[0]
    assert partial.sizes() == (90, 36, 18)  # shares summing below 1 leave nodes out


def test_masks_win_over_split_ratio():
    data = node_data()
    with pytest.warns(UserWarning, match="split_ratio .* is ignored"):
        ds = from_pyg(data, split_ratio=(0.6, 0.2, 0.2), num_splits=5)
    assert len(ds.splits) == 2
    assert torch.equal(ds.splits[1].val, torch.nonzero(data.val_mask[:, 1]).flatten())


def test_one_dimensional_masks_and_broadcast():
    data = node_data(num_splits=1)
    for key in ("train_mask", "val_mask", "test_mask"):
        data[key] = data[key][:, 0]
    assert len(from_pyg(data).splits) == 1
    data.train_mask = torch.stack([data.train_mask, data.train_mask], 1)
    data.val_mask = torch.stack([data.val_mask, data.val_mask], 1)
    ds = from_pyg(data)  # test_mask [N] is used in both splits
    assert len(ds.splits) == 2 and torch.equal(ds.splits[0].test, ds.splits[1].test)


def test_dict_of_tensors_and_num_classes(tmp_path):
    data = node_data()
    data.y[data.y == 2] = -1  # class 2 unused: num_classes = max label + 1 = 2
    data.train_mask &= data.y[:, None] >= 0
    data.val_mask &= data.y[:, None] >= 0
    data.test_mask &= data.y[:, None] >= 0
    path = tmp_path / "plain.pt"
    torch.save({k: data[k] for k in data.keys()}, path)
    ds = load_user_file(path)
    assert isinstance(ds, NodeDataset) and ds.num_classes == 2 and ds.name == "plain"


# --- bad files and bad data ---------------------------------------------------------------

def _set(**changes):
    def apply(data):
        for key, value in changes.items():
            if value is None:
                del data[key]
            else:
                data[key] = value(data) if callable(value) else value
        return data
    return apply


BAD_NODE_DATA = {
    "no y": (_set(y=None), "has no labels 'y'"),
    "no x": (_set(x=None), "has no node features 'x'.*OneHotDegree"),
    "1-d x": (_set(x=lambda d: d.x[:, 0]), r"x.view\(-1, 1\)"),
    "nan x": (_set(x=lambda d: d.x.index_fill(0, torch.tensor([3]), float("nan"))),
              "NaN or infinite values .* row 3"),
    "float y": (_set(y=lambda d: d.y.float()), "integer class labels, got torch.float32"),
    "multi-label y": (_set(y=lambda d: torch.nn.functional.one_hot(d.y, 3)), "multi-label"),
    "label below -1": (_set(y=lambda d: d.y.index_fill(0, torch.tensor([0]), -2)),
                       "holds label -2"),
    "y too short": (_set(y=lambda d: d.y[:-1]), "'y' has 199 entries but the graph has 200"),
    "graph label on one graph": (_set(y=torch.tensor([1])), "one label for the whole graph"),
    "one class": (_set(y=lambda d: torch.zeros_like(d.y)), "at least two classes"),
    "no edge_index": (_set(edge_index=None), "has no 'edge_index'"),
    "transposed edges": (_set(edge_index=lambda d: d.edge_index.t()), "looks transposed"),
    "float edges": (_set(edge_index=lambda d: d.edge_index.float()),
                    "integer node indices, got torch.float32"),
    "edge beyond the nodes": (_set(edge_index=lambda d: d.edge_index.index_fill(
        1, torch.tensor([0]), N)), f"names node {N}, but the graph has {N} nodes"),
    "negative edge": (_set(edge_index=lambda d: d.edge_index.index_fill(
        1, torch.tensor([0]), -1)), "names node -1"),
    "mask wrong length": (_set(train_mask=lambda d: d.train_mask[:-1]),
                          r"train_mask has shape \[199, 2\]"),
    "mask wrong dtype": (_set(val_mask=lambda d: d.val_mask.long()),
                         "val_mask must be a bool tensor, got torch.int64"),
    "one mask missing": (_set(val_mask=None), "has train_mask, test_mask but no val_mask"),
    "masks of different splits": (_set(test_mask=lambda d: d.test_mask.repeat(1, 2)),
                                  "different numbers of splits"),
    "overlapping masks": (_set(test_mask=lambda d: d.test_mask | d.train_mask),
                          "train_mask and test_mask overlap in split 0"),
    "mask on unlabeled nodes": (_set(y=lambda d: d.y.masked_fill(d.val_mask[:, 0], -1)),
                                r"val_mask selects unlabeled nodes \(y = -1\) in split 0"),
    "empty split": (_set(val_mask=lambda d: d.val_mask.index_fill(
        1, torch.tensor([1]), False)), "split 1 .* has no validation nodes"),
}


@pytest.mark.parametrize("case", sorted(BAD_NODE_DATA))
def test_bad_node_data(tmp_path, case):
    change, message = BAD_NODE_DATA[case]
    data = change(node_data())
    with pytest.raises(UserDataError, match=message):
        from_pyg(data)
    path = tmp_path / "bad.pt"  # the same error through a file
    torch.save(data, path)
    with pytest.raises(ValueError, match=message):
        load_user_file(path)


@pytest.mark.parametrize("ratio, message", [
    ((0.6, 0.3, 0.2), "sum to at most 1"),
    ((0.6, 0.4), "three shares"),
    ((0.8, 0.0, 0.2), r"each be in \(0, 1\)"),
    ("0.6", "three shares"),
])
def test_bad_split_ratio(ratio, message):
    with pytest.raises(UserDataError, match=message):
        from_pyg(node_data(masks=False), split_ratio=ratio)


def test_split_ratio_with_an_empty_set_and_bad_num_splits():
    data = node_data(masks=False)
    data.y[4:] = -1  # four labeled nodes: 10% of them is no node
    with pytest.raises(UserDataError, match="leaves the validation set empty.*only 4 labeled"):
        from_pyg(data, split_ratio=(0.5, 0.1, 0.4))
    with pytest.raises(UserDataError, match="num_splits must be a positive integer"):
        from_pyg(node_data(masks=False), split_ratio=(0.6, 0.2, 0.2), num_splits=0)


def test_bad_files(tmp_path):
    with pytest.raises(UserDataError, match="does not exist"):
        load_user_file(tmp_path / "missing.pt")
    with pytest.raises(UserDataError, match="is a folder"):
        load_user_file(tmp_path)
    text = tmp_path / "notes.pt"
    text.write_text("not a tensor file")
    with pytest.raises(UserDataError, match="is not a file written by torch.save"):
        load_user_file(text)
    tensor = tmp_path / "tensor.pt"
    torch.save(torch.randn(3, 3), tensor)
    with pytest.raises(UserDataError, match="is a torch.Tensor, not a torch_geometric Data"):
        load_user_file(tensor)
    numbers = tmp_path / "numbers.pt"
    torch.save([1, 2, 3], numbers)
    with pytest.raises(UserDataError, match="is a builtins.list, not a torch_geometric"):
        load_user_file(numbers)


def test_bad_graph_collections():
    hetero = HeteroData()
    hetero["paper"].x = torch.randn(3, 2)
    with pytest.raises(UserDataError, match="to_homogeneous"):
        from_pyg(hetero)
    graphs = tiny_graphs()
    graphs[3].y = torch.tensor([0, 1, 0, 1, 0, 1, 0])[: graphs[3].num_nodes]
    with pytest.raises(UserDataError, match="graph 3 .* one label per graph"):
        from_pyg(graphs)
    graphs = tiny_graphs()
    graphs[2].x = torch.randn(graphs[2].num_nodes, 5)
    with pytest.raises(UserDataError, match="graph 2 .* has 5 features, graph 0 has 3"):
        from_pyg(graphs)
    graphs = tiny_graphs()
    del graphs[5].x
    with pytest.raises(UserDataError, match="graph 5 .* no node features 'x'"):
        from_pyg(graphs)
    with pytest.raises(UserDataError,
                       match="split 11 .* has no validation graphs.*lower num_splits"):
        from_pyg(tiny_graphs(), num_splits=20)
    with pytest.raises(UserDataError, match="at least 3"):
        from_pyg(tiny_graphs(), num_splits=2)


def test_exported():
    assert dignn.train_graph_data is dignn.training.train_graph_data
    assert issubclass(dignn.UserDataError, ValueError)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a clean graph loads without warnings
        assert isinstance(dignn.from_pyg(node_data()), NodeDataset)
