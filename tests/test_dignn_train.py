"""Training, presets, the ``dignn`` command (train --json, plot) on small generated graphs."""
import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import DATA_ROOT
from dignn import cli
from dignn.data import csbm, load_dataset
from dignn.presets import (PAPER_TABLE6_RW, PAPER_TABLE7_NEURAL, TrainConfig,
                           preset_config)
from dignn.training import train

SMALL_CSBM = dict(num_nodes=300, num_classes=3, num_features=16, avg_degree=8,
                  homophily=0.8, signal=1.0, num_splits=3)


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def graph():
    return csbm(**SMALL_CSBM)


@pytest.mark.parametrize("laplacian", ["neural", "rw"])
def test_training_beats_chance(graph, laplacian):
    config = TrainConfig(laplacian=laplacian, hidden=16, lr=0.02, weight_decay=5e-4,
                         dropout=0.3, max_iter=8, epochs=30, mu=2.2)
    run = train(graph, config, splits=[0, 1], progress=False)
    assert len(run.test_acc) == 2
    assert run.mean > 0.75  # chance is 1/3 (measured: about 0.9)
    for s in run.splits:
        assert 1 <= s.best_epoch <= s.epochs_run == 30
        assert s.val_acc > 0.5
        assert s.lambda_max_start > 0 and s.lambda_max_end > 0


def test_patience_stops_early(graph):
    config = TrainConfig(hidden=8, epochs=200, patience=5, lr=0.05, max_iter=4)
    run = train(graph, config, splits=[0], progress=False)
    s = run.splits[0]
    assert s.epochs_run < 200 and s.epochs_run - s.best_epoch == 5


def test_selected_weights_are_restored(graph):
    """The returned model is the one of the best validation epoch: evaluating it again gives
    the recorded test accuracy."""
    from dignn.training import train_node_split
    config = TrainConfig(hidden=8, epochs=15, lr=0.05, max_iter=4)
    result = train_node_split(graph, config, 0, progress=False, keep_model=True)
    result.model.eval()
    with torch.no_grad():
        logits = result.model(graph.x, graph.edge_index)
    test = graph.splits[0].test
    acc = float((logits[test].argmax(1) == graph.y[test]).double().mean())
    assert acc == pytest.approx(result.test_acc)


def test_run_statistics():
    from dignn.training import RunResult, SplitResult
    run = RunResult("x", "neural", TrainConfig())
    for k, acc in enumerate([0.5, 0.7, 0.9]):
        run.splits.append(SplitResult(k, acc, acc, 1, 1, 0.0, 0.0, 0.0))
    assert run.mean == pytest.approx(0.7)
    assert run.std == pytest.approx(0.2)  # sample standard deviation
    record = run.to_json()
    assert record["test_acc"] == [0.5, 0.7, 0.9]


def test_bad_split_indices(graph):
    with pytest.raises(ValueError, match="splits must be indices in 0..2"):
        train(graph, TrainConfig(epochs=1), splits=[3], progress=False)


def test_paper_presets():
    """The tables are transcribed as in the appendix (a few spot checks), with each
    dataset's input unit."""
    assert PAPER_TABLE7_NEURAL["chameleon"] == dict(mu=2.2, hidden=128, lr=0.01,
                                                    weight_decay=0, max_iter=10, tol=1e-6,
                                                    dropout=0.5)
    assert PAPER_TABLE7_NEURAL["penn94"]["mu"] == 1.25 and PAPER_TABLE6_RW["penn94"]["mu"] == 2.1
    assert PAPER_TABLE6_RW["amherst41"]["weight_decay"] == 1e-4
    c = preset_config("cornell5", "neural", "paper")
    assert (c.input_unit, c.max_iter, c.hidden, c.dropout) == ("linkx", 4, 32, 0.75)
    assert preset_config("chameleon", preset="paper").input_unit == "adj"
    assert preset_config("mutag", preset="paper").pooling == "add"
    assert preset_config("cora", "rw", "paper", epochs=7, mu=None).epochs == 7
    with pytest.raises(ValueError, match="preset"):
        preset_config("cora", preset="best")
    with pytest.raises(ValueError, match="no preset"):
        preset_config("squirrel2")


