"""bench/peers/fidelity_graph.py, the graph classification fidelity harness, without the authors'
checkout or sklearn: the two readouts and the per-fold records on synthetic histories, the
paired statistics of a record, the CLI's argument errors, the mapping of the authors' shuffled
folds onto dignn's graphs, the separate random streams, and the architecture variants built
around dignn's model."""
import math
import random
import sys
from pathlib import Path

import pytest
import torch

from conftest import load_module

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench" / "peers"))


fg = load_module("dignn_bench_fidelity_graph", REPO / "bench" / "peers" / "fidelity_graph.py")
common = load_module("dignn_bench_fidelity_common", REPO / "bench" / "peers" / "fidelity_common.py")

# three folds, four epochs: fold 0 peaks at epoch 2 (and again at 4: the first counts)
HIST = [[0.5, 0.9, 0.6, 0.9], [0.4, 0.5, 0.8, 0.7], [0.6, 0.6, 0.6, 0.6]]


def test_fold_max_readout_takes_each_folds_first_best_epoch():
    r = fg.fold_max_readout(HIST)
    assert r["per_fold"] == [0.9, 0.8, 0.6]
    assert r["epochs"] == [2, 3, 1]
    assert r["mean"] == pytest.approx((0.9 + 0.8 + 0.6) / 3)
    # a failed fold (NaN history) has no best epoch and a NaN accuracy
    r = fg.fold_max_readout([[math.nan, math.nan], [0.1, 0.3]])
    assert math.isnan(r["per_fold"][0]) and r["epochs"] == [0, 2]
    with pytest.raises(ValueError, match="empty history"):
        fg.fold_max_readout([[0.5], []])
    with pytest.raises(ValueError, match="at least one"):
        fg.fold_max_readout([])


def test_gin_readout_takes_one_epoch_for_every_fold():
    # epoch means: 0.5, 0.6667, 0.6667, 0.7333 -> epoch 4
    r = fg.gin_readout(HIST)
    assert r["epoch"] == 4
    assert r["per_fold"] == [0.9, 0.7, 0.6]
    assert r["mean"] == pytest.approx(2.2 / 3)
    # ties: the earliest epoch
    assert fg.gin_readout([[0.5, 0.7, 0.7], [0.5, 0.7, 0.7]])["epoch"] == 2
    with pytest.raises(ValueError, match="same"):
        fg.gin_readout([[0.5, 0.6], [0.5]])


def test_splits_and_paired_statistics_of_a_record():
    theirs = {"test_history": HIST, "ms_per_epoch": [100.0, 110.0, 120.0]}
    ours = {"test_history": [[0.6, 0.95, 0.9, 0.9], [0.8, 0.8, 0.8, 0.8],
                             [0.5, 0.5, 0.5, 0.7]], "ms_per_epoch": [10.0, 11.0, 12.0]}
    splits = fg.build_splits([3, 5, 7], ours, theirs)
    keys = {"split", "ours_acc", "theirs_acc", "ours_best_epoch", "theirs_best_epoch",
            "ours_ms_per_epoch", "theirs_ms_per_epoch"}
    assert all(keys <= set(s) for s in splits)
    assert [s["split"] for s in splits] == [3, 5, 7]
    assert [s["ours_acc"] for s in splits] == pytest.approx([95.0, 80.0, 70.0])
    assert [s["theirs_acc"] for s in splits] == pytest.approx([90.0, 80.0, 60.0])
    assert [s["ours_best_epoch"] for s in splits] == [2, 1, 4]
    assert [s["theirs_ms_per_epoch"] for s in splits] == [100.0, 110.0, 120.0]
    # gin: ours' epoch means 0.633, 0.75, 0.733, 0.8 -> epoch 4; theirs epoch 4
    assert {s["ours_gin_epoch"] for s in splits} == {4}
    assert [s["ours_acc_gin"] for s in splits] == pytest.approx([90.0, 80.0, 70.0])
    p = fg.compare(splits, common.paired)
    diffs = [5.0, 0.0, 10.0]
    assert p["fold_max"]["mean_diff"] == pytest.approx(5.0)
    sd = math.sqrt(sum((d - 5.0) ** 2 for d in diffs) / 2)
    assert p["fold_max"]["se"] == pytest.approx(sd / math.sqrt(3))
    assert p["fold_max"]["within"] is True
    gin_diffs = [0.0, 10.0, 10.0]
    assert p["gin"]["mean_diff"] == pytest.approx(sum(gin_diffs) / 3)
    assert p["gin"]["n"] == 3


