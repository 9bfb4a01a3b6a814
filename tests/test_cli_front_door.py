"""What a newcomer meets first (issue 45, part 4): ``dignn --version``; a mistyped flag,
dataset, preset, device or command answered with the close names and the subcommand's own
usage; every error that needs no data said before torch is imported; the progress bar's loss
of the epoch it shows; a one-line ``repr`` of the datasets; a note when training stopped with
the loss still falling fast; the thread count of each figure's graph."""
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import dignn
import dignn.device
from dignn import catalog, cli, training
from dignn.data import GraphDataset, InductiveDataset, NodeDataset, Split, csbm
from dignn.presets import TrainConfig
from dignn.training import RunResult, SplitResult

PYTHON_PATH = os.pathsep.join([str(Path(dignn.__file__).resolve().parents[1]),
                               os.environ.get("PYTHONPATH", "")])
HEAVY = ("torch", "dignn_kernels", "torch_geometric", "numpy")


def refused(argv, capsys) -> str:
    """stderr of ``dignn argv``, which argparse must refuse (exit 2)."""
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err


# ------------------------------------------------------------------------- --version --

def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    assert exc.value.code == 0
    out = capsys.readouterr().out.strip()
    assert re.fullmatch(r"dignn \S+ \(torch \S+, torch-geometric \S+, Python \d+\.\d+\.\d+\S*\)",
                        out), out
    assert out.startswith(f"dignn {dignn.__version__} (torch ")


def test_no_command_names_the_commands(capsys):
    err = refused([], capsys)
    assert "a command is required: train, sweep, tune or plot" in err
    err = refused(["plot"], capsys)
    assert err.startswith("usage: dignn plot") and \
        "a figure is required: convergence, mu or curves" in err


# ---------------------------------------------------------------------- did you mean --

def test_a_mistyped_flag_gets_the_subcommands_usage_and_the_close_flag(capsys):
    err = refused(["train", "--datset", "cora"], capsys)
    assert err.startswith("usage: dignn train ")  # not the top level's "usage: dignn [-h]"
    assert err.rstrip().endswith("dignn train: error: unrecognized arguments: --datset cora "
                                 "(did you mean --dataset?)"), err
    err = refused(["sweep", "--grid", "mu=2", "--hiden=8", "--lrr", "0.1"], capsys)
    assert err.startswith("usage: dignn sweep ")
    assert "(--hiden: did you mean --hidden?; --lrr: did you mean --lr?)" in err
    err = refused(["plot", "convergence", "--max-iters", "3"], capsys)
    assert err.startswith("usage: dignn plot convergence ")
    assert "did you mean --max-iter?" in err


def test_a_flag_of_another_command_is_said_to_be_there(capsys):
    err = refused(["sweep", "--grid", "mu=2", "--checkpoint", "run.ckpt"], capsys)
    assert "--checkpoint is an option of dignn train, not of dignn sweep" in err


def test_a_dataset_name_without_its_flag(capsys):
    err = refused(["train", "cora"], capsys)
    assert "unrecognized arguments: cora (did you mean --dataset cora?)" in err


def test_names_and_choices_name_the_close_ones(capsys):
    assert "did you mean neural?" in refused(["train", "--laplacian", "nueral"], capsys)
    assert "did you mean paper?" in refused(["sweep", "--preset", "papr"], capsys)
    assert "did you mean cg?" in refused(["train", "--solver", "gc"], capsys)
    assert "did you mean chameleon or chameleon-directed?" in \
        refused(["train", "--dataset", "chamelon"], capsys)
    assert "did you mean convergence?" in refused(["plot", "convergnce"], capsys)
    err = refused(["train", "--device", "cdua"], capsys)
    assert err.startswith("usage: dignn train") and \
        "argument --device: device must be auto, cpu, cuda or cuda:N, got 'cdua' (did you " \
        "mean cuda?)" in err
    # load_dataset's spelling with "_" is the name
    parser = cli.build_parser()
    assert parser.parse_args(["train", "--dataset", "chameleon_directed"]).dataset == \
        "chameleon-directed"
    assert parser.parse_args(["plot", "mu", "--dataset", "Squirrel_Directed"]).dataset == \
        "squirrel-directed"
    assert parser.parse_args(["train", "--device", " CUDA:1 "]).device == " CUDA:1 "