def test_graph_classification_trains(tmp_path):
    """A tiny two-class graph set the 1-layer-MLP + implicit + pooling model must learn:
    class 1 graphs are cycles, class 0 graphs are stars; node features are one-hot degrees
    (capped at 3)."""
    from torch_geometric.data import Data
    from dignn.data import GraphDataset, stratified_folds
    graphs = []
    for k in range(40):
        n = 6 + k % 5
        if k % 2:
            src = torch.arange(n)
            ei = torch.stack([src, (src + 1) % n])
        else:
            ei = torch.stack([torch.zeros(n - 1, dtype=torch.long), torch.arange(1, n)])
        ei = torch.cat([ei, ei.flip(0)], 1)
        degree = torch.bincount(ei[1], minlength=n).clamp_max(3)
        graphs.append(Data(x=torch.nn.functional.one_hot(degree, 4).float(), edge_index=ei,
                           y=torch.tensor([k % 2])))
    from torch_geometric.data import InMemoryDataset

    class Graphs(InMemoryDataset):
        def __init__(self):
            super().__init__(str(tmp_path))
            self.data, self.slices = self.collate(graphs)
    ds = Graphs()
    y = torch.tensor([k % 2 for k in range(40)])
    dataset = GraphDataset("toy", ds, 4, 2, stratified_folds(y, 5))
    config = TrainConfig(hidden=16, lr=0.02, epochs=30, dropout=0.0, max_iter=10, mu=2.5,
                         batch_size=8)
    run = train(dataset, config, splits=[0], progress=False)
    assert run.mean >= 0.875  # 8 test graphs; chance is 0.5


# ---------------------------------------------------------------------------- CLI --

def _schema_ok(record):
    assert {"dataset", "laplacian", "test_acc", "mean", "std"} <= set(record)
    assert all(0.0 <= a <= 1.0 for a in record["test_acc"])
    assert record["mean"] == pytest.approx(sum(record["test_acc"]) / len(record["test_acc"]))


def test_cli_train_json(tmp_path, capsys, monkeypatch):
    # a smaller CSBM than the default so the test is fast; the command path is the real one
    import dignn.data
    monkeypatch.setattr(dignn.data, "csbm", lambda **kw: csbm(**SMALL_CSBM))
    out = tmp_path / "r.json"
    argv = ["train", "--splits", "0,2", "--epochs", "5", "--json", str(out), "--no-progress",
            "--hidden", "8"]
    assert cli.main(argv) == 0
    record = json.loads(out.read_text())
    _schema_ok(record)
    assert record["command"] == "dignn " + " ".join(argv)  # what was run, not sys.argv
    assert 0 < record["peak_rss_gb"] < 64 and record["wall_seconds"] > 0
    import torch_geometric
    assert record["torch_geometric"] == torch_geometric.__version__
    assert record["dataset"] == "csbm" and record["laplacian"] == "neural"
    assert len(record["test_acc"]) == 2 and record["splits"] == [0, 2]
    assert record["config"]["hidden"] == 8 and record["config"]["epochs"] == 5
    printed = capsys.readouterr().out
    assert "split 0: test acc" in printed and "split 2: test acc" in printed
    assert "+-" in printed
    import re
    import time
    from dignn.device import source_commit
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", record["date"])
    assert record["date"][:10] == time.strftime("%Y-%m-%d", time.gmtime())
    assert record.get("commit") == source_commit()  # None (absent) for an installed copy