def test_folds_and_overrides_parse_or_name_the_argument():
    assert fg.parse_folds("0-9") == list(range(10))
    assert fg.parse_folds("0-2,7,1") == [0, 1, 2, 7]
    for bad in ("3-1", "a", "0-10", "", "-1"):
        with pytest.raises(ValueError, match="--folds"):
            fg.parse_folds(bad)
    assert fg.parse_sets(["hidden=128", "lr=0.001", "solver=cg", "patience=none",
                          "spectral_norm=true"]) == {
        "hidden": 128, "lr": 0.001, "solver": "cg", "patience": None, "spectral_norm": True}
    with pytest.raises(ValueError, match="FIELD=VALUE"):
        fg.parse_sets(["hidden"])


@pytest.mark.parametrize("argv, message", [
    (["--datasets", "cora"], "--datasets"),
    (["--folds", "0-12"], "--folds"),
    (["--epochs", "0"], "--epochs"),
    (["--threads", "0"], "--threads"),
    (["--dignn-configs", "preset,bogus"], "--dignn-configs"),
    (["--dignn-set", "hidden"], "FIELD=VALUE"),
    (["--datasets", "mutag,nci1", "--out", "x.json"], "{dataset}"),
    (["--variant", "fast"], "--variant"),
])
def test_cli_refuses_bad_arguments(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        fg.parse_args(["--epochs", "3", *argv] if "--epochs" not in argv else argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_cli_defaults():
    a = fg.parse_args(["--epochs", "5", "--datasets", "MUTAG,nci1"])
    assert a.dataset_list == ["mutag", "nci1"] and a.fold_list == list(range(10))
    assert a.config_list == ["preset", "authors-hparams"] and a.variant == "swapped"
    assert "{dataset}" in a.out


def test_authors_folds_map_through_their_shuffle():
    from torch_geometric.data import Data
    from dignn.data import GraphDataset, stratified_folds
    graphs = [Data(x=torch.full((2, 1), float(k)), edge_index=torch.tensor([[0, 1], [1, 0]]),
                   y=torch.tensor([k % 2])) for k in range(6)]
    data = GraphDataset("six", graphs, 1, 2, stratified_folds(torch.arange(6) % 2, 3))
    perm = torch.tensor([4, 2, 0, 5, 1, 3])  # their shuffled item i is file item perm[i]
    idx = [(torch.tensor([0, 1, 2, 3]), torch.tensor([4, 5])),
           (torch.tensor([2, 3, 4, 5]), torch.tensor([0, 1]))]
    out = fg.dignn_folds(data, perm, idx, [0, 1])
    assert out.splits[0].test.tolist() == [1, 3] and out.splits[0].train.tolist() == [0, 2, 4, 5]
    assert torch.equal(out.splits[1].val, out.splits[1].test)
    assert out.splits[1].test.tolist() == [2, 4]
    assert out.graphs is graphs and "authors' folds" in out.description


def test_their_random_stream_is_kept_apart():
    torch.manual_seed(0)
    expected = torch.rand(4)
    torch.manual_seed(0)
    state = {}
    with fg._own_rng(state):
        pass  # starts from the caller's stream
    torch.manual_seed(123)  # what another side does in between
    outer_next = torch.rand(1)
    torch.manual_seed(123)
    with fg._own_rng(state):
        a = torch.rand(2)
    assert torch.equal(torch.rand(1), outer_next)  # the caller's stream is put back
    with fg._own_rng(state):
        b = torch.rand(2)
        random.random()
    assert torch.equal(torch.cat([a, b]), expected)


def test_authors_hparams_and_architecture_variants():
    from dignn import DIGNNGraphClassifier
    h = fg.authors_hparams("mutag", 7)
    assert (h["hidden"], h["mu"], h["max_iter"], h["lr"], h["epochs"]) == (128, 1.25, 20,
                                                                          0.001, 7)
    assert h["node_layers"] == h["graph_layers"] == 3 and h["solver"] == "fixed_point"
    assert fg.authors_hparams("nci1", 1)["max_iter"] == 4
    torch.manual_seed(0)
    model = DIGNNGraphClassifier(3, hidden=8, num_classes=2, laplacian="rw", mu=3.0)
    model = fg._variant_model(model, ["mlp-input", "logit-dropout"])
    assert not hasattr(model, "lin_in") and model.mlp_in.a.out_features == 64
    x = torch.randn(5, 3)
    ei = torch.tensor([[0, 1, 2, 3, 3, 4], [1, 0, 3, 2, 4, 3]])
    batch = torch.tensor([0, 0, 1, 1, 1])
    model.eval()
    first = model(x, ei, batch, 2)
    assert torch.equal(first, model(x, ei, batch, 2))  # no dropout in evaluation
    model.train()
    outs = torch.stack([model(x, ei, batch, 2) for _ in range(10)])
    assert outs.shape == (10, 2, 2) and bool((outs == 0).any())  # dropout 0.5 on the logits
    from dignn import training
    build, loader = training.build_model, training._graph_loader
    with fg._patched_training(["no-shuffle", "mlp-input"]):
        assert training.build_model is not build and training._graph_loader is not loader
    assert training.build_model is build and training._graph_loader is loader


def test_staged_root_names_a_missing_dataset(tmp_path):
    with pytest.raises(FileNotFoundError, match="--data-root"):
        fg._staged_root("mutag", str(tmp_path))


def test_dignn_configurations_on_the_same_folds():
    a = fg.parse_args(["--epochs", "9", "--dignn-set", "hidden=32",
                       "--dignn-configs", "preset,authors-hparams,their-budget,cg,all"])
    cfg, changes = fg.dignn_config("mutag", "preset", a)
    assert (cfg.hidden, cfg.epochs, cfg.solver, changes) == (32, 9, "cg", [])
    cfg, changes = fg.dignn_config("mutag", "authors-hparams", a)
    assert (cfg.hidden, cfg.max_iter, cfg.tol, cfg.solver) == (128, 20, 1e-6, "fixed_point")
    cfg, changes = fg.dignn_config("mutag", "their-budget", a)
    assert (cfg.max_iter, cfg.tol, changes) == (22, 0.0, ["their-budget"])
    cfg, _ = fg.dignn_config("nci1", "cg", a)
    assert (cfg.solver, cfg.max_iter, cfg.hidden) == ("cg", 4, 64)
    cfg, changes = fg.dignn_config("mutag", "all", a)
    assert set(changes) == {"mlp-input", "logit-dropout", "no-shuffle", "their-budget"}
    assert cfg.max_iter == 22


def test_variants_on_the_preset_and_against_an_earlier_record(capsys):
    a = fg.parse_args(["--epochs", "4", "--dignn-configs", "preset+mlp-input+no-shuffle"])
    cfg, changes = fg.dignn_config("mutag", a.config_list[0], a)
    assert changes == ["mlp-input", "no-shuffle"] and cfg.solver == "cg" and cfg.epochs == 4
    for bad in ("preset+", "preset+all", "mlp-input+cg"):
        with pytest.raises(SystemExit):
            fg.parse_args(["--epochs", "4", "--dignn-configs", bad])
    assert "--dignn-configs" in capsys.readouterr().err


def test_versus_pairs_two_dignn_configurations():
    new = [{"split": 0, "ours_acc": 90.0, "ours_acc_gin": 85.0, "theirs_acc": 1.0,
            "theirs_acc_gin": 1.0},
           {"split": 1, "ours_acc": 80.0, "ours_acc_gin": 80.0, "theirs_acc": 1.0,
            "theirs_acc_gin": 1.0}]
    old = [{"split": 0, "ours_acc": 85.0, "ours_acc_gin": 85.0},
           {"split": 1, "ours_acc": 79.0, "ours_acc_gin": 70.0}]
    v = fg.versus(new, old, common.paired)
    assert v["fold_max"]["mean_diff"] == pytest.approx(3.0)
    assert v["fold_max"]["se"] == pytest.approx(2.0)
    assert v["gin"]["mean_diff"] == pytest.approx(5.0)
    with pytest.raises(ValueError, match="same folds"):
        fg.versus(new, old[::-1], common.paired)