# ------------------------------------------------------ errors before torch is imported --

# argv -> what the one error line says; every one is told before torch is imported.
EARLY = {
    ("train", "--device", "cuda"): "dignn train: error: device 'cuda' asked for, but no CUDA "
                                   "GPU is visible (CUDA_VISIBLE_DEVICES='' hides every GPU)",
    ("plot", "mu", "--device", "cuda:0"): "dignn plot: error: device 'cuda:0' asked for",
    ("train", "--splits", "3,12"): "dignn train: error: argument --splits: 12 out of range: "
                                   "csbm has 10 splits, 0..9",
    ("sweep", "--grid", "mu=2", "--num-splits", "2", "--splits", "2"):
        "dignn sweep: error: argument --splits: 2 out of range: csbm is made with "
        "--num-splits 2 splits, 0..1",
    ("train", "--dataset", "penn94", "--splits", "4,5"): "penn94 has 5 splits, 0..4",
    ("train", "--dataset", "mutag", "--protocol", "gin", "--splits", "10"):
        "10 out of range: --protocol gin makes 10 folds, 0..9",
    ("train", "--dataset", "cora", "--data-root", "{tmp}/none"):
        "dignn train: error: data_root (--data-root) '{tmp}/none' was given but does not "
        "exist",
    ("plot", "convergence", "--datasets", "csbm,cora", "--data-root", "{tmp}/file"):
        "dignn plot: error: data_root (--data-root) '{tmp}/file' is a file, not a folder",
    ("train", "--dataset", "cora", "--protocol", "gin"):
        "the gin protocol (10-fold cross-validation) is for graph classification datasets; "
        "cora is a node classification dataset",
    ("train", "--dataset", "mutag", "--protocol", "gin", "--patience", "5"):
        "patience=5 stops each fold at its own epoch",
    ("train", "--resume"): "--resume and --checkpoint-every need --checkpoint PATH",
    ("train", "--checkpoint", "{tmp}/run.ckpt", "--resume"):
        "--resume: no checkpoint file at --checkpoint",
    ("train", "--partition-file", "{tmp}/p"): "--partition-file applies to --distributed runs",
    ("train", "--dataset", "cora", "--trust-pickle"): "--trust-pickle applies to a dataset file",
    ("train", "--dataset", "cora", "--split-ratio", "0.5,0.2,0.3"):
        "--split-ratio and --num-splits apply to a dataset file",
}


def test_errors_that_need_no_data_come_before_torch(tmp_path):
    """In one fresh process (as a user runs it, with no GPU visible): each bad command ends
    with exit 2 and its one error line, and torch, dignn_kernels and PyG are never
    imported."""
    (tmp_path / "file").write_text("x")
    cases = [[a.replace("{tmp}", str(tmp_path)) for a in argv] for argv in EARLY]
    code = ("import io, json, sys, contextlib\n"
            "from dignn import cli\n"
            "out = []\n"
            "for argv in json.loads(sys.argv[1]):\n"
            "    err = io.StringIO()\n"
            "    with contextlib.redirect_stderr(err):\n"
            "        try:\n"
            "            status = cli.main(argv)\n"
            "        except SystemExit as e:\n"
            "            status = e.code\n"
            f"    out.append([status, err.getvalue(), [m for m in {HEAVY!r} "
            "if m in sys.modules]])\n"
            "print(json.dumps(out))\n")
    env = {**os.environ, "PYTHONPATH": PYTHON_PATH, "CUDA_VISIBLE_DEVICES": ""}
    env.pop("DIGNN_DATA", None)
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(cases)], capture_output=True,
                          text=True, timeout=120, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    for argv, (status, err, imported) in zip(EARLY, json.loads(proc.stdout)):
        said = EARLY[argv].replace("{tmp}", str(tmp_path))
        assert status == 2 and said in err, (argv, err)
        assert len(err.strip().splitlines()) == 1, (argv, err)  # one line, no usage
        assert imported == [], (argv, imported)


def test_the_early_data_root_errors_are_the_loaders(tmp_path):
    """Said before torch is imported, in the words the loaders use (dignn.data.storage)."""
    from dignn.data import storage
    (tmp_path / "file").write_text("x")
    for root in (tmp_path / "none", tmp_path / "file"):
        args = cli.build_parser().parse_args(["train", "--dataset", "cora", "--data-root",
                                              str(root), "--cache-dir", str(tmp_path / "c")])
        with pytest.raises(OSError) as err:
            storage._roots(root, tmp_path / "c")
        assert cli._early_error(args) == str(err.value)
        assert cli._data_root_error(args, ["csbm"]) is None  # generated: no files read


