"""Bad input to the ``dignn`` command, its data files, checkpoints and partitions (issue 32,
part A): no code runs from a data file unless the user opts in (``--trust-pickle``,
``allow_pickle=True``); every bad input is refused with one line on stderr (exit 2) that
names the argument and the fix, before any data is read when it is an output path; no
temporary file outlives a run, even a killed one; partitioning takes time linear in the
number of parts."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch_geometric.data import Data, InMemoryDataset

import dignn
import dignn.device
from dignn import cli
from dignn.data import csbm
from dignn.data.custom import UserDataError, load_user_file
from dignn.files import check_writable, remove_stale_temporaries, temporary_path
from dignn.presets import TrainConfig
from dignn.training import Checkpointing, train
from dignn_kernels.distributed import GraphPartition, partition

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = ["--epochs", "2", "--hidden", "8", "--max-iter", "3", "--no-progress", "--device",
        "cpu"]
# the children run the dignn this process imported
PYTHON_PATH = os.pathsep.join([str(Path(dignn.__file__).resolve().parents[1]),
                               os.environ.get("PYTHONPATH", "")])


def node_data(n: int = 60) -> Data:
    """A small 3-class graph with one split of masks."""
    g = csbm(num_nodes=n, num_classes=3, num_features=4, avg_degree=4, num_splits=1)
    s = g.splits[0]
    masks = [torch.zeros(n, dtype=torch.bool) for _ in range(3)]
    for mask, idx in zip(masks, (s.train, s.val, s.test)):
        mask[idx] = True
    return Data(x=g.x, edge_index=g.edge_index, y=g.y, train_mask=masks[0],
                val_mask=masks[1], test_mask=masks[2])


def tiny_graphs(count: int = 9):
    graphs = []
    for i in range(count):
        n = 4 + i % 3
        src = torch.arange(n - 1)
        ei = torch.stack([src, src + 1])
        graphs.append(Data(x=torch.ones(n, 2) * (i % 2), edge_index=torch.cat([ei, ei.flip(0)],
                                                                              1),
                           y=torch.tensor([i % 2])))
    return graphs


class TrustedGraphs(InMemoryDataset):
    """A dataset object: torch.save pickles its class, so only full unpickling reads it."""

    def __init__(self, graphs):
        super().__init__(None)
        self._data, self.slices = self.collate(graphs)


class Payload:
    """Unpickling this runs ``touch MARKER``."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch '{self.marker}'",))


def run(argv, capsys):
    """``dignn ...`` in this process: (exit status, stdout, stderr)."""
    rc = cli.main(argv)
    io = capsys.readouterr()
    return rc, io.out, io.err


def refused(argv, capsys, *fragments, command="train"):
    """Runs ``argv``, which must be refused with one line on stderr naming ``fragments``;
    returns stdout."""
    rc, out, err = run(argv, capsys)
    lines = [line for line in err.splitlines() if line.strip()
             and not line.startswith("warning:")]
    assert rc == 2, (out, err)
    assert len(lines) == 1 and lines[0].startswith(f"dignn {command}: error: "), err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return out


# ----------------------------------------------------- no code runs from a data file --

@pytest.mark.parametrize("carrier", ["bare", "inside_data"])
def test_a_pickle_payload_does_not_run(tmp_path, capsys, carrier):
    marker = tmp_path / "MARKER"
    if carrier == "bare":
        obj = Payload(marker)
    else:  # a valid graph carrying the payload in an attribute: it used to train, exit 0
        obj = node_data()
        obj.extra = Payload(marker)
    path = tmp_path / "graph.pt"
    torch.save(obj, path)
    refused(["train", "--dataset", str(path), *TINY], capsys, "needs unpickling",
            "--trust-pickle", "allow_pickle=True", "os.system" if os.name != "posix" else
            "system")
    refused(["sweep", "--dataset", str(path), "--grid", "mu=2,3", *TINY], capsys,
            "--trust-pickle", command="sweep")
    with pytest.raises(UserDataError, match="--trust-pickle.*allow_pickle=True"):
        load_user_file(path)
    with pytest.raises(UserDataError, match="needs unpickling"):
        dignn.train_graph_data(str(path), epochs=1)
    assert not marker.exists()


def test_trust_pickle_reads_a_trusted_dataset_object(tmp_path, capsys):
    path = tmp_path / "graphs.pt"
    torch.save(TrustedGraphs(tiny_graphs()), path)
    argv = ["train", "--dataset", str(path), "--num-splits", "3", "--splits", "0", *TINY]
    refused(argv, capsys, "--trust-pickle")
    rc, out, err = run(argv + ["--trust-pickle"], capsys)
    assert rc == 0, err
    assert "3 classes" not in out and "9 graphs" in out
    assert len(load_user_file(path, num_splits=3, allow_pickle=True).graphs) == 9
    # the flag means nothing for a dataset read by its own loader
    refused(["train", "--dataset", "csbm", "--trust-pickle", *TINY], capsys,
            "--trust-pickle applies to a dataset file")


