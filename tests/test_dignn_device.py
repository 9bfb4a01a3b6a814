"""Where `dignn` runs: --device, the device-side epoch loop (no host reads inside an epoch),
the run record, thread choice, and the command line's speed and help. The same code runs on
a GPU; here it runs with device="cpu" and the GPU's defaults (no host checks in the layer)."""
import json
import re
import subprocess
import sys

import pytest
import torch

from dignn import cli
from dignn.data import csbm
from dignn.device import DeviceUnavailableError, choose_threads, resolve_device
from dignn.presets import TrainConfig
from dignn import training
from dignn.training import train, train_node_split
from dignn_kernels import FusedImplicitDiffusion
from conftest import HostReads

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = dict(num_nodes=200, num_classes=3, num_features=12, avg_degree=6, homophily=0.8,
             signal=1.0, num_splits=2)
CONFIG = TrainConfig(hidden=8, lr=0.05, max_iter=4, dropout=0.2)


@pytest.fixture(scope="module")
def graph():
    return csbm(**SMALL)


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_resolve_device(no_gpu):
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device(None) == torch.device("cpu")
    assert resolve_device(" CPU ") == torch.device("cpu")
    for spec in ("cuda", "cuda:1"):
        with pytest.raises(DeviceUnavailableError, match="use --device cpu"):
            resolve_device(spec)
    with pytest.raises(DeviceUnavailableError, match="auto, cpu, cuda or cuda:N"):
        resolve_device("gpu0")