def test_the_cheap_gpu_check_agrees_with_torch():
    """Where the file check finds that no GPU can be visible, torch finds none either."""
    if dignn.device._no_gpu_reason() is not None:
        assert not torch.cuda.is_available()
    if torch.cuda.is_available():
        assert dignn.device.early_device_error("cuda") is None


@pytest.mark.parametrize("visible, files, platform, version, refused", [
    ("", ["/dev/nvidia0"], "linux", "2.14.1", "CUDA_VISIBLE_DEVICES=''"),
    ("-1", ["/dev/nvidia0"], "linux", "2.14.1", "CUDA_VISIBLE_DEVICES='-1'"),
    ("NoDevFiles", [], "linux", "2.14.1", "hides every GPU"),
    (None, [], "linux", "2.14.1", "no GPU device files"),
    (None, [], "linux", "2.14.1+cpu", "this torch build has no CUDA"),
    (None, ["/dev/nvidia0"], "linux", "2.14.1", None),
    (None, ["/dev/dxg"], "linux", "2.14.1", None),  # WSL
    ("0,1", ["/dev/kfd"], "linux", "2.14.1", None),  # ROCm
    (None, [], "win32", "2.14.1", None),  # no device files to read: torch decides
])
def test_the_cheap_gpu_check_refuses_only_certainties(monkeypatch, visible, files, platform,
                                                      version, refused):
    from importlib import metadata
    import glob
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    monkeypatch.setattr(glob, "glob", lambda pattern: [f for f in files if
                                                        f.startswith(pattern.split("*")[0]
                                                                     .split("[")[0])])
    monkeypatch.setattr(sys, "platform", platform)
    monkeypatch.setattr(metadata, "version", lambda name: version)
    why = dignn.device._no_gpu_reason()
    assert (why is None) if refused is None else (refused in why), why


def test_splits_of_the_generated_graphs_are_counted_right():
    assert len(csbm(num_nodes=40).splits) == catalog.NUM_SPLITS["csbm"]
    assert len(csbm(num_nodes=40, num_splits=3).splits) == 3
    assert set(catalog.NUM_SPLITS) == set(catalog.DATASETS)


# ------------------------------------------------------------------------ progress bar --

def test_the_bar_shows_the_loss_of_the_epoch_it_counts(capsys, monkeypatch, one_thread):
    from tqdm.auto import tqdm
    monkeypatch.setattr(training, "_progress", lambda total, desc, enabled: tqdm(
        total=total, desc=desc, file=sys.stderr, mininterval=0, dynamic_ncols=True))
    graph = csbm(num_nodes=60, num_classes=2, num_features=4, num_splits=1)
    config = TrainConfig(hidden=4, epochs=20, max_iter=3)
    result = training.train_node_split(graph, config, 0, progress=True, sync_every=10)
    frames = re.split(r"[\r\n]", capsys.readouterr().err)
    shown = {int(m.group(1)): float(m.group(2)) for f in frames
             if (m := re.search(r"(\d+)/20 .*loss=([0-9.]+)", f))}
    assert set(shown) == {10, 20}, frames  # formerly 10/20 was drawn without a loss
    for epoch, loss in shown.items():  # formerly 20/20 showed epoch 10's loss
        assert loss == pytest.approx(result.train_loss_history[epoch - 1], abs=6e-4)


# ------------------------------------------------------------------------------ repr --