def test_help_names_trust_pickle():
    parser = cli.build_parser()
    for command in ("train", "sweep"):
        sub = parser._subparsers._group_actions[0].choices[command]
        text = sub.format_help()
        assert "--trust-pickle" in text and "weights_only=True" in text


# ------------------------------------------------------------ bad dataset files --

def test_bad_dataset_files(tmp_path, capsys):
    empty = tmp_path / "empty.pt"
    empty.write_bytes(b"")
    refused(["train", "--dataset", str(empty), *TINY], capsys, "is empty", str(empty))
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(os.urandom(3000))
    refused(["train", "--dataset", str(garbage), *TINY], capsys,
            "is not a file written by torch.save")
    text = tmp_path / "notes.pt"
    text.write_text("x,y\n1,2\n")
    refused(["train", "--dataset", str(text), *TINY], capsys,
            "is not a file written by torch.save")
    with pytest.raises(SystemExit):  # a folder is not a dataset file: argparse says so
        cli.main(["train", "--dataset", str(tmp_path)])
    assert "invalid choice" in capsys.readouterr().err


def test_a_huge_class_id_is_refused(tmp_path, capsys):
    """A class id of 1e9 would size the output layer by it (a 256 GB allocation)."""
    data = node_data()
    data.y[3] = 10**9
    path = tmp_path / "big.pt"
    torch.save(data, path)
    refused(["train", "--dataset", str(path), *TINY], capsys, "class id 1000000000",
            "0..C-1", "torch.unique")
    graphs = tiny_graphs()
    graphs[0].y = torch.tensor([10**9])
    with pytest.raises(UserDataError, match="class id 1000000000 but only 9 graphs"):
        dignn.data.from_pyg(graphs)


# ------------------------------------------------------------- output paths --

def test_output_paths_are_checked_before_any_data_is_read(tmp_path, capsys, monkeypatch):
    def no_data(*_):
        raise AssertionError("the data was read before the output paths were checked")
    monkeypatch.setattr(cli, "_load", no_data)
    a_file = tmp_path / "file"
    a_file.write_text("x")
    folder = tmp_path / "folder"
    folder.mkdir()
    before = sorted(os.listdir(tmp_path))
    for flag, ext in (("--json", "run.json"), ("--checkpoint", "run.ckpt")):
        out = refused(["train", flag, str(folder), *TINY], capsys, flag, "is a folder",
                      str(folder / ext))
        assert out == ""
        refused(["train", flag, str(a_file / "x"), *TINY], capsys, flag, "is a file, not a "
                "folder")
        refused(["train", flag, "", *TINY], capsys, flag, "is empty")
    refused(["sweep", "--grid", "mu=2,3", "--json", str(folder), *TINY], capsys, "--json",
            "is a folder", command="sweep")
    refused(["plot", "convergence", "--out", str(folder)], capsys, "--out", "is a folder",
            command="plot")
    refused(["plot", "mu", "--out", str(tmp_path / "mu.png"), "--json",
             str(a_file / "x.json")], capsys, "--json", command="plot")
    assert sorted(os.listdir(tmp_path)) == before  # nothing left behind
    assert not list(folder.iterdir())


def test_a_folder_that_takes_no_files(tmp_path):
    """Even root cannot create files in /proc: the probe finds that out."""
    if not os.path.isdir("/proc/self"):
        pytest.skip("no /proc here")
    with pytest.raises(ValueError, match="--json '/proc/run.json' cannot be written.*"
                                         "writable folder"):
        check_writable("/proc/run.json", "--json")
    if os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(ValueError, match="does not take new files"):
            check_writable(locked / "a" / "run.json", "--json")
    assert check_writable(tmp_path / "new" / "sub" / "run.json", "--json")
    assert not (tmp_path / "new").exists()  # checked, not created


def test_checkpoint_api_refuses_a_folder(tmp_path):
    with pytest.raises(ValueError, match="is a folder; give a file path"):
        Checkpointing(tmp_path)


# ------------------------------------------------------------ checkpoints --

class _Stop(Exception):
    pass


CONFIG = TrainConfig(hidden=8, epochs=4, max_iter=3, lr=0.05, mu=4.0)


@pytest.fixture(scope="module")
def graph():
    return csbm(num_nodes=80, num_classes=3, num_features=6, avg_degree=4, num_splits=2)


@pytest.fixture()
def mid_split(graph, tmp_path, monkeypatch):
    """A checkpoint saved in split 1's epoch 2 (split 0 finished), as a dict."""
    from dignn import training
    save = training._SplitSaver.save

    def save_then_stop(self, epoch, seconds):
        save(self, epoch, seconds)
        if self.split == 1 and epoch == 2:
            raise _Stop
    path = tmp_path / "run.ckpt"
    with monkeypatch.context() as m:
        m.setattr(training._SplitSaver, "save", save_then_stop)
        with pytest.raises(_Stop):
            train(graph, CONFIG, progress=False, device="cpu",
                  checkpoint=Checkpointing(path, every=1))
    return path, torch.load(path, weights_only=True)


