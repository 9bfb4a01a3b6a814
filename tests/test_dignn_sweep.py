"""``dignn sweep`` (selection on validation accuracy only) and the GIN protocol."""
import json
import math

import pytest
import torch

from conftest import DATA_ROOT
from dignn import cli
from dignn.data import GraphDataset, csbm, stratified_folds
from dignn.presets import TrainConfig
from dignn.protocols import (GIN_DESCRIPTION, apply_protocol, check_protocol_config,
                             gin_folds, gin_score)
from dignn.sweep import (check_settings, expand_grid, load_settings, parse_grid, run_sweep,
                         select_setting)
from dignn.training import RunResult, SplitResult

SMALL_CSBM = dict(num_nodes=300, num_classes=3, num_features=16, avg_degree=8,
                  homophily=0.8, signal=1.0, num_splits=3)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def small_csbm(monkeypatch):
    import dignn.data
    monkeypatch.setattr(dignn.data, "csbm", lambda **kw: csbm(**SMALL_CSBM))


# ----------------------------------------------------------------------- grid parsing --

def test_grid_values_are_parsed_to_their_field_types():
    grid = parse_grid(["mu=1.25,2.2", "hidden=8,16", "solver=cg", "spectral-norm=true,false",
                       "patience=none,5", "input_dropout=0"])
    assert grid == {"mu": [1.25, 2.2], "hidden": [8, 16], "solver": ["cg"],
                    "spectral_norm": [True, False], "patience": [None, 5],
                    "input_dropout": [0.0]}
    assert type(grid["hidden"][0]) is int and type(grid["input_dropout"][0]) is float
    settings = expand_grid(grid)
    assert len(settings) == 2 * 2 * 2 * 2
    assert settings[0] == dict(mu=1.25, hidden=8, solver="cg", spectral_norm=True,
                               patience=None, input_dropout=0.0)
    assert settings[1]["input_dropout"] == 0.0 and settings[1]["patience"] == 5


@pytest.mark.parametrize("entry, message", [
    ("momentum=0.9", "unknown setting 'momentum'"),
    ("hidden=8.5", "bad value '8.5' for hidden: expected an integer"),
    ("mu=abc", "bad value 'abc' for mu: expected a finite number"),
    ("mu=inf", "bad value 'inf' for mu"),
    ("spectral_norm=maybe", "expected true or false"),
    ("hidden=none", "bad value 'none' for hidden"),
    ("mu=", "empty value"),
    ("mu=1,,2", "empty value"),
    ("mu", "expected KEY=V1,V2"),
    ("laplacian=rw", "laplacian cannot be swept"),
])
def test_bad_grid_entries(entry, message):
    with pytest.raises(ValueError, match=message):
        parse_grid([entry])


def test_grid_key_twice_and_too_many_settings():
    with pytest.raises(ValueError, match="mu is given twice"):
        parse_grid(["mu=1", "mu=2"])
    big = parse_grid(["mu=1,2,3,4,5,6,7,8,9", "hidden=8,16,32,64,128,256,512,1024"])
    with pytest.raises(ValueError, match="72 settings exceed --max-settings 64"):
        expand_grid(big)
    assert len(expand_grid(big, max_settings=72)) == 72


def test_settings_file(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps([{"mu": 2, "dropout": 0.1}, {"hidden": 16, "patience": None}]))
    settings = load_settings(path)
    assert settings == [{"mu": 2.0, "dropout": 0.1}, {"hidden": 16, "patience": None}]
    assert type(settings[0]["mu"]) is float
    path.write_text(json.dumps([{"mu": 2}, {"hidden": 16.5}]))
    with pytest.raises(ValueError, match="setting 1: bad value 16.5 for hidden"):
        load_settings(path)
    path.write_text(json.dumps([{"hidden": True}]))
    with pytest.raises(ValueError, match="bad value True for hidden"):
        load_settings(path)
    path.write_text(json.dumps({"mu": 2}))
    with pytest.raises(ValueError, match="JSON list of objects"):
        load_settings(path)
    path.write_text("[{")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_settings(path)


def test_check_settings():
    with pytest.raises(ValueError, match="listed twice"):
        check_settings([{"mu": 2.0}, {"mu": 2.0}])
    with pytest.raises(ValueError, match="hidden is both fixed by an option and swept"):
        check_settings([{"hidden": 8}], fixed=["hidden"])
    with pytest.raises(ValueError, match="3 settings exceed --max-settings 2"):
        check_settings([{"mu": 1.0}, {"mu": 2.0}, {"mu": 3.0}], max_settings=2)
    check_settings([{"mu": 1.0}, {"mu": 2.0}], fixed=["hidden"])


