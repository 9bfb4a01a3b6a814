"""``dignn train --config run.toml`` / ``--print-config`` (TOML, flags override the file, every
value checked as its flag's, unknown keys answered with the closest, all before torch is
imported), ``--log-dir`` (per split a CSV and a TensorBoard run, written at the loop's host
reads and adding none) and ``dignn plot curves DIR``."""
import csv
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import dignn
import dignn.data
from dignn import cli, training
from dignn.data import csbm
from dignn.logs import COLUMNS, SCALARS, EpochLogs, read_curves
from dignn.presets import TrainConfig

PYTHON_PATH = os.pathsep.join([str(Path(dignn.__file__).resolve().parents[1]),
                               os.environ.get("PYTHONPATH", "")])
HEAVY = ("torch", "dignn_kernels", "torch_geometric", "numpy")
SMALL = dict(num_nodes=120, num_classes=3, num_features=8, avg_degree=4, homophily=0.8,
             signal=1.0, num_splits=2)

pytestmark = pytest.mark.usefixtures("one_thread")


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def printed(argv, capsys) -> str:
    """stdout of ``dignn train ... --print-config`` (exit 0, nothing trained)."""
    assert cli.main(["train", *argv, "--print-config"]) == 0
    out = capsys.readouterr().out
    return out