def test_datasets_print_in_one_short_line():
    graph = csbm()
    text = repr(graph)
    assert text == ("NodeDataset('csbm', x=[1500, 32], y=[1500], edge_index=[2, 15000], "
                    "num_classes=4, splits=10 x (train 900, val 300, test 300))")
    assert repr(graph.splits[0]) == "Split(train=[900], val=[300], test=[300])"
    sparse = NodeDataset("s", torch.eye(3).to_sparse(), torch.zeros(3, dtype=torch.long),
                         torch.zeros(2, 0, dtype=torch.long), 1, [])
    assert "x=[3, 3] (sparse)" in repr(sparse) and "splits=0" in repr(sparse)
    split = Split(torch.arange(5), torch.arange(2), torch.arange(2))
    other = Split(torch.arange(4), torch.arange(3), torch.arange(2))
    graphs = GraphDataset("g", [object()] * 9, 7, 2, [split, other])
    assert repr(graphs) == ("GraphDataset('g', graphs=9, num_features=7, num_classes=2, "
                            "splits=2 x (~train 5, val 2, test 2))")
    inductive = InductiveDataset("ppi", [object()] * 24, 50, 121, [split])
    assert repr(inductive) == ("InductiveDataset('ppi', graphs=24, num_features=50, "
                               "num_labels=121, splits=1 x (train 5, val 2, test 2))")


# ------------------------------------------------------------- the loss still falling --

def _run(histories, epochs=None, epochs_run=None):
    epochs = epochs or len(histories[0])
    splits = [SplitResult(k, 0.5, 0.5, 1, epochs_run or len(h), 1.0, 1.0, 1.0,
                          train_loss_history=list(h)) for k, h in enumerate(histories)]
    return RunResult("csbm", "neural", TrainConfig(epochs=epochs), splits)


STRAIGHT = [2.0 - 0.05 * t for t in range(20)]  # stopped while falling as fast as ever
FLOOR = [1.0 + 0.5 ** t for t in range(40)]  # fell, then flat


def test_late_fall():
    assert training.late_fall(STRAIGHT) == pytest.approx(0.28, abs=0.01)
    assert training.late_fall(FLOOR) == pytest.approx(0.0, abs=1e-6)
    assert math.isnan(training.late_fall([1.0] * 20))  # no fall at all: nothing to say
    assert math.isnan(training.late_fall([1.0, 0.5]))  # too short
    assert math.isnan(training.late_fall(STRAIGHT[:-1] + [math.nan]))


def test_the_note_needs_most_splits_still_falling():
    note = training.still_falling_note(_run([STRAIGHT, STRAIGHT, FLOOR[:20]]))
    assert note.startswith("note: the training loss was still falling fast when training "
                           "stopped after 20 epochs: 28% of its fall came in the last quarter")
    assert "2 of 3 splits" in note and "--epochs 40" in note
    assert training.still_falling_note(_run([STRAIGHT])) is not None
    assert training.still_falling_note(_run([STRAIGHT, FLOOR[:20], FLOOR[:20]])) is None
    assert training.still_falling_note(_run([FLOOR])) is None
    # a split stopped by --patience did not run out of epochs
    assert training.still_falling_note(_run([STRAIGHT], epochs=30, epochs_run=20)) is None


def test_the_cli_ends_a_short_run_with_the_note(capsys, monkeypatch):
    def fake_train(dataset, config, splits=None, progress=True, on_split=None, **_):
        return _run([STRAIGHT] * 2, epochs=config.epochs)
    monkeypatch.setattr(training, "train", fake_train)
    assert cli.main(["train", "--epochs", "20", "--no-progress", "--device", "cpu"]) == 0
    err = capsys.readouterr().err
    assert "note: the training loss was still falling fast when training stopped after 20 " \
           "epochs" in err and "(e.g. --epochs 40)" in err


# -------------------------------------------------------------------- plot's threads --

@pytest.mark.skipif(catalog.usable_cores() < 2, reason="needs two cores to tell 1 from all")
def test_a_later_graph_gets_the_cores_an_earlier_small_one_did_not(monkeypatch, capsys):
    """The figure's second graph: formerly "1 CPU thread (the cores available)", torch's
    count after the first graph's choice had set it to 1."""
    before = torch.get_num_threads()
    monkeypatch.setattr(dignn.device, "_TORCH_DEFAULT_THREADS", None)
    torch.set_num_threads(2)
    try:
        assert dignn.device.choose_threads(10**9) == (2, "the cores available")
        assert dignn.device.choose_threads(10) == (1, "small graph")
        torch.set_num_threads(1)  # what the CLI does for the small graph
        assert dignn.device.choose_threads(10**9) == (2, "the cores available")
    finally:
        torch.set_num_threads(before)


def test_help_has_no_markup(capsys):
    """The top-level help is the module docstring's paragraph, without its reST backticks."""
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert "``" not in out and "dignn train trains DIGNN" in out
