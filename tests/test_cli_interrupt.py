"""Ctrl-C (SIGINT) in the ``dignn`` command (issue 43): wherever it lands (loading the data,
mid-epoch, between splits, while a checkpoint, a JSON record or a figure is written, in a
sweep, in a plot) the command ends with one line on stderr and exit status 130, no
traceback; no output is left half-written and no temporary stays; a checkpointed ``dignn
train`` says its checkpoint is intact, and ``--resume`` then gives the results of the
uninterrupted run.

The signals are real: sent by the process to itself at the chosen point (in-process runs of
:func:`dignn.cli.main`), or by a parent to ``python -m dignn`` once it has written a
checkpoint or printed a setting's line (subprocesses)."""
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch_geometric.data import Data

import dignn
from dignn import cli
from dignn.data import csbm

RUN = ["--hidden", "8", "--max-iter", "3", "--no-progress", "--device", "cpu"]
# the children run the dignn this process imported
PYTHON_PATH = os.pathsep.join([str(Path(dignn.__file__).resolve().parents[1]),
                               os.environ.get("PYTHONPATH", "")])
# what a resumed run must reproduce of the uninterrupted one
SAME = ("splits", "test_acc", "val_acc", "best_epoch", "train_loss_history", "lambda_max",
        "test_acc_max_over_epochs")


@pytest.fixture(scope="module")
def graph_file(tmp_path_factory) -> Path:
    """A small node classification graph without masks (two seeded splits of it)."""
    g = csbm(num_nodes=80, num_classes=3, num_features=4, avg_degree=4, num_splits=1)
    path = tmp_path_factory.mktemp("data") / "g.pt"
    torch.save(Data(x=g.x, edge_index=g.edge_index, y=g.y), path)
    return path


def train_argv(graph_file, folder: Path, checkpoint: bool = True, epochs: int = 8):
    argv = ["train", "--dataset", str(graph_file), "--split-ratio", "0.5,0.25,0.25",
            "--num-splits", "2", "--epochs", str(epochs), *RUN, "--json",
            str(folder / "run.json")]
    if checkpoint:
        argv += ["--checkpoint", str(folder / "run.ckpt"), "--checkpoint-every", "2"]
    return argv


@pytest.fixture(scope="module")
def reference(graph_file, tmp_path_factory) -> dict:
    """The uninterrupted run's record."""
    folder = tmp_path_factory.mktemp("reference")
    torch.set_num_threads(1)
    assert cli.main(train_argv(graph_file, folder)) == 0
    return json.loads((folder / "run.json").read_text())


@pytest.fixture(autouse=True)
def sigint_raises():
    """Python's own SIGINT handler (KeyboardInterrupt), whatever the test runner set."""
    before = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def interrupt_self() -> None:
    """A real SIGINT to this process, as a terminal's Ctrl-C sends it; its KeyboardInterrupt
    is raised here (in the sleep, at the latest when it ends)."""
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(5)
    raise AssertionError("the SIGINT did not arrive")


def outcome(argv, capsys):
    """(exit status, stdout, stderr) of ``dignn ARGV`` in this process; a KeyboardInterrupt
    that escapes the command is a failure, said as its status."""
    try:
        rc = cli.main(argv)
    except KeyboardInterrupt:
        rc = "KeyboardInterrupt escaped dignn"
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def assert_one_line(rc, err: str, command: str, *fragments) -> str:
    lines = [line for line in err.splitlines() if line.strip()
             and not line.startswith("warning:") and "Warning" not in line]
    assert rc == 130, (rc, err)
    assert "Traceback" not in err, err
    assert len(lines) == 1 and lines[0].startswith(f"dignn {command}: interrupted"), err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def no_temporaries(folder: Path) -> None:
    assert not [p.name for p in folder.iterdir() if p.name.endswith(".tmp")]


def same_results(record: dict, reference: dict) -> None:
    for key in SAME:
        assert record[key] == reference[key], key