def refused(argv, capsys) -> str:
    assert cli.main(["train", *argv]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    return err.strip()


@pytest.fixture
def no_data(monkeypatch):
    def read(*_, **__):
        raise AssertionError("data was read")
    monkeypatch.setattr(cli, "_load", read)
    monkeypatch.setattr(dignn.data, "load_dataset", read)


# ------------------------------------------------------------------- config files --

CONFIG = """\
epochs = 7
data_root = "some/where"
cache-dir = "a \\"quoted\\" dir"
splits = [0, 1]
split-ratio = "0.5,0.25,0.25"
mu = 2
lr = 1e-3
progress = false
no-compile = true
laplacian = "rw"
seed = -3
"""


def test_print_config_round_trips(tmp_path, capsys, no_data):
    first = printed(["--config", str(write(tmp_path / "run.toml", CONFIG))], capsys)
    values = tomllib.loads(first)
    assert values["epochs"] == 7 and values["data-root"] == "some/where"
    assert values["cache-dir"] == 'a "quoted" dir' and values["splits"] == [0, 1]
    assert values["split-ratio"] == [0.5, 0.25, 0.25] and values["mu"] == 2.0
    assert values["lr"] == 1e-3 and values["progress"] is False
    assert values["compile"] is False and values["laplacian"] == "rw" and values["seed"] == -3
    assert values["dataset"] == "csbm" and "hidden" not in values  # unset: a comment
    assert "# hidden =" in first and "config" not in values and "print-config" not in values
    # read back, it resolves to the same options
    again = printed(["--config", str(write(tmp_path / "printed.toml", first))], capsys)
    assert again == first
    # and the file's options are the ones the run gets
    args = cli._config_arguments(cli.build_parser(), ["train"], tmp_path / "printed.toml")
    assert (args.epochs, args.splits, args.split_ratio, args.mu) == \
        (7, [0, 1], [0.5, 0.25, 0.25], 2.0)
    assert args.progress is False and args.laplacian == "rw" and args.lr == 1e-3


def test_flags_override_the_file(tmp_path, capsys, no_data):
    config = str(write(tmp_path / "run.toml", CONFIG))
    values = tomllib.loads(printed(["--epochs", "3", "--config", config, "--progress",
                                    "--splits", "1", "--hidden", "16"], capsys))
    assert values["epochs"] == 3 and values["progress"] is True and values["splits"] == [1]
    assert values["hidden"] == 16  # not in the file
    assert values["mu"] == 2.0 and values["laplacian"] == "rw"  # from the file


def test_unknown_key_names_the_key_the_file_and_the_closest(tmp_path, capsys, no_data):
    config = write(tmp_path / "run.toml", "epochs = 3\nhiden = 8\n")
    err = refused(["--config", str(config)], capsys)
    assert err == (f"dignn train: error: {config}: unknown key 'hiden' (did you mean hidden?); "
                   f"the keys are the flags of dignn train without their dashes (dignn train "
                   f"--help)")
    err = refused(["--config", str(write(tmp_path / "b.toml", "data_rot = 'x'\n"))], capsys)
    assert "unknown key 'data_rot' (did you mean data-root?)" in err
    # a key that sets the same option twice, and a table
    err = refused(["--config", str(write(tmp_path / "c.toml", "data-root = 'a'\n"
                                                               "data_root = 'b'\n"))], capsys)
    assert "set the same option --data-root" in err
    err = refused(["--config", str(write(tmp_path / "d.toml", "[train]\nepochs = 3\n"))],
                  capsys)
    assert "key 'train'" in err and "did you mean train" not in err


@pytest.mark.parametrize("text, said", [
    ('hidden = "8"', "key 'hidden' (--hidden) must be an integer, got '8' (a string)"),
    ("hidden = 8.5", "key 'hidden' (--hidden) must be an integer, got 8.5 (a number)"),
    ("mu = true", "key 'mu' (--mu) must be a number, got true (a boolean)"),
    ('progress = "no"', "key 'progress' (--progress) must be true or false, got 'no'"),
    ("splits = [0, 1.5]", "key 'splits' (--splits) must be a list of integers such as "
                          "[0, 1, 2]"),
    ("data-root = 3", "key 'data-root' (--data-root) must be a string, got 3 (an integer)"),
    ("mu = -1", "key 'mu' (--mu): got '-1'; give a finite number > 0"),
    ("splits = [0, -2]", "key 'splits' (--splits): in '0,-2': got '-2'; give an integer >= 0"),
    ('solver = "gc"', "key 'solver' (--solver): invalid choice 'gc' (did you mean cg?)"),
    ("epochs =", "is not valid TOML: Invalid value (at line 1, column 9)"),
])
def test_a_wrong_value_names_the_key_and_the_type(text, said, tmp_path, capsys, no_data):
    err = refused(["--config", str(write(tmp_path / "run.toml", text + "\n"))], capsys)
    assert err.startswith("dignn train: error: ") and said in err, err


def test_a_missing_config_file(tmp_path, capsys, no_data):
    err = refused(["--config", str(tmp_path / "none.toml")], capsys)
    assert err.endswith("none.toml': no such file")


def test_config_errors_come_before_torch(tmp_path):
    """In a fresh process: the file's errors are said (one line, exit 2) and --print-config
    prints, with torch, dignn_kernels and PyG never imported."""
    bad = write(tmp_path / "bad.toml", "epochz = 3\n")
    good = write(tmp_path / "good.toml", "epochs = 3\nsplits = [1]\n")
    code = ("import io, json, sys, contextlib\n"
            "from dignn import cli\n"
            "out = []\n"
            "for argv in json.loads(sys.argv[1]):\n"
            "    err, std = io.StringIO(), io.StringIO()\n"
            "    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(std):\n"
            "        status = cli.main(argv)\n"
            f"    out.append([status, err.getvalue(), std.getvalue(), [m for m in {HEAVY!r} "
            "if m in sys.modules]])\n"
            "print(json.dumps(out))\n")
    cases = [["train", "--config", str(bad)], ["train", "--config", str(good), "--print-config"]]
    env = {**os.environ, "PYTHONPATH": PYTHON_PATH, "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(cases)], capture_output=True,
                          text=True, timeout=120, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    (status, err, _, imported), (status2, err2, out2, imported2) = json.loads(proc.stdout)
    assert status == 2 and "unknown key 'epochz' (did you mean epochs?)" in err
    assert imported == [] and imported2 == []
    assert status2 == 0 and err2 == "" and tomllib.loads(out2)["splits"] == [1]


# ----------------------------------------------------------------- per-epoch logs --

@pytest.fixture
def small(monkeypatch):
    monkeypatch.setattr(dignn.data, "csbm", lambda **kw: csbm(**SMALL))


def read_csv(path: Path):
    with open(path, newline="") as f:
        return list(csv.reader(f))


def test_log_dir_writes_csv_and_tensorboard(small, tmp_path, capsys):
    logs = tmp_path / "logs"
    config = write(tmp_path / "run.toml",
                   f'log-dir = "{logs}"\nepochs = 5\nhidden = 8\nmax-iter = 3\n'
                   f'sync-every = 2\nprogress = false\ndevice = "cpu"\n')
    assert cli.main(["train", "--config", str(config), "--splits", "0,1",
                     "--json", str(tmp_path / "r.json")]) == 0
    record = json.loads((tmp_path / "r.json").read_text())
    for k, split in enumerate((0, 1)):
        rows = read_csv(logs / "csbm" / f"split_{split}.csv")
        assert tuple(rows[0]) == COLUMNS and len(rows) == 1 + 5
        assert [int(r[0]) for r in rows[1:]] == [1, 2, 3, 4, 5]
        table = [dict(zip(COLUMNS, r)) for r in rows[1:]]
        # the training step's loss of every epoch, as the run's history
        assert [float(r["train_loss"]) for r in table] == \
            pytest.approx(record["train_loss_history"][k])
        assert all(0 <= float(r[c]) <= 1 for r in table
                   for c in ("train_acc", "val_acc", "test_acc"))
        assert all(1 <= int(r["solver_iterations"]) <= 3 for r in table)
        assert all(float(r["ms_per_epoch"]) > 0 for r in table)
        # lambda_max: on the selected epoch's row only (the check after training)
        best = record["best_epoch"][k]
        filled = [int(r["epoch"]) for r in table if r["lambda_max"] != ""]
        assert filled == [best]
        assert float(table[best - 1]["lambda_max"]) == \
            pytest.approx(record["lambda_max"][k][1])
        assert float(table[best - 1]["val_acc"]) == pytest.approx(record["val_acc"][k])
        # TensorBoard, read by its own reader
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
        runs = list((logs / "csbm" / f"split_{split}").glob("events.out.tfevents.*"))
        assert runs
        events = EventAccumulator(str(logs / "csbm" / f"split_{split}"))
        events.Reload()
        assert set(events.Tags()["scalars"]) == set(SCALARS)
        for tag in SCALARS:
            steps = [e.step for e in events.Scalars(tag)]
            assert steps == ([best] if tag == "lambda_max" else [1, 2, 3, 4, 5]), tag
        assert [e.value for e in events.Scalars("val_acc")] == \
            pytest.approx([float(r["val_acc"]) for r in table])


def test_logging_adds_no_host_read(tmp_path, monkeypatch):
    """The rows are read with the loop's own polls: the same count of host reads with and
    without a log, whatever the number of epochs."""
    from conftest import HostReads
    from dignn_kernels import FusedImplicitDiffusion
    monkeypatch.setattr(FusedImplicitDiffusion, "sync_checks", False)
    monkeypatch.setattr(training, "_spectral", lambda *args: 1.0)
    graph = csbm(**SMALL)
    config = TrainConfig(hidden=8, max_iter=3, lr=0.05)
    training.train_node_split(graph, config.replace(epochs=1), 0, progress=False)
    counts = {}
    for epochs in (4, 8):
        for logged in (False, True):
            log = EpochLogs(tmp_path / f"{epochs}", tensorboard=False).split("g", 0) \
                if logged else None
            with HostReads() as reads:
                training.train_node_split(graph, config.replace(epochs=epochs), 0,
                                          progress=False, sync_every=4, log=log)
            counts[epochs, logged] = reads.count
            if logged:
                log.finish()
                assert len(read_csv(tmp_path / f"{epochs}" / "g" / "split_0.csv")) == \
                    1 + epochs
    assert counts[4, True] == counts[4, False]
    assert counts[8, True] == counts[8, False] == counts[4, False] + 1  # one more poll


def test_rows_are_on_disk_at_each_sync_point(tmp_path, monkeypatch):
    """A run cut short leaves the rows of its last host read, whole, in the CSV."""
    graph = csbm(**SMALL)
    seen = []
    real = training._EpochRecorder.flush

    def flush(self, values, stopped):
        real(self, values, stopped)
        seen.append(len(read_csv(self.log.csv_path)) - 1)
    monkeypatch.setattr(training._EpochRecorder, "flush", flush)
    log = EpochLogs(tmp_path, tensorboard=False).split("g", 0)
    result = training.train_node_split(graph, TrainConfig(hidden=8, max_iter=3, epochs=7),
                                       0, progress=False, sync_every=3, log=log)
    log.close()  # not finish(): as a run interrupted after its last read
    assert seen == [3, 6, 7] and result.epochs_run == 7
    assert read_curves(tmp_path)["g/split_0"][-1]["epoch"] == 7


def test_patience_cuts_the_log_where_the_split_stopped(tmp_path):
    graph = csbm(**SMALL)
    log = EpochLogs(tmp_path, tensorboard=False).split("g", 0)
    result = training.train_node_split(graph, TrainConfig(hidden=8, max_iter=3, epochs=200,
                                                          patience=2, lr=0.05), 0,
                                       progress=False, sync_every=5, log=log)
    log.finish(result.lambda_max_end, result.best_epoch)
    assert result.epochs_run < 200
    rows = read_curves(tmp_path)["g/split_0"]
    assert [r["epoch"] for r in rows] == list(range(1, result.epochs_run + 1))


def test_without_tensorboard_the_csv_and_one_line(small, tmp_path, capsys, monkeypatch):
    import dignn.logs
    monkeypatch.setattr(dignn.logs, "tensorboard_available", lambda: False)
    logs = tmp_path / "logs"
    assert cli.main(["train", "--log-dir", str(logs), "--splits", "1", "--epochs", "2",
                     "--hidden", "8", "--max-iter", "3", "--no-progress",
                     "--device", "cpu"]) == 0
    err = capsys.readouterr().err
    notes = [line for line in err.splitlines() if "tensorboard" in line.lower()]
    assert notes == ['note: --log-dir writes the CSV logs only; TensorBoard files need the '
                     'tensorboard package: pip install "dignn-kernels[logs]"']
    assert sorted(p.name for p in (logs / "csbm").iterdir()) == ["split_1.csv"]
    assert len(read_csv(logs / "csbm" / "split_1.csv")) == 3


def test_bad_log_dirs(tmp_path, capsys, no_data):
    a_file = write(tmp_path / "file", "x")
    err = refused(["--log-dir", str(a_file)], capsys)
    assert "--log-dir" in err and "is a file, not a folder" in err
    err = refused(["--log-dir", str(tmp_path), "--distributed"], capsys)
    assert "--log-dir applies to runs in one process" in err


# ------------------------------------------------------------------ plot curves --

def test_plot_curves_draws_the_logs(tmp_path, capsys):
    logs = EpochLogs(tmp_path / "logs", tensorboard=False)
    for split, start in ((0, 1.5), (3, 1.2)):
        log = logs.split("csbm", split)
        log.write([{"epoch": e, "train_loss": start / e, "val_loss": start / e + 0.1,
                    "train_acc": 0.1 * e, "val_acc": 0.08 * e, "test_acc": 0.07 * e}
                   for e in range(1, 5)])
        log.finish(2.5, 4)
    out = tmp_path / "figs" / "curves.png"
    assert cli.main(["plot", "curves", str(tmp_path / "logs"), "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    said = capsys.readouterr().out.splitlines()
    assert said == ["csbm/split_0: 4 epochs, training loss 1.5 -> 0.375, best validation "
                    "accuracy 32.00% at epoch 4",
                    "csbm/split_3: 4 epochs, training loss 1.2 -> 0.3, best validation "
                    "accuracy 32.00% at epoch 4",
                    f"wrote {out}"]
    # the default: DIR/curves.png
    assert cli.main(["plot", "curves", str(tmp_path / "logs")]) == 0
    assert (tmp_path / "logs" / "curves.png").stat().st_size > 10_000


def test_plot_curves_without_logs_is_one_line(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "split_0.csv").write_text("a,b\n1,2\n")  # not a dignn log
    for folder, said in ((tmp_path / "empty", "no per-epoch logs in"),
                         (tmp_path / "other", "no per-epoch logs in"),
                         (tmp_path / "none", "does not exist")):
        assert cli.main(["plot", "curves", str(folder)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("dignn plot: error: ") and said in err, err
        assert len(err.splitlines()) == 1
    assert not list((tmp_path / "empty").iterdir())