def _resume(graph, path):
    return train(graph, CONFIG, progress=False, device="cpu",
                 checkpoint=Checkpointing(path, every=1, resume=True))


def _damage_file(kind: str, good: bytes) -> bytes:
    if kind == "truncated":
        return good[: len(good) // 2]
    if kind == "bit_flipped":
        flipped = bytearray(good)
        flipped[len(good) // 2] ^= 0x40
        return bytes(flipped)
    if kind == "garbage":
        return os.urandom(len(good))
    return b""


@pytest.mark.parametrize("kind", ["truncated", "bit_flipped", "garbage", "empty"])
def test_resume_from_a_damaged_file(tmp_path, capsys, kind):
    path = tmp_path / "ck.pt"
    argv = ["train", "--splits", "0", "--num-splits", "1", *TINY, "--checkpoint", str(path)]
    assert run(argv, capsys)[0] == 0
    path.write_bytes(_damage_file(kind, path.read_bytes()))
    refused(argv + ["--resume"], capsys, str(path), "--resume", "--checkpoint")


def _edit(state, how):
    """``state`` (a loaded checkpoint) altered one way."""
    import copy
    state = copy.deepcopy(state)
    current, finished = state["current"], state["finished"]
    if how == "a_list":
        return [1, 2, 3]
    if how == "no_identity":
        del state["identity"]
    elif how == "identity_of_tensors":
        state["identity"]["splits"] = torch.tensor([0, 1])
    elif how == "finished_not_a_list":
        state["finished"] = {"split": 0}
    elif how == "result_missing_a_field":
        del finished[0]["test_acc"]
    elif how == "result_of_a_wrong_type":
        finished[0]["test_acc"] = "high"
    elif how == "result_history_of_strings":
        finished[0]["val_history"] = ["a"]
    elif how == "result_of_another_split":
        finished[0]["split"] = 7
    elif how == "current_of_a_finished_split":
        current["split"] = 0
    elif how == "epoch_out_of_range":
        current["epoch"] = 99
    elif how == "negative_seconds":
        current["seconds"] = -1.0
    elif how == "model_of_a_wrong_shape":
        key = next(iter(current["model"]))
        current["model"][key] = torch.zeros(3)
    elif how == "model_missing_a_weight":
        current["model"].pop(next(iter(current["model"])))
    elif how == "selection_weight_broadcastable":  # a copy_ would broadcast it silently
        current["selector"]["saved"][0] = torch.zeros(())
    elif how == "selection_history_short":
        current["selector"]["rows"] = current["selector"]["rows"][:1]
    elif how == "selection_of_a_wrong_dtype":
        current["selector"]["best"] = current["selector"]["best"].float()
    elif how == "optimizer_moment_of_a_wrong_shape":
        entry = next(iter(current["optimizer"]["state"].values()))
        entry["exp_avg"] = torch.zeros(2, 2, 2)
    elif how == "optimizer_lr_a_string":
        current["optimizer"]["param_groups"][0]["lr"] = "fast"
    elif how == "optimizer_without_state":
        current["optimizer"] = {"param_groups": []}
    elif how == "rng_of_a_wrong_size":
        current["rng"]["cpu"] = torch.zeros(10, dtype=torch.uint8)
    elif how == "rng_not_bytes":
        current["rng"]["cpu"] = current["rng"]["cpu"].long()
    elif how == "current_a_string":
        state["current"] = "epoch 2"
    else:
        raise AssertionError(how)
    return state


DAMAGE = ["a_list", "no_identity", "identity_of_tensors", "finished_not_a_list",
          "result_missing_a_field", "result_of_a_wrong_type", "result_history_of_strings",
          "result_of_another_split", "current_of_a_finished_split", "epoch_out_of_range",
          "negative_seconds", "model_of_a_wrong_shape", "model_missing_a_weight",
          "selection_weight_broadcastable", "selection_history_short",
          "selection_of_a_wrong_dtype", "optimizer_moment_of_a_wrong_shape",
          "optimizer_lr_a_string", "optimizer_without_state", "rng_of_a_wrong_size",
          "rng_not_bytes", "current_a_string"]


def test_resume_refuses_malformed_checkpoints(graph, mid_split):
    """Each of these loads with torch.load but would crash later in training or, worse,
    train on without an error; every one is refused when resuming, naming the file."""
    path, state = mid_split
    assert state["current"]["epoch"] == 2 and len(state["finished"]) == 1
    bad = path.with_name("bad.ckpt")
    for how in DAMAGE:
        torch.save(_edit(state, how), bad)
        with pytest.raises(ValueError, match=r"bad\.ckpt.*(resume|another run)") as err:
            _resume(graph, bad)
        assert "\n" not in str(err.value), how
    run_ = _resume(graph, path)  # the intact checkpoint still resumes
    assert [s.split for s in run_.splits] == [0, 1]


def test_checked_result_fields_are_the_split_results():
    import dataclasses
    from dignn.training import _RESULT_FIELDS, SplitResult
    assert set(_RESULT_FIELDS) == {f.name for f in dataclasses.fields(SplitResult)} - {"model"}


def test_cli_resume_from_a_malformed_checkpoint_is_one_line(tmp_path, capsys):
    """A list, a missing key, a wrong type: formerly AttributeError/KeyError tracebacks."""
    path = tmp_path / "ck.pt"
    argv = ["train", "--splits", "0", "--num-splits", "1", *TINY, "--checkpoint", str(path)]
    assert run(argv, capsys)[0] == 0
    good = torch.load(path, weights_only=True)
    for state in ([1, 2], {k: v for k, v in good.items() if k != "identity"},
                  {**good, "finished": [{**good["finished"][0], "epochs_run": "2"}]}):
        torch.save(state, path)
        refused(argv + ["--resume"], capsys, str(path))
    path.unlink()
    refused(argv + ["--resume"], capsys, "--resume", "no checkpoint file")


def test_a_failing_traceback_free_subprocess(tmp_path):
    """The command as a user runs it: a truncated checkpoint gives one line, no
    traceback."""
    path = tmp_path / "ck.pt"
    torch.save({"format": 1}, path)
    path.write_bytes(path.read_bytes()[:40])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": PYTHON_PATH}
    proc = subprocess.run([sys.executable, "-m", "dignn", "train", *TINY, "--checkpoint",
                           str(path), "--resume"], capture_output=True, text=True,
                          timeout=120, env=env, cwd=tmp_path)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and errors[0].startswith("dignn train: error: the checkpoint")


# ------------------------------------------------------ temporaries left behind --

def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_stale_temporaries_of_killed_writers_are_removed(tmp_path, capsys):
    path = tmp_path / "ck.pt"
    dead = _dead_pid()
    stale = temporary_path(path, dead)
    legacy = tmp_path / f".ck.pt.{dead}.tmp"  # the name before the host was in it
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        live = temporary_path(path, sleeper.pid)  # another process writing: kept
        other = tmp_path / f".other.pt.{dead}.tmp"  # another file's: kept
        for p in (stale, legacy, live, other):
            p.write_bytes(b"half a checkpoint")
        assert run(["train", "--splits", "0", "--num-splits", "1", *TINY, "--checkpoint",
                    str(path), "--checkpoint-every", "1"], capsys)[0] == 0
        assert not stale.exists() and not legacy.exists()
        assert live.exists() and other.exists()
        assert remove_stale_temporaries(path) == 0
    finally:
        sleeper.kill()
        sleeper.wait()
    assert remove_stale_temporaries(path) == 1  # its writer is gone now


def test_a_run_killed_while_writing_leaves_nothing_after_the_next(tmp_path):
    """kill -9 in the middle of a checkpoint's write: its temporary stays until the next
    run writes to the same checkpoint."""
    path = tmp_path / "ck.pt"
    script = (f"import os, signal, torch\n"
              f"from dignn.files import write_atomically\n"
              f"def half(f):\n"
              f"    f.write(b'x' * 1000); f.flush(); os.kill(os.getpid(), signal.SIGKILL)\n"
              f"write_atomically({str(path)!r}, half)\n")
    env = {**os.environ, "PYTHONPATH": PYTHON_PATH}
    proc = subprocess.run([sys.executable, "-c", script], env=env, timeout=120,
                          cwd=tmp_path)  # (not a source tree, which would shadow the package)
    assert proc.returncode == -signal.SIGKILL
    assert len(list(tmp_path.glob(".ck.pt.*.tmp"))) == 1 and not path.exists()
    from dignn.files import write_atomically
    write_atomically(path, lambda f: f.write(b"whole"))
    assert path.read_bytes() == b"whole" and not list(tmp_path.glob(".*.tmp"))


def test_a_failing_write_removes_its_temporary(graph, tmp_path, monkeypatch):
    path = tmp_path / "ck.pt"
    train(graph, CONFIG, splits=[0], progress=False, device="cpu",
          checkpoint=Checkpointing(path))
    before = path.read_bytes()

    def disk_full(*_, **__):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(torch, "save", disk_full)
    with pytest.raises(OSError, match="No space left"):
        train(graph, CONFIG, splits=[0], progress=False, device="cpu",
              checkpoint=Checkpointing(path))
    assert path.read_bytes() == before  # the old checkpoint is intact
    assert not list(tmp_path.glob(".*.tmp"))


def test_cli_disk_full_is_one_line(tmp_path, capsys, monkeypatch):
    import dignn.files

    def disk_full(*_, **__):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(dignn.files.os, "replace", disk_full)
    refused(["train", "--splits", "0", "--num-splits", "1", *TINY, "--json",
             str(tmp_path / "run.json")], capsys, "No space left")
    assert os.listdir(tmp_path) == []


# -------------------------------------------------------------- other inputs --

def test_sweep_settings_files(tmp_path, capsys):
    folder = tmp_path / "settings"
    folder.mkdir()
    empty = tmp_path / "empty.json"
    empty.write_text("")
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\xff\xfe\x00\x81")
    for path, what in ((tmp_path / "missing.json", "missing.json"), (folder, "settings"),
                       (empty, "not valid JSON"), (binary, "binary.json")):
        refused(["sweep", "--settings", str(path), *TINY], capsys, what, command="sweep")


def test_bad_data_and_cache_folders(tmp_path, capsys):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    refused(["train", "--dataset", "cora", "--data-root", str(tmp_path / "missing"), *TINY],
            capsys, "--data-root", "does not exist")
    refused(["train", "--dataset", "cora", "--data-root", str(a_file), *TINY], capsys,
            "--data-root", "not a folder")
    refused(["train", "--dataset", "cora", "--cache-dir", str(a_file), *TINY], capsys,
            "--cache-dir", str(a_file))
    refused(["plot", "mu", "--dataset", "cora", "--data-root", str(a_file), "--out",
             str(tmp_path / "mu.png")], capsys,
            "--data-root",
            "not a folder", command="plot")


@pytest.mark.parametrize("name", ["mutag", "chameleon"])
def test_damaged_raw_files_are_named(tmp_path, capsys, name):
    """A raw file PyG's (or dignn's) parser chokes on: formerly a ValueError or BadZipFile
    traceback, or a line that named neither the dataset nor the file."""
    from raw_formats import write_dataset
    root = tmp_path / "root"
    written = write_dataset(root, name)
    victim = root / written.files[0]
    victim.write_bytes(victim.read_bytes()[:50] + b"\n1, x\n")
    refused(["train", "--dataset", name, "--data-root", str(root), "--cache-dir",
             str(tmp_path / "cache"), *TINY], capsys, f"dataset {name!r} cannot be read",
            "--data-root", "delete")


def test_numbers_out_of_range(capsys, monkeypatch):
    def no_data(*_):
        raise AssertionError("the data was read before the numbers were checked")
    monkeypatch.setattr(cli, "_load", no_data)
    # argparse's own error, while parsing (tests/test_cli_args.py checks every flag)
    for flag, value, fragment in (("--seed", str(2**70), "magnitude below 2**62"),
                                  ("--lr", "-1", "> 0"), ("--lr", "nan", "finite"),
                                  ("--weight-decay", "-0.5", ">= 0"),
                                  ("--weight-decay", "inf", "finite"),
                                  ("--threads", "1000000000", "at most"),
                                  ("--num-splits", "1000000000", "at most 1000")):
        with pytest.raises(SystemExit) as exc:  # (--threads: an OpenMP abort before)
            cli.main(["train", flag, value, *TINY])
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert f"dignn train: error: argument {flag}: " in err and fragment in err, err
    with pytest.raises(ValueError, match="--threads must be an integer"):
        dignn.device.choose_threads(10, requested=10**9)


def test_out_of_memory_is_one_line(capsys, monkeypatch):
    from dignn import training

    def huge(*_, **__):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator:"
                           " can't allocate memory: you tried to allocate 256000000256 bytes."
                           " Error code 12 (Cannot allocate memory)")
    monkeypatch.setattr(training, "build_model", huge)
    refused(["train", "--splits", "0", *TINY], capsys, "out of memory",
            "256000000256 bytes", "--hidden")


def test_plot_bad_names(tmp_path, capsys):
    out = ["--epochs", "1", "--out", str(tmp_path / "figure.png")]
    for argv, fragment in ((["mu", "--dataset", "no-such"], "invalid choice: 'no-such'"),
                           (["mu", "--dataset", "mutag"], "the figures are drawn on node"),
                           (["convergence", "--datasets", "no-such"], "'no-such'"),
                           # formerly drew an empty figure
                           (["convergence", "--datasets", ","], "names no dataset")):
        with pytest.raises(SystemExit) as exc:  # refused while parsing
            cli.main(["plot", *argv, *out])
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert f"dignn plot {argv[0]}: error: argument --dataset" in err and fragment in err
    assert not list(tmp_path.iterdir())


# -------------------------------------------------------------- partitions --

def _ring(n: int):
    i = torch.arange(n)
    return torch.stack([torch.cat([i, (i + 1) % n]), torch.cat([(i + 1) % n, i])])


def test_many_parts_take_linear_time():
    """100,000 ranks on a 5-node graph (most own nothing): formerly parts^2 steps (1,000
    parts 7.5 s, 100,000 never returned)."""
    began = time.perf_counter()
    part = partition(_ring(5), 5, 100_000)
    assert time.perf_counter() - began < 10.0
    assert sum(part.owned(r).numel() for r in range(100_000)) == 5
    busy = [r for r in range(100_000) if part.owned(r).numel()]
    assert len(busy) == 5
    for r in busy:  # each node's two ring neighbours are its halo, received from them
        piece = part.piece(r)
        assert piece["halo"].numel() == 2 and int(piece["recv_counts"].sum()) == 2
        assert int(piece["send_counts"].sum()) == 2
    idle = part.piece(1)
    assert idle["owned"].numel() == 0 and int(idle["recv_counts"].sum()) == 0
    assert idle["recv_counts"].numel() == 100_000


def test_pieces_match_a_pairwise_construction():
    """The sorted construction gives, for every rank and peer, what a loop over the pairs
    of ranks gives (random assignments, empty ranks included)."""
    from dignn_kernels import build_graph
    from dignn_kernels.distributed.partition import _pieces
    gen = torch.Generator().manual_seed(3)
    n, parts = 40, 9
    ei = torch.randint(0, n, (2, 150), generator=gen)
    graph = build_graph(ei, n, torch.rand(150, generator=gen, dtype=torch.float64))
    assignment = torch.randint(0, parts - 2, (n,), generator=gen)  # ranks 7, 8 own nothing
    pieces = _pieces(graph, assignment, parts)
    for r, piece in enumerate(pieces):
        owned = torch.nonzero(assignment == r).flatten()
        assert torch.equal(piece["owned"], owned)
        rows = torch.repeat_interleave(torch.arange(n), graph.rowptr[1:] - graph.rowptr[:-1])
        cols = graph.col.long()[assignment[rows] == r]
        remote = cols[assignment[cols] != r].unique()
        halo = remote[torch.argsort(assignment[remote] * n + remote)]
        assert torch.equal(piece["halo"], halo)
        local = torch.cat([owned, halo])
        assert torch.equal(local[piece["col"].long()], cols)
        for s in range(parts):
            sent = pieces[s]
            lo = int(sent["send_counts"][:r].sum())
            rows_sent = sent["owned"][sent["send_index"][lo:lo + int(sent["send_counts"][r])]]
            lo = int(piece["recv_counts"][:s].sum())
            assert torch.equal(rows_sent, halo[lo:lo + int(piece["recv_counts"][s])])


def _saved_partition(tmp_path):
    part = partition(_ring(12), 12, 3)
    path = tmp_path / "ring.part"
    part.save(path)
    return path, torch.load(path, weights_only=True)


def test_partition_load_refuses_damaged_files(tmp_path):
    path, data = _saved_partition(tmp_path)
    assert GraphPartition.load(path).parts == 3
    bad = tmp_path / "bad.part"
    good = path.read_bytes()
    flipped = bytearray(good)
    flipped[len(good) // 2] ^= 0x01  # inside a record: loads as a wrong value unchecked
    cases = {"truncated": good[:200], "empty": b"", "garbage": os.urandom(2000),
             "bit_flipped": bytes(flipped)}
    for what, content in cases.items():
        bad.write_bytes(content)
        with pytest.raises(ValueError, match=r"partition file .*bad\.part.*cannot be used.*"
                                             r"partition the graph again"):
            GraphPartition.load(bad)
    with pytest.raises(ValueError, match="is a folder"):
        GraphPartition.load(tmp_path)


def _altered(data, how):
    import copy
    data = copy.deepcopy(data)
    piece = data["pieces"][1]
    if how == "no_parts":
        del data["parts"]
    elif how == "parts_a_string":
        data["parts"] = "3"
    elif how == "num_nodes_negative":
        data["num_nodes"] = -1
    elif how == "assignment_short":
        data["assignment"] = data["assignment"][:5]
    elif how == "assignment_out_of_range":
        data["assignment"][0] = 7
    elif how == "assignment_float":
        data["assignment"] = data["assignment"].double()
    elif how == "pieces_too_few":
        data["pieces"] = data["pieces"][:2]
    elif how == "piece_missing_a_key":
        del piece["send_index"]
    elif how == "piece_a_list":
        data["pieces"][1] = [1, 2]
    elif how == "col_of_floats":
        piece["col"] = piece["col"].double()
    elif how == "rowptr_short":
        piece["rowptr"] = piece["rowptr"][:-1]
    elif how == "counts_short":
        piece["recv_counts"] = piece["recv_counts"][:2]
    elif how == "counts_wrong_sum":
        piece["send_counts"] = piece["send_counts"] + 1
    elif how == "values_short":
        piece["value"] = piece["value"][:-1]
    elif how == "degree_2d":
        piece["degree"] = piece["degree"].view(-1, 1)
    elif how == "symmetric_a_tensor":
        data["symmetric"] = torch.tensor(True)
    return data


@pytest.mark.parametrize("how", ["no_parts", "parts_a_string", "num_nodes_negative",
                                 "assignment_short", "assignment_out_of_range",
                                 "assignment_float", "pieces_too_few", "piece_missing_a_key",
                                 "piece_a_list", "col_of_floats", "rowptr_short",
                                 "counts_short", "counts_wrong_sum", "values_short",
                                 "degree_2d", "symmetric_a_tensor"])
def test_partition_load_checks_every_field(tmp_path, how):
    path, data = _saved_partition(tmp_path)
    torch.save(_altered(data, how), path)
    with pytest.raises(ValueError, match=r"ring\.part.*cannot be used"):
        GraphPartition.load(path)


# --------------------------------------- every file the command writes (issue 43) --
# --json (train, sweep, plot), --checkpoint and plot's --out: a name of any length the file
# system takes is written (the temporary's name is bounded); a name it does not take is
# refused before any data is read, naming the option; a write the system refuses (no space,
# a file size limit, a read-only folder, a folder that became a file) ends with one line
# naming the path, the option and the reason, the old file unchanged, no temporary left.

def _graph_file(folder: Path) -> Path:
    path = folder / "g.pt"
    if not path.exists():
        data = node_data(40)
        torch.save(Data(x=data.x, edge_index=data.edge_index, y=data.y), path)
    return path


OUTPUTS = ["train --json", "train --checkpoint", "sweep --json", "plot --out",
           "plot --json"]


def _writing(output: str, target: Path, data: Path) -> list:
    """The command of ``output`` (e.g. ``sweep --json``) writing ``target``."""
    command, flag = output.split()
    user_file = ["--dataset", str(data), "--split-ratio", "0.5,0.25,0.25", "--num-splits",
                 "1", *TINY]
    if command == "train":
        extra = ["--checkpoint-every", "1"] if flag == "--checkpoint" else []
        return ["train", *user_file, flag, str(target), *extra]
    if command == "sweep":
        return ["sweep", *user_file, "--grid", "mu=2", flag, str(target)]
    figure = [] if flag == "--out" else ["--out", str(target.parent / "figure.png")]
    return ["plot", "convergence", "--epochs", "2", "--max-iter", "3", "--device", "cpu",
            flag, str(target), *figure]


def _no_data(monkeypatch):
    """Makes reading any dataset fail the test."""
    import dignn.data
    import dignn.plot

    def no_data(*_, **__):
        raise AssertionError("the data was read before the output paths were checked")
    for owner, name in ((dignn.data, "load_user_file"), (dignn.data, "load_dataset"),
                        (dignn.plot, "load_dataset")):
        monkeypatch.setattr(owner, name, no_data)


# names at the file system's limit (name_max bytes; 255 on most), or just below it
LONG_NAMES = {"ascii_limit_minus_5": lambda name_max: "r" * (name_max - 10) + ".json",
              "utf8_at_the_limit": lambda name_max: "\u00e9" * ((name_max - 5) // 2) +
              ".json",  # 2 bytes a character
              "dots_and_spaces": lambda name_max: ". a" * ((name_max - 5) // 3) + ".json"}


@pytest.mark.parametrize("name", list(LONG_NAMES))
@pytest.mark.parametrize("output", OUTPUTS)
def test_any_name_the_file_system_takes_is_written(output, name, tmp_path, capsys):
    """Formerly the temporary's name, the target's with 20 or more bytes more, went over
    the name limit: the run trained, then failed and its results were lost."""
    name_max = os.pathconf(tmp_path, "PC_NAME_MAX")
    target = tmp_path / LONG_NAMES[name](name_max)
    assert name_max - 10 <= len(os.fsencode(target.name)) <= name_max
    rc, _, err = run(_writing(output, target, _graph_file(tmp_path)), capsys)
    assert rc == 0, err
    assert target.is_file() and target.stat().st_size > 0
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_a_checkpoint_with_a_long_name_resumes(tmp_path, capsys):
    target = tmp_path / ("c" * 250 + ".ckpt")
    argv = _writing("train --checkpoint", target, _graph_file(tmp_path))
    assert run(argv, capsys)[0] == 0
    assert run(argv + ["--resume"], capsys)[0] == 0


def _over_the_limit(kind: str, folder: Path) -> Path:
    name_max = os.pathconf(folder, "PC_NAME_MAX")
    if kind == "name":
        return folder / ("n" * (name_max + 1 - 5) + ".json")
    if kind == "multibyte_name":  # fewer characters than the limit, more bytes
        return folder / ("\u00e9" * (name_max // 2) + ".json")
    if kind == "folder_name":
        return folder / ("d" * (name_max + 1)) / "run.json"
    path_max = os.pathconf(folder, "PC_PATH_MAX")  # many folders, each name short enough
    return folder.joinpath(*["p" * 200] * (path_max // 200 + 1), "run.json")


@pytest.mark.parametrize("kind", ["name", "multibyte_name", "folder_name", "path"])
@pytest.mark.parametrize("output", OUTPUTS)
def test_names_the_system_refuses_are_refused_first(output, kind, tmp_path, capsys,
                                                    monkeypatch):
    """Before any data is read, in one line naming the option and the fix (formerly an
    over-long file name trained first, then failed; a path over the limit said only
    "[Errno 36] File name too long")."""
    target = _over_the_limit(kind, tmp_path)
    argv = _writing(output, target, _graph_file(tmp_path))
    _no_data(monkeypatch)
    before = sorted(os.listdir(tmp_path))
    command, flag = output.split()
    fix = "give a shorter path" if kind == "path" else "give a shorter name"
    refused(argv, capsys, flag, fix, "bytes", command=command)
    assert sorted(os.listdir(tmp_path)) == before


# (errno, the reason's words) of a write the system refuses at the end of a run
REFUSALS = {"no_space": (28, "No space left on device"), "quota": (122, "Disk quota exceeded"),
            "read_only_file_system": (30, "Read-only file system"),
            "permission": (13, "Permission denied")}


@pytest.mark.parametrize("refusal", list(REFUSALS))
@pytest.mark.parametrize("output", OUTPUTS)
def test_a_refused_write_names_path_option_and_reason(output, refusal, tmp_path, capsys,
                                                      monkeypatch):
    """The system refuses the rename that completes the write (the errors a full disk, a
    quota, a read-only mount or permissions give there): one line with the path, the option
    and the reason; the old file as it was; no temporary. Formerly: "[Errno 28] No space
    left on device", no path, no option."""
    import dignn.files
    code, reason = REFUSALS[refusal]
    target = tmp_path / "out" / "result.data"
    target.parent.mkdir()
    target.write_bytes(b"the previous result")
    argv = _writing(output, target, _graph_file(tmp_path))

    def refuse(src, dst):
        if Path(dst) == target:
            raise OSError(code, reason)
        return os.rename(src, dst)
    monkeypatch.setattr(dignn.files.os, "replace", refuse)
    command, flag = output.split()
    refused(argv, capsys, f"{flag} {str(target)!r} could not be written: {reason}",
            "the file there is unchanged", command=command)
    assert target.read_bytes() == b"the previous result"
    assert not [p for p in target.parent.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("output", ["train --json", "train --checkpoint", "plot --out"])
def test_a_folder_that_became_a_file_during_the_run(output, tmp_path, capsys, monkeypatch):
    """A real refusal of the system: the output's folder is replaced by a file while the
    run trains (after the paths were checked)."""
    folder = tmp_path / "out"
    folder.mkdir()
    target = folder / "result.data"
    argv = _writing(output, target, _graph_file(tmp_path))
    step = torch.optim.Adam.step

    def swap_then_step(self, *args, **kwargs):
        if folder.is_dir():
            folder.rmdir()
            folder.write_text("a file now")
        return step(self, *args, **kwargs)
    monkeypatch.setattr(torch.optim.Adam, "step", swap_then_step)
    command, flag = output.split()
    refused(argv, capsys, f"{flag} {str(target)!r} could not be written: Not a directory",
            "nothing was written", command=command)
    assert folder.read_text() == "a file now"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.pt", "out"]


@pytest.mark.skipif(not hasattr(__import__("resource"), "RLIMIT_FSIZE"),
                    reason="RLIMIT_FSIZE is a POSIX limit")
def test_a_file_size_limit_is_one_line_naming_the_checkpoint(tmp_path):
    """The issue's case: under ``ulimit -f`` the checkpoint's write fails with "File too
    large"; the line names the path and --checkpoint, the old checkpoint is kept."""
    import resource
    data = _graph_file(tmp_path)
    checkpoint = tmp_path / "run.ckpt"
    checkpoint.write_bytes(b"an older checkpoint")
    limit = 4096  # bytes: far below a checkpoint's size, above every other file written

    def limited():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": PYTHON_PATH,
           "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run([sys.executable, "-m", "dignn", *_writing("train --checkpoint",
                                                                    checkpoint, data)],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path,
                          preexec_fn=limited)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"dignn train: error: --checkpoint {str(checkpoint)!r} could "
                               f"not be written: File too large"), lines[0]
    assert "ulimit -f" in lines[0]
    assert checkpoint.read_bytes() == b"an older checkpoint"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.pt", "run.ckpt"]


def test_a_partition_file_that_cannot_be_written(tmp_path, capsys, monkeypatch):
    """--partition-file: its folder becomes a file while rank 0 partitions (a world of one
    process here); the line names the option; the other ranks would be told, not left
    waiting at the barrier."""
    import torch.distributed as dist
    import dignn_kernels.distributed as kd
    folder = tmp_path / "parts"
    folder.mkdir()
    target = folder / "graph.part"
    original = kd.partition

    def swap_then_partition(*args, **kwargs):
        folder.rmdir()
        folder.write_text("a file now")
        return original(*args, **kwargs)
    monkeypatch.setattr(kd, "partition", swap_then_partition)
    argv = _writing("train --json", tmp_path / "run.json", _graph_file(tmp_path))
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        refused(argv + ["--distributed", "--partition-file", str(target)], capsys,
                f"--partition-file {str(target)!r} could not be written: Not a directory")
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.pt", "parts"]


def test_the_files_module_examples_run(tmp_path, monkeypatch):
    """dignn.files is not among the public modules whose examples tests/test_docstrings.py
    runs; its examples run here (in an empty folder: they write relative paths)."""
    import doctest
    import dignn.files
    monkeypatch.chdir(tmp_path)
    result = doctest.testmod(dignn.files, optionflags=doctest.ELLIPSIS |
                             doctest.NORMALIZE_WHITESPACE)
    assert result.attempted >= 5 and result.failed == 0