def test_cli_device_cuda_without_gpu_is_one_line(no_gpu, capsys):
    assert cli.main(["train", "--device", "cuda", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("dignn train: error: device 'cuda' asked for") and "\n" not in err
    assert cli.main(["plot", "mu", "--device", "cuda:0"]) == 2
    assert capsys.readouterr().err.startswith("dignn plot: error: device 'cuda:0'")


def test_no_host_reads_inside_epochs(graph, monkeypatch):
    """With the layer's GPU default (no host checks), the reads of a split do not grow with
    its epochs: they are the fixed ones after the loop and one poll per sync_every
    epochs."""
    monkeypatch.setattr(FusedImplicitDiffusion, "sync_checks", False)
    monkeypatch.setattr(training, "_spectral", lambda *args: 1.0)  # before/after: not epochs
    train_node_split(graph, CONFIG.replace(epochs=1), 0, progress=False)  # builds the graph
    counts = {}
    for epochs in (3, 12):
        with HostReads() as reads:
            train_node_split(graph, CONFIG.replace(epochs=epochs), 0, progress=False,
                             sync_every=100)
        counts[epochs] = reads.count
    assert counts[3] == counts[12]
    with HostReads() as reads:
        train_node_split(graph, CONFIG.replace(epochs=12), 0, progress=False, sync_every=3)
    assert reads.count == counts[12] + 3  # polls at epochs 3, 6, 9 (and 12, as before)


@pytest.mark.parametrize("patience", [None, 4])
def test_sync_every_does_not_change_results(graph, patience):
    """Selection and early stopping are decided on the device every epoch: reading them every
    epoch or every 7 gives the same split."""
    config = CONFIG.replace(epochs=40, patience=patience)
    every = train_node_split(graph, config, 1, progress=False, sync_every=1)
    sparse = train_node_split(graph, config, 1, progress=False, sync_every=7)
    assert (every.best_epoch, every.epochs_run) == (sparse.best_epoch, sparse.epochs_run)
    assert every.test_acc == sparse.test_acc and every.val_history == sparse.val_history
    if patience is not None:
        assert every.epochs_run - every.best_epoch == patience < 40 - every.best_epoch


def test_bad_sync_every(graph):
    with pytest.raises(ValueError, match="sync_every must be a positive integer"):
        train(graph, CONFIG.replace(epochs=2), progress=False, sync_every=0)


def test_node_dataset_moves_whole(graph):
    moved = graph.to("meta")
    assert moved.device.type == "meta" and moved.x.is_meta and moved.edge_index.is_meta
    assert all(t.is_meta for s in moved.splits for t in (s.train, s.val, s.test))
    assert graph.to("cpu") is graph and graph.x.device.type == "cpu"


def test_run_record_names_the_machine(graph, tmp_path, capsys):
    path = tmp_path / "run.json"
    assert cli.main(["train", "--epochs", "3", "--splits", "0", "--no-progress",
                     "--device", "cpu", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert "device cpu (" in out and "1 CPU thread (small graph)" in out
    assert "ms per epoch (train step + evaluation) on" in out and "backend cpu" in out
    record = json.loads(path.read_text())
    assert record["device"] == "cpu" and record["backend"] == ["cpu"]
    assert record["torch"] == torch.__version__ and record["threads"] == 1
    assert record["ms_per_epoch"] > 0 and len(record["ms_per_epoch_per_split"]) == 1
    assert record["command"].startswith("dignn ")


def test_thread_choice():
    assert choose_threads(10_000) == (1, "small graph")
    assert choose_threads(10_000, requested=1) == (1, "--threads")
    assert choose_threads(10_000, requested=2) == (2, "--threads")
    threads, why = choose_threads(10 ** 9)
    assert threads >= 1 and why == "the cores available"


def test_help_is_fast_and_complete():
    """`dignn --help` must not import torch, and every option says what it does."""
    code = ("import sys, dignn.cli as c; c.build_parser(); "
            "print(sorted(m for m in ('torch', 'dignn_kernels', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"
    parser = cli.build_parser()
    stack, missing = [parser], []
    while stack:
        p = stack.pop()
        for action in p._actions:
            if action.choices and isinstance(action.choices, dict):  # subcommands
                stack.extend(action.choices.values())
            elif action.option_strings and not action.help:
                missing.append(f"{p.prog} {action.option_strings[0]}")
    assert not missing, missing


def test_boolean_options_come_in_pairs():
    parser = cli.build_parser()
    args = parser.parse_args(["train", "--no-spectral-norm", "--no-progress", "--compile"])
    assert args.spectral_norm is False and args.progress is False and args.compile is True
    assert parser.parse_args(["train"]).spectral_norm is None  # the preset decides
    assert parser.parse_args(["plot", "mu", "--progress"]).progress is True


@pytest.mark.slow
def test_compiled_training_matches_eager(graph):
    """--compile: the model's forward through torch.compile trains to the same model."""
    torch._dynamo.reset()
    config = CONFIG.replace(epochs=6, dropout=0.0)
    eager = train_node_split(graph, config, 0, progress=False)
    compiled = train_node_split(graph, config, 0, progress=False, compile_model=True)
    assert compiled.best_epoch == eager.best_epoch
    assert compiled.val_history == pytest.approx(eager.val_history, abs=1e-6)
    assert compiled.test_loss == pytest.approx(eager.test_loss, rel=1e-4)


@pytest.mark.slow
def test_default_run_gives_no_warning(capsys):
    """`dignn train` with no arguments (10 CSBM splits): mu stays above the trained
    Laplacian's lambda_max on every split, so neither the spectral check nor the solver
    warns."""
    assert cli.main(["train", "--no-progress"]) == 0
    captured = capsys.readouterr()
    assert "warning" not in captured.err.lower(), captured.err
    assert "note:" not in captured.err, captured.err  # its loss is not still falling
    assert "over 10 split(s)" in captured.out and "1 CPU thread (small graph)" in captured.out
    accuracy = float(re.search(r"test accuracy ([0-9.]+) \+-", captured.out).group(1))
    assert accuracy > 80.0, captured.out  # the csbm row: 83-84 % (dignn.presets)


def test_cli_choices_are_the_layers():
    """The CLI spells the layer's solvers, backends and node orders out (it imports no torch for --help);
    they are the library's."""
    import dignn_kernels as dk
    from dignn import catalog
    assert catalog.SOLVERS == dk.SOLVERS
    assert catalog.BACKENDS == ("auto",) + dk.backends.BACKENDS == dk.BACKENDS
    assert catalog.REORDERINGS == dk.reorder.REORDERINGS