class Hooks:
    """Where each case interrupts: ``count`` calls into a function of the run."""

    def __init__(self, monkeypatch):
        self.monkeypatch = monkeypatch

    def on_call(self, owner, name: str, at: int, after: bool = False) -> None:
        """Interrupts the ``at``-th call of ``owner.name`` (before it runs, or after)."""
        original = getattr(owner, name)
        calls = [0]

        def hooked(*args, **kwargs):
            calls[0] += 1
            if calls[0] == at and not after:
                interrupt_self()
            result = original(*args, **kwargs)
            if calls[0] == at and after:
                interrupt_self()
            return result
        self.monkeypatch.setattr(owner, name, hooked)

    def on_write(self, at: int, target: str, snapshot: Path = None) -> list:
        """Interrupts the ``at``-th file :mod:`dignn.files` writes (the temporary of
        ``target``, a file name), after its first bytes (``snapshot``: the file whose bytes
        to keep just before, in the returned list)."""
        import dignn.files
        opened, kept = [0], []

        class Interrupting(io.FileIO):
            def write(self, data):
                written = super().write(data)
                interrupt_self()
                return written

        def hooked_open(path, mode="r", *args, **kwargs):
            opened[0] += 1
            if opened[0] != at:
                return open(path, mode, *args, **kwargs)
            assert Path(path).name.startswith(f".{target}."), (path, target)
            if snapshot is not None:
                kept.append(snapshot.read_bytes())
            return Interrupting(path, mode)
        self.monkeypatch.setattr(dignn.files, "open", hooked_open, raising=False)
        return kept


def adam_step(hooks: Hooks, at: int) -> None:
    hooks.on_call(torch.optim.Adam, "step", at)


# --------------------------------------------------------------------- dignn train --

# (where the interrupt lands, what the line says about the checkpoint)
TRAIN_POINTS = {
    "loading_the_data": ("before the first checkpoint", False),
    "mid_epoch_first_split": ("is intact", True),
    "mid_epoch_second_split": ("is intact", True),
    "between_splits": ("is intact", True),
    "writing_a_checkpoint": ("is intact", True),
    "writing_the_json_record": ("is intact", True),
    "before_the_first_checkpoint": ("before the first checkpoint", False),
}


def _arm_train(where: str, hooks: Hooks, folder: Path):
    import dignn.data
    import dignn.training
    if where == "loading_the_data":
        hooks.on_call(dignn.data, "load_user_file", 1)
    elif where == "mid_epoch_first_split":
        adam_step(hooks, 5)  # epoch 5 of 8: the checkpoint of epoch 4 is the last
    elif where == "mid_epoch_second_split":
        adam_step(hooks, 8 + 3)
    elif where == "between_splits":
        hooks.on_call(dignn.training._RunCheckpoint, "finish_split", 1, after=True)
    elif where == "writing_a_checkpoint":  # the second save: the first must stay whole
        return hooks.on_write(2, "run.ckpt", snapshot=folder / "run.ckpt")
    elif where == "writing_the_json_record":  # saves at epochs 2, 4, 6 and each split's end
        return hooks.on_write(2 * 3 + 2 + 1, "run.json")
    elif where == "before_the_first_checkpoint":
        adam_step(hooks, 1)
    return None


@pytest.mark.parametrize("where", list(TRAIN_POINTS))
def test_train_interrupted_then_resumed(where, graph_file, reference, tmp_path, capsys,
                                        monkeypatch):
    says, resumable = TRAIN_POINTS[where]
    argv = train_argv(graph_file, tmp_path)
    with monkeypatch.context() as patch:
        kept = _arm_train(where, Hooks(patch), tmp_path)
        rc, _, err = outcome(argv, capsys)
    line = assert_one_line(rc, err, "train", says)
    no_temporaries(tmp_path)
    assert not (tmp_path / "run.json").exists()
    checkpoint = tmp_path / "run.ckpt"
    if not resumable:
        assert not checkpoint.exists()
        assert outcome(argv, capsys)[0] == 0  # run again, as the line says
    else:
        assert str(checkpoint) in line and "--resume" in line
        if kept:  # interrupted while replacing it: the previous checkpoint, byte for byte
            assert checkpoint.read_bytes() == kept[0]
        assert outcome(argv + ["--resume"], capsys)[0] == 0
    same_results(json.loads((tmp_path / "run.json").read_text()), reference)
    no_temporaries(tmp_path)


def test_train_without_checkpoint(graph_file, tmp_path, capsys, monkeypatch):
    """Nothing to resume: the line says so, and how to make a run resumable."""
    monkeypatch.chdir(tmp_path)
    with monkeypatch.context() as patch:
        adam_step(Hooks(patch), 3)
        rc, _, err = outcome(train_argv(graph_file, tmp_path, checkpoint=False), capsys)
    assert_one_line(rc, err, "train", "nothing was saved", "--checkpoint")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_resumed_run_interrupted_again(graph_file, reference, tmp_path, capsys,
                                         monkeypatch):
    argv = train_argv(graph_file, tmp_path)
    for at, resume in ((3, []), (6, ["--resume"])):
        with monkeypatch.context() as patch:
            adam_step(Hooks(patch), at)
            rc, _, err = outcome(argv + resume, capsys)
        line = assert_one_line(rc, err, "train", "is intact")
        assert ("run the same command to continue" in line) == bool(resume)
    assert outcome(argv + ["--resume"], capsys)[0] == 0
    same_results(json.loads((tmp_path / "run.json").read_text()), reference)