def test_cli_sweep_refuses_bad_grids(small_csbm, capsys):
    assert cli.main(["sweep", "--grid", "momentum=0.9", "--no-progress"]) == 2
    assert "unknown setting 'momentum'" in capsys.readouterr().err
    assert cli.main(["sweep", "--grid", "mu=1,2,3", "hidden=8,16", "--max-settings", "5",
                     "--no-progress"]) == 2
    assert "6 settings exceed --max-settings 5" in capsys.readouterr().err
    assert cli.main(["sweep", "--grid", "hidden=8", "--hidden", "16", "--no-progress"]) == 2
    assert "both fixed" in capsys.readouterr().err
    # a value of the right type the model refuses is caught before any training
    assert cli.main(["sweep", "--grid", "dropout=0.5,1.5", "--no-progress"]) == 2
    assert "setting 1 (dropout=1.5): dropout must be a number in [0, 1)" in \
        capsys.readouterr().err
    with pytest.raises(SystemExit):  # --grid or --settings is required
        cli.main(["sweep"])


# ------------------------------------------------------------------- selection --

# mu -> (validation accuracies, test accuracies) per split; the best test accuracies belong
# to settings that are not the best on validation (mu 3 ties mu 2 on validation)
SYNTHETIC = {1.0: ([0.7013, 0.7021], [0.9137, 0.9241]),
             2.0: ([0.8107, 0.8203], [0.6131, 0.6229]),
             3.0: ([0.8203, 0.8107], [0.9719, 0.9823])}


def _fake_train(calls):
    def train(dataset, config, splits=None, progress=True, on_split=None, **kw):
        calls.append((config.mu, list(splits)))
        val, test = SYNTHETIC[config.mu]
        run = RunResult(dataset.name, config.laplacian, config, environment={"device": "cpu"})
        for k in splits:
            run.splits.append(SplitResult(k, test[k], val[k], 3 + k, 10, 0.5, 1.0, 1.0))
        return run
    return train


def test_selection_reads_validation_only(small_csbm, monkeypatch, tmp_path, capsys):
    import dignn.training
    calls = []
    monkeypatch.setattr(dignn.training, "train", _fake_train(calls))
    out = tmp_path / "sweep.json"
    assert cli.main(["sweep", "--grid", "mu=1,2,3", "--splits", "0,1", "--no-progress",
                     "--json", str(out)]) == 0
    assert calls == [(1.0, [0, 1]), (2.0, [0, 1]), (3.0, [0, 1])]
    text = out.read_text()
    record = json.loads(text)
    chosen = record["chosen"]
    assert chosen["overrides"] == {"mu": 2.0} and chosen["index"] == 1  # tie: first listed
    assert chosen["test_acc"] == [0.6131, 0.6229]
    assert chosen["test_mean"] == pytest.approx(0.618)
    assert chosen["config"]["mu"] == 2.0
    assert [s["val_mean"] for s in record["settings"]] == pytest.approx([0.7017, 0.8155,
                                                                         0.8155])
    assert record["settings"][0]["best_epoch"] == [3, 4]
    assert all(not any("test" in key for key in s) for s in record["settings"])
    printed = capsys.readouterr().out
    for value in (0.9137, 0.9241, 0.9719, 0.9823):  # the other settings' test accuracies
        assert str(value) not in text
        assert f"{100 * value:.2f}" not in printed
    assert "61.31" in printed and "62.29" in printed
    assert "test accuracy of the chosen setting 61.80" in printed
    assert "81.55 +- 0.68" in printed  # the table's validation mean +- std of mu 2 and 3
    assert "chosen: setting 1 (mu=2.0)" in printed
    for key in ("command", "wall_seconds", "peak_rss_gb", "device", "selection"):
        assert key in record


def test_select_setting_ranks_nan_last_and_breaks_ties_by_order():
    from dignn.sweep import SettingResult
    results = [SettingResult(k, {}, [0], [v], [1], 0.0)
               for k, v in enumerate([math.nan, 0.5, 0.7, 0.7])]
    assert select_setting(results) == 2
    assert select_setting(results[:1]) == 0


# ---------------------------------------------------------------------------- GIN --

