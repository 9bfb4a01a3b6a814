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


# --------------------------------------------------------- checkpoints and resuming --

class _Crash(Exception):
    pass


def _crash_after_steps(monkeypatch, steps):
    """Makes Adam fail on its step number ``steps + 1``, as a process killed there would
    stop."""
    count = {"steps": 0}
    step = torch.optim.Adam.step

    def counted(self, *args, **kw):
        count["steps"] += 1
        if count["steps"] > steps:
            raise _Crash(f"killed at step {count['steps']}")
        return step(self, *args, **kw)
    monkeypatch.setattr(torch.optim.Adam, "step", counted)


def _same_results(a, b):
    assert [s.split for s in a.splits] == [s.split for s in b.splits]
    for x, y in zip(a.splits, b.splits):
        assert x.train_loss_history == y.train_loss_history  # exactly
        assert x.val_history == y.val_history and x.test_history == y.test_history
        assert (x.test_acc, x.val_acc, x.best_epoch, x.epochs_run) == \
            (y.test_acc, y.val_acc, y.best_epoch, y.epochs_run)


def test_resume_reproduces_the_uninterrupted_run(graph, tmp_path, monkeypatch):
    from dignn.training import Checkpointing
    config = TrainConfig(hidden=8, epochs=7, lr=0.05, max_iter=4, dropout=0.5, mu=4.0)
    whole = train(graph, config, splits=[0, 2], progress=False)
    path = tmp_path / "run.ckpt"
    with monkeypatch.context() as m:
        _crash_after_steps(m, 7 + 5)  # split 0 done, split 2 killed in epoch 6
        with pytest.raises(_Crash):
            train(graph, config, splits=[0, 2], progress=False,
                  checkpoint=Checkpointing(path, every=2))
    state = torch.load(path, weights_only=True)
    assert [r["split"] for r in state["finished"]] == [0]
    assert (state["current"]["split"], state["current"]["epoch"]) == (2, 4)
    assert not list(tmp_path.glob(".*.tmp"))  # written through a renamed temporary file
    seen = []
    resumed = train(graph, config, splits=[0, 2], progress=False, on_split=seen.append,
                    checkpoint=Checkpointing(path, every=2, resume=True))
    _same_results(resumed, whole)
    assert [s.split for s in seen] == [0, 2]
    state = torch.load(path, weights_only=True)
    assert [r["split"] for r in state["finished"]] == [0, 2] and state["current"] is None


def test_resume_with_batches_of_graphs(tmp_path, monkeypatch):
    """A graph-classification run (shuffled batches: their generator is in the checkpoint)
    killed mid-split resumes to the same losses."""
    from torch_geometric.data import Data
    from dignn.data import GraphDataset, stratified_folds
    from dignn.training import Checkpointing
    gen = torch.Generator().manual_seed(0)
    graphs = []
    for k in range(24):
        n = 5 + k % 4
        ei = torch.randint(0, n, (2, 2 * n), generator=gen)
        ei = torch.cat([ei, ei.flip(0)], 1)
        graphs.append(Data(x=torch.randn(n, 3, generator=gen), edge_index=ei,
                           y=torch.tensor([k % 2])))
    dataset = GraphDataset("toy", graphs, 3, 2, stratified_folds(torch.tensor(
        [k % 2 for k in range(24)]), 4))
    config = TrainConfig(hidden=8, lr=0.02, epochs=6, dropout=0.2, max_iter=5, mu=3.0,
                         batch_size=6)
    whole = train(dataset, config, splits=[1], progress=False)
    path = tmp_path / "sub" / "g.ckpt"
    steps_per_epoch = 2  # 12 training graphs (2 of the 4 folds) in batches of 6
    with monkeypatch.context() as m:
        _crash_after_steps(m, 4 * steps_per_epoch - 1)
        with pytest.raises(_Crash):
            train(dataset, config, splits=[1], progress=False,
                  checkpoint=Checkpointing(path, every=1))
    assert torch.load(path, weights_only=True)["current"]["epoch"] == 3
    resumed = train(dataset, config, splits=[1], progress=False,
                    checkpoint=Checkpointing(path, every=1, resume=True))
    _same_results(resumed, whole)


def test_resume_refuses_another_runs_checkpoint(graph, tmp_path):
    from dignn.training import Checkpointing
    config = TrainConfig(hidden=8, epochs=2, max_iter=3)
    path = tmp_path / "c.ckpt"
    with pytest.raises(ValueError, match="no checkpoint at"):
        train(graph, config, splits=[0], progress=False,
              checkpoint=Checkpointing(path, resume=True))
    train(graph, config, splits=[0], progress=False, checkpoint=Checkpointing(path))
    with pytest.raises(ValueError, match="another run.*mu"):
        train(graph, config.replace(mu=4.0), splits=[0], progress=False,
              checkpoint=Checkpointing(path, resume=True))
    with pytest.raises(ValueError, match="every must be a positive"):
        Checkpointing(path, every=0)


def test_cli_checkpoint_and_resume(tmp_path, monkeypatch, capsys):
    import dignn.data
    monkeypatch.setattr(dignn.data, "csbm", lambda **kw: csbm(**SMALL_CSBM))
    argv = ["train", "--splits", "0,1", "--epochs", "5", "--hidden", "8", "--no-progress",
            "--mu", "4"]
    assert cli.main(argv + ["--json", str(tmp_path / "whole.json")]) == 0
    ckpt = ["--checkpoint", str(tmp_path / "ck.pt"), "--checkpoint-every", "2"]
    with monkeypatch.context() as m:
        _crash_after_steps(m, 8)  # in split 1, epoch 4: saved at its epoch 2
        with pytest.raises(_Crash):
            cli.main(argv + ckpt)
    assert cli.main(argv + ckpt + ["--resume", "--json", str(tmp_path / "res.json")]) == 0
    whole, resumed = (json.loads((tmp_path / f"{n}.json").read_text())
                      for n in ("whole", "res"))
    assert resumed["train_loss_history"] == whole["train_loss_history"]
    assert len(whole["train_loss_history"][1]) == 5
    assert resumed["test_acc"] == whole["test_acc"]
    capsys.readouterr()
    assert cli.main(argv + ["--resume"]) == 2
    assert "--resume and --checkpoint-every need --checkpoint" in capsys.readouterr().err
