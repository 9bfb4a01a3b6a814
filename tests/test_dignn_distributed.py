"""``python -m dignn``, per-epoch loss histories, checkpoints and resuming, and training
across processes (``dignn train --distributed``, issue 15)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from dignn import cli
from dignn.data import csbm
from dignn.presets import TrainConfig
from dignn.training import build_model, train

SMALL_CSBM = dict(num_nodes=300, num_classes=3, num_features=16, avg_degree=8,
                  homophily=0.8, signal=1.0, num_splits=3)
PYTHON_PATH = os.pathsep.join([str(Path(__file__).resolve().parents[1] / "python"),
                               os.environ.get("PYTHONPATH", "")])

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def graph():
    return csbm(**SMALL_CSBM)


def _run(args, cwd, timeout=300, **kw):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": PYTHON_PATH}
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env=env, **kw)


# ------------------------------------------------------------------- python -m dignn --

def test_python_m_dignn_help_is_the_commands():
    proc = _run([sys.executable, "-m", "dignn", "--help"], cwd=Path.cwd())
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == cli.build_parser().format_help()


@pytest.mark.slow  # a subprocess that trains: a few seconds
def test_python_m_dignn_trains_like_the_command(tmp_path, monkeypatch):
    """``python -m dignn train ...`` in a fresh process writes the record ``dignn train``
    writes in this one (same scores, same per-epoch losses)."""
    argv = ["train", "--splits", "1", "--epochs", "3", "--hidden", "8", "--no-progress",
            "--laplacian", "rw"]
    proc = _run([sys.executable, "-m", "dignn"] + argv + ["--json", str(tmp_path / "m.json")],
                cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "split 1: test acc" in proc.stdout
    assert cli.main(argv + ["--json", str(tmp_path / "c.json")]) == 0
    by_module, by_cli = (json.loads((tmp_path / f"{n}.json").read_text()) for n in "mc")
    for key in ("test_acc", "val_acc", "best_epoch", "train_loss_history", "config"):
        assert by_module[key] == by_cli[key]


# --------------------------------------------------------------- train_loss_history --

def test_train_loss_history_holds_every_epochs_training_loss(graph, tmp_path):
    config = TrainConfig(hidden=8, epochs=4, lr=0.05, max_iter=4, dropout=0.3)
    run = train(graph, config, splits=[0, 2], progress=False, sync_every=3)
    for s, split in zip(run.splits, (0, 2)):
        assert len(s.train_loss_history) == s.epochs_run == 4
        # epoch 1's loss is that of the fresh model, seeded as training seeds it, in
        # training mode (dropout drawn from the same generator state)
        torch.manual_seed(config.seed + split)
        model = build_model(graph, config)
        model.train()
        idx = graph.splits[split].train
        first = F.cross_entropy(model(graph.x, graph.edge_index)[idx], graph.y[idx])
        assert s.train_loss_history[0] == float(first.detach())
        assert s.train_loss_history[-1] < s.train_loss_history[0]  # it trains
    record = run.to_json()
    assert record["train_loss_history"] == [s.train_loss_history for s in run.splits]


def test_train_loss_history_stops_with_patience(graph):
    config = TrainConfig(hidden=8, epochs=200, patience=3, lr=0.05, max_iter=4, mu=4.0)
    s = train(graph, config, splits=[0], progress=False, sync_every=7).splits[0]
    assert s.epochs_run < 200
    assert len(s.train_loss_history) == len(s.val_history) == s.epochs_run