def test_a_record_names_the_checkouts_commit_only_for_its_own_files(tmp_path, monkeypatch):
    """``source_commit``: the commit of a checkout whose tracked files are the package's; a
    copy of the package in an untracked folder inside a checkout is not that commit's."""
    import dignn.device
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "venv").mkdir()  # an install inside the checkout, not tracked
    for where in ("pkg", "venv"):
        (repo / where / "device.py").write_text("x = 1\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(git + ["add", "pkg/device.py"], check=True)
    subprocess.run(git + ["commit", "-qm", "x"], check=True)
    head = subprocess.run(git + ["rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    read = dignn.device.source_commit.__wrapped__  # uncached
    monkeypatch.setattr(dignn.device, "__file__", str(repo / "pkg" / "device.py"))
    assert read() == head
    (repo / "pkg" / "device.py").write_text("x = 2\n")
    assert read() == head + " (with uncommitted changes)"
    monkeypatch.setattr(dignn.device, "__file__", str(repo / "venv" / "device.py"))
    assert read() is None


def test_cli_errors(capsys, tmp_path):
    with pytest.raises(SystemExit):
        cli.main(["train", "--splits", "a,b"])
    with pytest.raises(SystemExit):
        cli.main(["train", "--dataset", "imagenet"])
    assert cli.main(["train", "--dataset", "cora", "--data-root", str(tmp_path / "none"),
                     "--no-progress"]) == 2
    assert "data_root" in capsys.readouterr().err


@pytest.mark.slow  # a subprocess or a compile: seconds; `-m "not slow"` leaves it out
def test_console_script_runs(tmp_path):
    """The installed ``dignn`` command (``python -m dignn.cli`` where the script is not on
    disk) in a fresh process, started outside the source tree so that the installed packages
    are the ones imported."""
    import shutil
    out = tmp_path / "r.json"
    script = shutil.which("dignn", path=os.path.dirname(sys.executable))
    command = [script] if script else [sys.executable, "-m", "dignn.cli"]
    proc = subprocess.run(command + ["train", "--splits", "0", "--epochs", "2", "--hidden", "8",
                                     "--json", str(out), "--no-progress", "--laplacian", "rw"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    record = json.loads(out.read_text())
    _schema_ok(record)
    assert record["laplacian"] == "rw" and len(record["test_acc"]) == 1


def test_cli_plots(tmp_path, monkeypatch):
    import dignn.data
    monkeypatch.setattr(dignn.data, "csbm", lambda **kw: csbm(**SMALL_CSBM))
    png = tmp_path / "conv.png"
    record = tmp_path / "conv.json"
    assert cli.main(["plot", "convergence", "--epochs", "3", "--max-iter", "12", "--out",
                     str(png), "--json", str(record)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    residuals = json.loads(record.read_text())["csbm"]["residuals"]
    assert len(residuals) == 12 and residuals[-1] < residuals[0]
    png = tmp_path / "mu.png"
    record = tmp_path / "mu.json"
    assert cli.main(["plot", "mu", "--mus", "1,3", "--epochs", "3", "--out", str(png),
                     "--json", str(record)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    study = json.loads(record.read_text())
    assert study["mu"] == [1.0, 3.0] and len(study["gap"]) == 2
    # spectral normalization keeps lambda_max bounded; a larger mu converges faster
    assert study["residual"][1] < study["residual"][0]


@pytest.mark.skipif(not (DATA_ROOT / "MUTAG").exists(), reason="shared datasets not found")
def test_mutag_one_fold_runs(tmp_path):
    dataset = load_dataset("mutag", DATA_ROOT, tmp_path)
    config = preset_config("mutag", epochs=3)
    run = train(dataset, config, splits=[0], progress=False)
    assert 0.0 <= run.mean <= 1.0 and run.splits[0].epochs_run == 3


def test_solver_option_reaches_the_layer(graph):
    """``solver`` in the config picks the implicit layer's solver; with cg the model's
    diffusion output solves Z + Delta Z / mu = X even with mu below lambda_max, where the
    paper's fixed-point iteration diverges."""
    from dignn.spectral import apply_laplacian, estimate_lambda_max, laplacian_operator
    from dignn.training import build_model
    torch.manual_seed(0)
    config = TrainConfig(hidden=8, max_iter=300, tol=1e-7, solver="cg")
    model = build_model(graph, config).eval()
    assert model.diffusion.solver == "cg"
    with torch.no_grad():
        h = model.diffusion_input(graph.x, graph.edge_index)
        op = laplacian_operator(model.diffusion, h, graph.edge_index)
        mu = 0.5 * estimate_lambda_max(op).lambda_max
        model.diffusion.mu = mu
        z = model.diffusion(h, graph.edge_index)
        equation = z + apply_laplacian(op, z) / mu - h
    assert model.diffusion.solver_used == "cg"
    assert float(equation.norm() / h.norm()) < 1e-4
    model.diffusion.solver = "fixed_point"
    with torch.no_grad():
        model.diffusion(h, graph.edge_index)
    assert not model.diffusion.relative_residual < 1e-4  # diverged, or far from converged


def test_tuned_preset_applies_listed_changes_only():
    """``tuned`` = ``paper`` plus exactly the values TUNED_CHANGES lists, each with a reason;
    explicit overrides still win."""
    from dignn.presets import TUNED_CHANGES
    for laplacian, table in TUNED_CHANGES.items():
        for name, change in table.items():
            assert change["why"] and change["values"]
            paper = preset_config(name, laplacian, "paper").as_dict()
            tuned = preset_config(name, laplacian, "tuned").as_dict()
            differs = {k for k in paper if paper[k] != tuned[k]}
            assert differs <= set(change["values"]), (name, differs)
            assert all(tuned[k] == v for k, v in change["values"].items())
    assert preset_config("mutag").solver == "cg"
    assert preset_config("mutag", solver="fixed_point").solver == "fixed_point"


def test_tuned_presets_remade_by_a_study_are_its_best_trial():
    """A tuned preset whose change names a study (``bench/results/tune_<dataset>/``) holds
    that study's best trial by mean validation accuracy (a trial of the space it records) and
    the study's epochs, and the dataset's accuracy record trained it as it is now; or, marked
    ``kept``, the values the study started from (its trial 0)."""
    from pathlib import Path
    from dignn.presets import TUNED_CHANGES
    results = Path(__file__).resolve().parents[1] / "bench" / "results"
    studied = 0
    for laplacian, table in TUNED_CHANGES.items():
        for name, change in table.items():
            if "study" not in change:
                continue
            studied += 1
            record = json.loads((results / change["study"]).read_text())
            assert record["dataset"] == name and record["protocol"] == "holdout"
            best = record["best"]
            complete = [t for t in record["trials"] if t["state"] == "COMPLETE"]
            assert best["value"] == max(t["value"] for t in complete)
            assert best["value"] == pytest.approx(sum(best["val_acc"]) / len(best["val_acc"]))
            config = preset_config(name, laplacian).as_dict()
            start = [t for t in record["trials"] if t.get("start") == "base"]
            assert [t["number"] for t in start] == [0]  # the study began from the preset
            for key, value in best["params"].items():
                dim = record["space"][key]
                assert value in dim["choices"] if "choices" in dim else \
                    dim["low"] <= value <= dim["high"]
            if change.get("kept"):  # the preset the study started from, its values unchanged
                assert all(config[k] == v for k, v in start[0]["params"].items()), name
                continue
            assert all(config[k] == v for k, v in best["params"].items()), name
            assert config["epochs"] == record["base_config"]["epochs"]
            trained = json.loads((results / f"accuracy_{name}.json").read_text())["config"]
            assert {k: v for k, v in trained.items() if config.get(k) != v} == {}, name
    assert studied >= 1


def test_cli_reorder_trains_the_same_model(tmp_path, monkeypatch):
    """``dignn train --reorder rcm`` renumbers the nodes inside the implicit layer only: the
    per-epoch losses are the run without it, up to rounding (in float64: to 1e-9)."""
    import dignn.data
    monkeypatch.setattr(dignn.data, "csbm", lambda **kw: csbm(**SMALL_CSBM))
    histories = {}
    for reorder in ("none", "rcm", "community"):
        out = tmp_path / f"{reorder}.json"
        argv = ["train", "--splits", "0", "--epochs", "4", "--hidden", "16", "--dtype",
                "float64", "--reorder", reorder, "--json", str(out), "--no-progress",
                "--threads", "1"]
        assert cli.main(argv) == 0
        record = json.loads(out.read_text())
        histories[reorder] = torch.tensor(record["train_loss_history"][0], dtype=torch.float64)
    assert histories["none"].numel() == 4
    for reorder in ("rcm", "community"):
        torch.testing.assert_close(histories[reorder], histories["none"], rtol=1e-9, atol=0)