@pytest.mark.parametrize("second", [False, True], ids=["one_ctrl_c", "a_second_in_cleanup"])
def test_an_interrupted_write_removes_its_temporary(second, tmp_path, monkeypatch):
    """Ctrl-C mid-write: the old file stays, the temporary goes, even when a second Ctrl-C
    lands while it is being removed; the interrupt still ends the write."""
    import dignn.files
    target = tmp_path / "run.ckpt"
    target.write_bytes(b"the previous checkpoint")
    unlink = os.unlink

    def unlink_after_a_second_interrupt(path, *args, **kwargs):
        if second and str(path).endswith(".tmp"):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)  # where an unprotected cleanup would be cut short
        return unlink(path, *args, **kwargs)
    monkeypatch.setattr(dignn.files.os, "unlink", unlink_after_a_second_interrupt)

    def half_then_interrupt(f):
        f.write(b"half of a new")
        f.flush()
        interrupt_self()
    with pytest.raises(KeyboardInterrupt):
        dignn.files.write_atomically(target, half_then_interrupt, sync=True)
    monkeypatch.undo()
    assert target.read_bytes() == b"the previous checkpoint"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.ckpt"]


# --------------------------------------------------------------- sweep and plot --

def _sweep_argv(graph_file, folder):
    return ["sweep", "--dataset", str(graph_file), "--split-ratio", "0.5,0.25,0.25",
            "--num-splits", "2", "--epochs", "4", *RUN, "--grid", "mu=2,3", "--json",
            str(folder / "sweep.json")]


def _plot_argv(folder):
    return ["plot", "convergence", "--epochs", "3", "--max-iter", "3", "--device", "cpu",
            "--out", str(folder / "fig.png"), "--json", str(folder / "fig.json")]


# (command, where, the files that must exist after it)
OTHER_POINTS = [("sweep", "loading_the_data", []), ("sweep", "second_setting", []),
                ("sweep", "writing_the_json_record", []),
                ("plot", "training", []), ("plot", "writing_the_figure", []),
                ("plot", "writing_the_json_record", ["fig.png"])]


@pytest.mark.parametrize("command, where, left", OTHER_POINTS,
                         ids=[f"{c}-{w}" for c, w, _ in OTHER_POINTS])