def _fold(k, history):
    return SplitResult(k, max(history), max(history), 1, len(history), 0.0, 1.0, 1.0,
                       val_history=list(history), test_history=list(history))


def test_gin_score_is_the_best_epoch_of_the_mean():
    # epoch means: 0.6, 0.7, 0.7 -> the earliest best epoch, 2; per-fold maxima would
    # give (0.8 + 0.9 + 0.7) / 3 = 0.8 instead
    folds = [_fold(0, [0.5, 0.8, 0.7]), _fold(1, [0.6, 0.6, 0.9]), _fold(2, [0.7, 0.7, 0.5])]
    score = gin_score(folds)
    assert score.epoch == 2
    assert score.per_fold == [0.8, 0.6, 0.7]
    assert score.mean == pytest.approx(0.7)
    assert score.std == pytest.approx(0.1)  # sqrt((0.1^2 + 0.1^2 + 0) / 2)
    assert score.mean_by_epoch == pytest.approx([0.6, 0.7, 0.7])
    assert score.folds == [0, 1, 2]
    record = score.to_json()
    assert record["protocol_description"] == GIN_DESCRIPTION and record["epoch"] == 2
    with pytest.raises(ValueError, match="same, non-zero number of epochs"):
        gin_score([_fold(0, [0.5, 0.6]), _fold(1, [0.5])])
    with pytest.raises(ValueError, match="at least one fold"):
        gin_score([])


def test_gin_folds_train_on_nine_and_hold_out_each_item_once():
    y = torch.tensor([0] * 47 + [1] * 31 + [2] * 22)
    folds = gin_folds(y)
    holdout = stratified_folds(y, 10)
    assert len(folds) == 10
    held = torch.cat([f.test for f in folds])
    assert sorted(held.tolist()) == list(range(100))  # each item held out exactly once
    for k, f in enumerate(folds):
        assert torch.equal(f.val, f.test)
        assert torch.equal(f.test, holdout[k].test)  # the same folds as the holdout splits
        assert set(f.train.tolist()).isdisjoint(f.test.tolist())
        assert f.train.numel() + f.test.numel() == 100
        for c, n in ((0, 47), (1, 31), (2, 22)):  # stratified: n / 10 per fold, +-1
            assert abs(int((y[f.test] == c).sum()) - n / 10) < 1
    # nine folds train: the union of the other folds' held-out items
    others = torch.cat([folds[j].test for j in range(10) if j != 3])
    assert sorted(others.tolist()) == folds[3].train.tolist()


def _toy_graphs(n=20):
    from torch_geometric.data import Data
    graphs = []
    for k in range(n):
        ei = torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]])
        graphs.append(Data(x=torch.randn(3, 4), edge_index=ei, y=torch.tensor([k % 2])))
    y = torch.tensor([k % 2 for k in range(n)])
    return GraphDataset("toy", graphs, 4, 2, stratified_folds(y, 5))


def test_gin_protocol_is_for_graph_datasets_without_patience():
    with pytest.raises(ValueError, match="for graph classification datasets; csbm"):
        apply_protocol(csbm(**SMALL_CSBM), "gin")
    with pytest.raises(ValueError, match="protocol must be one of"):
        apply_protocol(csbm(**SMALL_CSBM), "kfold")
    toy = _toy_graphs()
    assert apply_protocol(toy, "holdout") is toy
    gin = apply_protocol(toy, "gin")
    assert len(gin.splits) == 10 and "GIN protocol" in gin.description
    assert len(toy.splits) == 5  # the original is left alone
    with pytest.raises(ValueError, match="drop --patience"):
        check_protocol_config("gin", TrainConfig(patience=5))
    check_protocol_config("holdout", TrainConfig(patience=5))


