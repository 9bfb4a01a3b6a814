"""``python -m dignn``, per-epoch loss histories, checkpoints and resuming, and training
across processes (``dignn train --distributed``, issue 15)."""
import json
import math
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

def test_python_m_dignn_help_is_the_commands(monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")  # the same width here and in the child
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


# ------------------------------------------------------ training across processes --

from conftest import DATA_ROOT  # noqa: E402


def test_synced_batch_norm_is_batch_norm_on_one_rank(world_of_one):
    from dignn.distributed import SyncedBatchNorm
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(50, 6, generator=g, dtype=torch.float64) * 3 + 1).requires_grad_()
    plain = torch.nn.BatchNorm1d(6).double()
    with torch.no_grad():
        plain.weight.uniform_(0.5, 2.0, generator=g)
        plain.bias.uniform_(-1.0, 1.0, generator=g)
    synced = SyncedBatchNorm.convert(plain)
    assert synced.weight.dtype == torch.float64 and synced.weight is not plain.weight
    seed_grad = torch.randn(50, 6, generator=g, dtype=torch.float64)
    outs, grads = [], []
    for norm in (plain, synced):
        for _ in range(2):  # the running statistics move twice
            out = norm(x)
        (out * seed_grad).sum().backward()
        outs.append(out.detach())
        grads.append([x.grad.clone(), norm.weight.grad.clone(), norm.bias.grad.clone()])
        x.grad = None
    assert torch.allclose(outs[0], outs[1], rtol=1e-12, atol=1e-12)
    for a, b in zip(*grads):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-12)
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        assert torch.allclose(getattr(plain, name).double(), getattr(synced, name).double(),
                              rtol=1e-12)
    plain.eval(), synced.eval()
    assert torch.allclose(plain(x), synced(x), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("input_unit", ["mlp", "adj"])
def test_distributed_run_on_one_rank_is_the_single_process_run(graph, world_of_one,
                                                               input_unit):
    """The whole distributed path (shard, synced batch norm, global-mask dropout, reduced
    loss, gradients and metrics) in a world of one process: the single-process losses."""
    from dignn.distributed import DistributedRun, load_partition
    config = TrainConfig(hidden=8, epochs=4, lr=0.05, max_iter=4, dropout=0.4, mu=4.0,
                         input_unit=input_unit, dtype="float64")
    single = train(graph, config, splits=[1], progress=False, device="cpu")
    fit = DistributedRun(graph, config, load_partition(graph, 1), torch.device("cpu"))
    shared = train(graph, config, splits=[1], progress=False, device="cpu", fit=fit)
    a, b = single.splits[0], shared.splits[0]
    assert len(b.train_loss_history) == 4
    for x, y in zip(a.train_loss_history + a.val_history, b.train_loss_history + b.val_history):
        assert y == pytest.approx(x, rel=1e-12)
    assert (a.best_epoch, a.test_acc) == (b.best_epoch, b.test_acc)
    assert math.isnan(b.lambda_max_start)  # the spectral check needs the whole graph


def test_distributed_needs_torchrun_and_a_node_dataset(capsys, monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    assert cli.main(["train", "--distributed", "--no-progress"]) == 2
    assert "runs under torchrun" in capsys.readouterr().err
    assert cli.main(["train", "--partition-file", "p.pt", "--no-progress"]) == 2
    assert "--partition-file applies to --distributed" in capsys.readouterr().err


CHILD_PATH = os.pathsep.join(
    [str(Path(__import__(m).__file__).resolve().parents[1]) for m in ("dignn", "dignn_kernels")]
    + [os.environ.get("PYTHONPATH", "")])
# Two epochs: the first loss is the distributed forward's, the second the loss after one
# Adam step on the all-reduced gradients (a third epoch repeats that path on cornell5, several
# seconds per torchrun).
EPOCHS = 2
CORNELL5 = ["--dataset", "cornell5", "--data-root", str(DATA_ROOT), "--splits", "0",
            "--epochs", str(EPOCHS), "--hidden", "8", "--dtype", "float64", "--no-progress"]


def _child_env(**extra):
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": CHILD_PATH, **extra}


def _torchrun(nproc, args, cwd, program=("-m", "dignn"), timeout=600):
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", str(nproc), *program, "train", "--distributed", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env=_child_env())


@pytest.fixture(scope="module")
def cornell5_single(tmp_path_factory):
    """cornell5's cache and the single-process run of CORNELL5 (float64)."""
    if not (DATA_ROOT / "cornell5" / "raw" / "data.mat").exists():
        pytest.skip(f"cornell5 not found under {DATA_ROOT} (DIGNN_DATA)")
    from dignn.data import load_dataset
    from dignn.presets import preset_config
    cache = tmp_path_factory.mktemp("cornell5_cache")
    dataset = load_dataset("cornell5", DATA_ROOT, cache)
    config = preset_config("cornell5", "neural", hidden=8, epochs=EPOCHS, dtype="float64")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run = train(dataset, config, splits=[0], progress=False, device="cpu")
    finally:
        torch.set_num_threads(before)
    return cache, run.splits[0]


def _assert_same_losses(record, single, rel=1e-10):
    history = record["train_loss_history"][0]
    assert len(history) == len(single.train_loss_history)
    for got, want in zip(history, single.train_loss_history):
        assert got == pytest.approx(want, rel=rel)
    assert record["val_acc"] == [pytest.approx(single.val_acc, rel=1e-12)]
    assert record["best_epoch"] == [single.best_epoch]


@pytest.mark.slow  # torchrun: 3 processes, cornell5 loaded by each
def test_distributed_float32_losses_equal_the_single_process_run(cornell5_single, tmp_path):
    """In float32 the ranks sum in another order than one process: the per-epoch losses
    agree to rounding, 1e-5 relative over these epochs."""
    from dignn.data import load_dataset
    from dignn.presets import preset_config
    cache, _ = cornell5_single
    config = preset_config("cornell5", "neural", hidden=8, epochs=EPOCHS, dtype="float32")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        single = train(load_dataset("cornell5", DATA_ROOT, cache), config, splits=[0],
                       progress=False, device="cpu").splits[0]
    finally:
        torch.set_num_threads(before)
    out = tmp_path / "r.json"
    args = [a if a != "float64" else "float32" for a in CORNELL5]
    proc = _torchrun(3, args + ["--cache-dir", str(cache), "--json", str(out)], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    history = json.loads(out.read_text())["train_loss_history"][0]
    assert len(history) == EPOCHS
    for got, want in zip(history, single.train_loss_history):
        assert got == pytest.approx(want, rel=1e-5)


@pytest.mark.slow  # torchrun: a few processes, cornell5 loaded by each
# one process (no halo), one peer, several peers (three ranks run in the float32 test above)
@pytest.mark.parametrize("world", [1, 2, 4])
def test_distributed_losses_equal_the_single_process_run(cornell5_single, tmp_path, world):
    cache, single = cornell5_single
    out = tmp_path / "r.json"
    proc = _torchrun(world, CORNELL5 + ["--cache-dir", str(cache), "--json", str(out)],
                     tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads(out.read_text())
    _assert_same_losses(record, single)
    assert record["distributed"]["world_size"] == world
    assert len(record["distributed"]["peak_memory_per_rank"]) == world
    assert sum(record["distributed"]["partition"]["owned_nodes"]) == 18660
    assert proc.stdout.count("split 0: test acc") == 1  # rank 0 alone prints


@pytest.mark.slow
def test_metis_partition_written_once_and_reused(cornell5_single, tmp_path):
    from dignn_kernels.distributed import GraphPartition
    cache, single = cornell5_single
    part = tmp_path / "parts" / "cornell5-2.pt"
    args = CORNELL5 + ["--cache-dir", str(cache), "--partition", "metis",
                       "--partition-file", str(part)]
    for name in ("first", "again"):
        proc = _torchrun(2, args + ["--json", str(tmp_path / f"{name}.json")], tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        _assert_same_losses(json.loads((tmp_path / f"{name}.json").read_text()), single)
        if name == "first":
            written = part.stat().st_mtime_ns
    assert part.stat().st_mtime_ns == written  # read, not partitioned again
    loaded = GraphPartition.load(part)
    assert (loaded.method, loaded.parts, loaded.num_nodes) == ("metis", 2, 18660)
    proc = _torchrun(3, args, tmp_path)  # a file of 2 parts for 3 processes
    assert proc.returncode != 0 and "one per rank" in proc.stderr


CRASHING_RANK = '''
import os, sys, time
import torch
from dignn.cli import main

if os.environ["RANK"] == os.environ["CRASH_RANK"]:
    step, count = torch.optim.Adam.step, [0]

    def counted(self, *args, **kw):
        count[0] += 1
        if count[0] > int(os.environ["CRASH_AFTER_STEPS"]):
            if os.environ["CRASH_MODE"] == "silent":
                time.sleep(3600)
            os._exit(17)
        return step(self, *args, **kw)
    torch.optim.Adam.step = counted
sys.exit(main())
'''


@pytest.mark.slow
def test_distributed_resume_after_a_rank_dies(cornell5_single, tmp_path):
    """Rank 1 dies in epoch 2; resuming from the checkpoint of epoch 1 gives the losses of
    the uninterrupted (single-process) run."""
    cache, single = cornell5_single
    script = tmp_path / "crashing_rank.py"
    script.write_text(CRASHING_RANK)
    ckpt = tmp_path / "run.ckpt"
    args = CORNELL5 + ["--cache-dir", str(cache), "--checkpoint", str(ckpt),
                       "--checkpoint-every", "1"]
    os.environ.update(CRASH_RANK="1", CRASH_AFTER_STEPS=str(EPOCHS - 1), CRASH_MODE="dead")
    try:
        proc = _torchrun(2, args, tmp_path, program=(str(script),))
    finally:
        for key in ("CRASH_RANK", "CRASH_AFTER_STEPS", "CRASH_MODE"):
            os.environ.pop(key)
    assert proc.returncode != 0
    state = torch.load(ckpt, weights_only=True)
    assert (state["current"]["split"], state["current"]["epoch"]) == (0, EPOCHS - 1)
    out = tmp_path / "resumed.json"
    proc = _torchrun(2, args + ["--resume", "--json", str(out)], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _assert_same_losses(json.loads(out.read_text()), single)


def _free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.xdist_group("rendezvous")  # a localhost port (tests/conftest.py)
@pytest.mark.parametrize("mode", ["dead", "silent"])
def test_a_failed_rank_stops_the_others_within_the_timeout(tmp_path, mode):
    """Two ranks started by hand (no torchrun agent to kill the survivor): rank 1 exits, or
    hangs, in its third step; rank 0 stops with an error naming itself within --timeout."""
    script = tmp_path / "crashing_rank.py"
    script.write_text(CRASHING_RANK)
    port, timeout = _free_port(), 15
    args = ["train", "--distributed", "--epochs", "20", "--hidden", "8", "--splits", "0",
            "--no-progress", "--timeout", str(timeout)]
    common = dict(WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                  CRASH_RANK="1", CRASH_AFTER_STEPS="2", CRASH_MODE=mode)
    ranks = [subprocess.Popen([sys.executable] + (["-m", "dignn"] if r == 0 else
                                                  [str(script)]) + args,
                              cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=_child_env(RANK=str(r), LOCAL_RANK=str(r),
                                                        **common))
             for r in (0, 1)]
    try:
        import time
        began = time.monotonic()
        _, err = ranks[0].communicate(timeout=300)
        waited = time.monotonic() - began
    finally:
        for p in ranks:
            if p.poll() is None:
                p.kill()
            p.wait()
    assert ranks[0].returncode != 0
    assert "dignn train: error: rank 0 of 2" in err
    assert waited < 120  # startup and data included; the collective waits at most 15 s


def test_distributed_trains_node_tasks_only():
    from types import SimpleNamespace
    from dignn.distributed import check_node_task
    with pytest.raises(ValueError, match="mutag is a graph dataset: train it without"):
        check_node_task(SimpleNamespace(task="graph", name="mutag"))