def test_sweep_and_plot_interrupted(command, where, left, graph_file, tmp_path, capsys,
                                    monkeypatch):
    import dignn.data
    argv = _sweep_argv(graph_file, tmp_path) if command == "sweep" else _plot_argv(tmp_path)
    with monkeypatch.context() as patch:
        hooks = Hooks(patch)
        if where == "loading_the_data":
            hooks.on_call(dignn.data, "load_user_file", 1)
        elif where == "second_setting":
            adam_step(hooks, 2 * 4 + 2)  # 2 splits of 4 epochs, then 2 epochs into it
        elif where == "training":
            adam_step(hooks, 2)
        elif where == "writing_the_figure":
            hooks.on_write(1, "fig.png")
        elif command == "plot":
            hooks.on_write(2, "fig.json")
        else:
            hooks.on_write(1, "sweep.json")
        rc, _, err = outcome(argv, capsys)
    assert_one_line(rc, err, command)
    no_temporaries(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == left
    if left:  # written before the interrupt: whole
        from PIL import Image
        with Image.open(tmp_path / "fig.png") as image:
            image.verify()


@pytest.mark.parametrize("where", ["drawing_a_bar", "making_a_bar"])
def test_the_line_is_on_a_line_of_its_own_after_progress_bars(where, graph_file, tmp_path,
                                                              capsys, monkeypatch):
    """With progress bars: the interrupt lands while a bar draws, or while it is being made
    (tqdm cannot close such a bar): the line still starts a line of its own, and is the
    last."""
    import tqdm.std
    argv = [a for a in _sweep_argv(graph_file, tmp_path) if a != "--no-progress"]
    with monkeypatch.context() as patch:
        # the first draw is inside the bar's constructor; the third an update in training
        Hooks(patch).on_call(tqdm.std.tqdm, "refresh",
                             1 if where == "making_a_bar" else 3, after=True)
        rc, _, err = outcome(argv, capsys)
    assert rc == 130 and "Traceback" not in err, err
    assert err.rstrip("\n").split("\n")[-1] == "dignn sweep: interrupted", err
    assert sorted(p.name for p in tmp_path.iterdir()) == []


# --------------------------------------------------- a parent's SIGINT to dignn --

def _child(argv, cwd):
    """``python -m dignn ARGV`` with SIGINT handled as a shell's foreground command has it
    (a test runner may ignore it, which children inherit); its stdout and stderr are read
    as they come, into ``proc.out`` and ``proc.err``."""
    import threading
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": PYTHON_PATH}
    proc = subprocess.Popen([sys.executable, "-m", "dignn", *argv], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    proc.out, proc.err, proc.readers = [], [], []
    for stream, into in ((proc.stdout, proc.out), (proc.stderr, proc.err)):
        reader = threading.Thread(target=lambda s=stream, i=into: i.extend(iter(
            lambda: s.read(1), "")), daemon=True)
        reader.start()
        proc.readers.append(reader)
    return proc


def _interrupt_when(proc, ready, seconds: float = 120.0) -> str:
    """Sends SIGINT once ``ready()``; returns the child's stderr after it ends."""
    deadline = time.monotonic() + seconds
    try:
        while not ready():
            assert proc.poll() is None, "".join(proc.err)
            assert time.monotonic() < deadline, "the child never got there"
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=seconds)
    finally:
        proc.kill()
    for reader in proc.readers:
        reader.join(timeout=10)
    return "".join(proc.err)


def test_sigint_to_dignn_train_then_resume(graph_file, tmp_path, capsys):
    """SIGINT once the first checkpoint is saved (epoch 2 of 40): one line, 130; then
    --resume finishes with the uninterrupted run's results."""
    def argv(folder):
        return train_argv(graph_file, folder, epochs=40) + ["--splits", "0"]
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    whole.mkdir()
    cut.mkdir()
    assert outcome(argv(whole), capsys)[0] == 0
    proc = _child(argv(cut), cut)
    err = _interrupt_when(proc, (cut / "run.ckpt").exists)
    line = assert_one_line(proc.returncode, err, "train", "is intact", "--resume")
    assert str(cut / "run.ckpt") in line
    no_temporaries(cut)
    assert sorted(p.name for p in cut.iterdir()) == ["run.ckpt"]
    assert outcome(argv(cut) + ["--resume"], capsys)[0] == 0
    same_results(json.loads((cut / "run.json").read_text()),
                 json.loads((whole / "run.json").read_text()))


def test_sigint_to_dignn_sweep_with_progress_bars(graph_file, tmp_path):
    """Once a progress bar is drawn: the line is the last, on a line of its own."""
    argv = [a for a in _sweep_argv(graph_file, tmp_path) if a != "--no-progress"]
    argv[argv.index("--epochs") + 1] = "300"
    proc = _child(argv, tmp_path)
    err = _interrupt_when(proc, lambda: re.search(r" [1-9][0-9]*/300 ", "".join(proc.err)))
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert err.rstrip("\n").splitlines()[-1] == "dignn sweep: interrupted", err
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.slow  # two ranks, twice: about 20 s on 2 cores
@pytest.mark.xdist_group("rendezvous")  # a localhost port (tests/conftest.py)
def test_sigint_to_distributed_ranks_then_resume(graph_file, tmp_path, capsys):
    """A terminal's Ctrl-C reaches every rank (torchrun passes it on too): rank 0 says the
    one line, every rank exits 130 without a traceback; resuming on two ranks gives the
    single-process run's results (float64: to rounding)."""
    import socket

    def ranks(argv):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": PYTHON_PATH,
               "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        return [subprocess.Popen([sys.executable, "-m", "dignn", *argv], cwd=tmp_path,
                                 env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 preexec_fn=lambda: signal.signal(signal.SIGINT,
                                                                  signal.SIG_DFL))
                for r in (0, 1)]

    def argv(folder):
        return train_argv(graph_file, folder, epochs=60) + ["--splits", "0", "--dtype",
                                                            "float64"]
    single = tmp_path / "single"
    single.mkdir()
    assert outcome(argv(single), capsys)[0] == 0
    procs = ranks(argv(tmp_path) + ["--distributed"])
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "run.ckpt").exists():
            assert all(p.poll() is None for p in procs), procs[0].communicate()
            assert time.monotonic() < deadline
            time.sleep(0.02)
        for p in procs:
            p.send_signal(signal.SIGINT)
        errs = [p.communicate(timeout=120)[1] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [130, 130], errs
    assert_one_line(130, errs[0], "train", "is intact", "--resume")
    assert "Traceback" not in errs[1] and "interrupted" not in errs[1], errs[1]
    procs = ranks(argv(tmp_path) + ["--distributed", "--resume"])
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    resumed, whole = (json.loads((folder / "run.json").read_text())
                      for folder in (tmp_path, single))
    assert resumed["best_epoch"] == whole["best_epoch"]
    for got, want in zip(resumed["train_loss_history"][0], whole["train_loss_history"][0]):
        assert got == pytest.approx(want, rel=1e-9)