def test_gin_sweep_ranks_by_the_cv_number(monkeypatch):
    """Under gin a setting's score is its CV accuracy (held-out mean at the best common
    epoch), not the mean of per-fold maxima: mu 1 has the higher per-fold maxima."""
    import dignn.training
    histories = {1.0: [[0.9, 0.1], [0.1, 0.9]],  # CV: 0.5 at epoch 1; maxima: 0.9
                 2.0: [[0.7, 0.6], [0.7, 0.8]]}  # CV: 0.7 at epoch 1 (tie: earliest)
    seen = []

    def fake(dataset, config, splits=None, progress=True, on_split=None, **kw):
        seen.append([torch.equal(dataset.splits[k].val, dataset.splits[k].test)
                     for k in splits])
        run = RunResult(dataset.name, config.laplacian, config)
        run.splits = [_fold(k, h) for k, h in zip(splits, histories[config.mu])]
        return run
    monkeypatch.setattr(dignn.training, "train", fake)
    result = run_sweep(_toy_graphs(), TrainConfig(hidden=4, epochs=2),
                       [{"mu": 1.0}, {"mu": 2.0}], splits=[0, 1], protocol="gin")
    assert seen == [[True, True], [True, True]]  # trained on the GIN folds
    assert result.chosen == 1 and result.best.gin.epoch == 1
    assert result.test_acc == [0.7, 0.7] and result.test_std == 0.0
    assert result.settings[0].val_mean == pytest.approx(0.5)
    record = result.to_json()
    assert record["protocol_description"] == GIN_DESCRIPTION
    assert record["settings"][0]["cv_acc"] == [0.9, 0.1]
    assert record["chosen"]["epoch"] == 1
    with pytest.raises(ValueError, match="setting 0 \\(patience=3\\): patience=3"):
        run_sweep(_toy_graphs(), TrainConfig(hidden=4), [{"patience": 3}], protocol="gin")


# ---------------------------------------------------------------- end to end (CLI) --

def test_cli_sweep_end_to_end(small_csbm, tmp_path, capsys):
    out = tmp_path / "sweep.json"
    assert cli.main(["sweep", "--dataset", "csbm", "--grid", "mu=2.5,3", "--splits", "0,1",
                     "--epochs", "2", "--hidden", "8", "--no-progress", "--json",
                     str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["dataset"] == "csbm" and record["protocol"] == "holdout"
    assert [s["overrides"] for s in record["settings"]] == [{"mu": 2.5}, {"mu": 3.0}]
    for s in record["settings"]:
        assert s["splits"] == [0, 1] and len(s["val_acc"]) == 2
        assert s["val_mean"] == pytest.approx(sum(s["val_acc"]) / 2)
        assert all(1 <= e <= 2 for e in s["best_epoch"]) and s["seconds"] >= 0
    means = [s["val_mean"] for s in record["settings"]]
    chosen = record["chosen"]
    assert chosen["index"] == (1 if means[1] > means[0] else 0)
    assert len(chosen["test_acc"]) == 2 and all(0 <= a <= 1 for a in chosen["test_acc"])
    assert chosen["config"]["hidden"] == 8 and chosen["config"]["epochs"] == 2
    assert chosen["config"]["mu"] == chosen["overrides"]["mu"]
    assert record["base_config"]["hidden"] == 8
    for key in ("command", "device", "torch", "wall_seconds", "peak_rss_gb"):
        assert key in record
    printed = capsys.readouterr().out
    assert "val acc % (mean +- std over 2 splits)" in printed
    assert "test accuracy of the chosen setting" in printed


def test_cli_train_gin_refused_on_node_datasets(small_csbm, capsys):
    assert cli.main(["train", "--protocol", "gin", "--epochs", "1", "--no-progress"]) == 2
    assert "use --protocol holdout" in capsys.readouterr().err


@pytest.mark.skipif(not (DATA_ROOT / "MUTAG").exists(), reason="shared datasets not found")
def test_cli_train_mutag_gin_protocol(tmp_path, capsys):
    out = tmp_path / "gin.json"
    assert cli.main(["train", "--dataset", "mutag", "--data-root", str(DATA_ROOT),
                     "--cache-dir", str(tmp_path / "cache"), "--protocol", "gin",
                     "--epochs", "2", "--splits", "0,1", "--hidden", "8", "--no-progress",
                     "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["protocol"] == "gin" and record["protocol_description"] == GIN_DESCRIPTION
    assert record["splits"] == [0, 1] and len(record["test_acc"]) == 2
    assert record["epoch"] in (1, 2) and len(record["cv_mean_by_epoch"]) == 2
    assert record["mean"] == pytest.approx(sum(record["test_acc"]) / 2)
    assert record["mean"] == pytest.approx(max(record["cv_mean_by_epoch"]))
    assert "val_acc" not in record and "best_epoch" not in record
    # each held-out fold of MUTAG has 18 or 19 of its 188 graphs
    assert all(any(abs(a * n - round(a * n)) < 1e-9 for n in (18, 19))
               for a in record["test_acc"])
    printed = capsys.readouterr().out
    assert GIN_DESCRIPTION in printed and "over 2 fold(s)" in printed
