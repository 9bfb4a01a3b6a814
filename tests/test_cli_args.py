"""What the ``dignn`` command takes (issue 34): ``--json`` is an option in every ``--help``
and usage line; every numeric flag of every subcommand is checked against its range while the
arguments are parsed, before any data is read, in one line naming the flag and the range
(exit 2, no traceback); a mistyped dataset, preset or subcommand name is answered with the
close names; a warning during training is written on a line of its own, never inside the
progress bar's."""
import argparse
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from tqdm.auto import tqdm

import dignn
import dignn.data
import dignn.plot
from dignn import cli
from dignn.spectral import MuBelowSpectrumWarning

# the children run the dignn this process imported
PYTHON_PATH = os.pathsep.join([str(Path(dignn.__file__).resolve().parents[1]),
                               os.environ.get("PYTHONPATH", "")])


def parsers():
    """{"train": parser, "sweep": ..., "plot convergence": ..., "plot mu": ...}: every
    (sub)command's parser."""
    found = {}

    def walk(parser, prefix):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, f"{prefix} {name}".strip())
        if prefix and not any(isinstance(a, argparse._SubParsersAction)
                              for a in parser._actions):
            found[prefix] = parser
    walk(cli.build_parser(), "")
    return found


def refused_while_parsing(argv, capsys):
    """Runs ``dignn argv``, which argparse must refuse (exit 2, no traceback); its stderr."""
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err


@pytest.fixture
def no_data(monkeypatch):
    """Every way the commands read data fails the test: the values must be refused first."""
    def read(*_, **__):
        raise AssertionError("data was read before the arguments were checked")
    monkeypatch.setattr(cli, "_load", read)
    monkeypatch.setattr(dignn.data, "load_dataset", read)
    monkeypatch.setattr(dignn.data, "load_user_file", read)
    monkeypatch.setattr(dignn.plot, "convergence_study", read)
    monkeypatch.setattr(dignn.plot, "mu_study", read)


# ------------------------------------------------------------------ --json PATH --

@pytest.mark.parametrize("command", ["train", "sweep", "plot convergence", "plot mu"])
def test_help_lists_json_as_an_option(command, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(command.split() + ["--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    usage, options = text.split("\noptions:\n")
    assert "[--json PATH]" in usage
    assert re.search(r"^  --json PATH ", options, re.M), options
    # formerly: train's --json, stripped of its option string by the sweep parser's
    # conflict_handler="resolve", ended the usage as a positional PATH
    assert "positional arguments" not in text
    assert not usage.rstrip().endswith(" PATH")


@pytest.mark.parametrize("command", ["train", "sweep"])
def test_usage_errors_list_json_as_an_option(command, capsys, no_data, tmp_path):
    err = refused_while_parsing([command, "--mu", "-1"], capsys)
    usage = err.split(f"dignn {command}: error:")[0]
    assert "[--json PATH]" in usage and not usage.rstrip().endswith(" PATH")
    # and --json works as an option of both
    args = cli.build_parser().parse_args([command, "--json", str(tmp_path / "r.json")] +
                                         (["--grid", "mu=2"] if command == "sweep" else []))
    assert args.json == str(tmp_path / "r.json")


# ------------------------------------------------------- numbers, while parsing --

# (command, flag) -> values out of range (or not numbers) and a value in range. Every numeric
# flag of every subcommand is here: test_every_numeric_flag_is_listed holds the list to the
# parsers.
TRAINING = {"--mu": (["-1", "0", "nan", "inf", "two"], "2.2"),
            "--hidden": (["0", "-3", "2.5"], "16"),
            "--lr": (["0", "-0.01", "nan"], "0.01"),
            "--weight-decay": (["-0.1", "inf"], "0"),
            "--dropout": (["1", "1.5", "-0.1"], "0"),
            "--max-iter": (["0", str(2**63)], "1"),
            "--tol": (["-1e-6", "nan"], "0"),
            "--patience": (["0"], "5"),
            "--seed": ([str(2**62), str(-2**62), "1.5"], "-3"),
            "--epochs": (["0", "-1"], "1"),
            "--num-splits": (["0", "1001"], "1000"),
            "--splits": (["-1", "0,x", ",", "0,-2"], "0,2"),
            "--split-ratio": (["0.6,0.4", "0.6,0.3,0.2", "0,0.5,0.5", "0.6,0.2,nan"],
                              "0.6,0.2,0.2"),
            "--threads": (["0", "1000000000"], "1"),
            "--sync-every": (["0"], "1")}
RUN = {"--threads": TRAINING["--threads"], "--sync-every": TRAINING["--sync-every"],
       "--epochs": TRAINING["--epochs"]}
NUMERIC = {
    "train": {**TRAINING, "--checkpoint-every": (["0"], "1"),
              "--timeout": (["0", "-1", "inf", "1e9"], "0.5")},
    "sweep": {**TRAINING, "--max-settings": (["0"], "1"), "--workers": (["0"], "1"),
              "--heartbeat": (["0"], "1")},
    "tune": {**TRAINING, "--trials": (["0", "-1"], "1"), "--timeout": (["0", "-1", "inf"], "5"),
             "--workers": (["0"], "1"), "--heartbeat": (["0"], "1"),
             "--sampler-seed": ([str(2**62), "1.5"], "3"), "--pruner-startup": (["0"], "1"),
             "--pruner-warmup": (["-1"], "0")},
    "plot convergence": {**RUN, "--mu": (["0", "-2"], "2"), "--max-iter": (["0"], "1")},
    "plot mu": {**RUN, "--mus": (["1,0", "1,-2", "1,nan", ""], "1,1.25"),
                "--max-iter": (["0"], "1")},
    "plot curves": {},  # reads the logs of dignn train --log-dir: no numeric flag
}
REQUIRED = {"sweep": ["--grid", "mu=2"], "tune": ["--trials", "1"]}


def test_every_numeric_flag_is_listed():
    for command, parser in parsers().items():
        checked = set()
        for action in parser._actions:
            assert action.type not in (int, float), (command, action.option_strings)
            if isinstance(action.type, (cli._Number, cli._Numbers)) or \
                    action.type is cli._threads:
                checked.add(action.option_strings[0])
        assert checked == set(NUMERIC[command]), command


@pytest.mark.parametrize("command", sorted(NUMERIC))
def test_numbers_out_of_range_are_refused_while_parsing(command, capsys, no_data):
    parser = parsers()[command]
    for flag, (bad_values, good) in NUMERIC[command].items():
        kind = next(a.type for a in parser._actions if flag in a.option_strings)
        for bad in bad_values:
            err = refused_while_parsing(command.split() + [flag, bad] +
                                        REQUIRED.get(command, []), capsys)
            lines = err.strip().splitlines()
            assert "Traceback" not in err
            # one error line naming the flag and saying the range (the usage before it)
            assert lines[-1].startswith(f"dignn {command}: error: argument {flag}: "), err
            assert sum("error" in line for line in lines) == 1, err
            # a list's message says the range of its items (and of the whole, where that
            # is what is wrong); --threads': at most a few per core
            said = kind.item.describe() if isinstance(kind, cli._Numbers) else \
                kind.describe() if isinstance(kind, cli._Number) else "per core"
            assert said in lines[-1] and "give" in lines[-1], (flag, bad, lines[-1])
        args = parser.parse_args([flag, good] + REQUIRED.get(command, []))
        assert getattr(args, flag[2:].replace("-", "_")) is not None


def test_swept_numbers_are_refused_before_any_data_is_read(capsys, no_data, tmp_path):
    """A sweep's values take the ranges of the options that set the same fields."""
    for grid, said in ((["mu=2,-1"], "setting 1 (mu=-1.0): mu must be a finite number > 0 "
                                     "(as --mu), got -1.0"),
                       (["lr=0", "hidden=8"], "setting 0 (lr=0.0, hidden=8): lr must be a "
                                              "finite number > 0"),
                       (["dropout=0.5,1.5"], "setting 1 (dropout=1.5): dropout must be a "
                                             "number in [0, 1)"),
                       (["epochs=0"], "epochs must be an integer >= 1 (as --epochs)")):
        assert cli.main(["sweep", "--grid", *grid, "--no-progress"]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("dignn sweep: error: setting ")
        assert said in lines[0], lines[0]
    path = tmp_path / "settings.json"
    path.write_text('[{"tol": 1e-8}, {"tol": -1e-6}]')
    assert cli.main(["sweep", "--settings", str(path), "--no-progress"]) == 2
    assert "setting 1 (tol=-1e-06): tol must be a finite number >= 0" in \
        capsys.readouterr().err


def test_ranges_and_edges():
    parse = cli.build_parser().parse_args
    args = parse(["train", "--dropout", "0", "--tol", "0", "--weight-decay", "0", "--seed",
                  "-3", "--splits", "0,2", "--split-ratio", "0.5,0.25,0.25", "--mu", "1e-3",
                  "--timeout", "1e-3", "--hidden", "1"])
    assert (args.dropout, args.tol, args.weight_decay, args.seed) == (0.0, 0.0, 0.0, -3)
    assert args.splits == [0, 2] and args.split_ratio == [0.5, 0.25, 0.25]
    assert (args.mu, args.timeout, args.hidden) == (1e-3, 1e-3, 1)
    # the defaults are kept
    args = parse(["train"])
    assert (args.dataset, args.timeout, args.sync_every, args.mu, args.epochs) == \
        ("csbm", 300.0, 10, None, None)
    assert parse(["sweep", "--grid", "mu=1"]).max_settings == 64
    args = parse(["plot", "convergence"])
    assert (args.datasets, args.mu, args.max_iter) == (["csbm"], 2.0, 30)
    args = parse(["plot", "mu"])
    assert (args.dataset, args.mus, args.max_iter) == ("csbm", [1.0, 1.25, 1.5, 2.0, 2.5,
                                                                5.0], 10)


def test_help_states_the_ranges(capsys):
    with pytest.raises(SystemExit):
        cli.main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for said in ("dropout rate after each layer; a number in [0, 1)",
                 "Adam learning rate; a finite number > 0",
                 "Adam weight decay; a finite number >= 0",
                 "an integer of magnitude below 2**62",
                 "an integer >= 1 and at most 1000 (each split trains a model)"):
        assert said in text, said
    # --tol is relative, not the authors' code's absolute threshold
    tol = text.split(" options: ")[1].split("--tol TOL")[1].split("--input-unit")[0]
    assert "||Z_t - Z_{t-1}||_F <= tol ||Z_t||_F" in tol and "absolute" in tol
    assert "the paper's threshold" not in text


def test_a_bad_number_in_a_subprocess_is_one_line(tmp_path):
    """As a user runs it: exit 2, the usage, one error line, no traceback, no data read
    (--dataset cora with a --data-root that does not exist would be an error of its own)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": PYTHON_PATH}
    proc = subprocess.run([sys.executable, "-m", "dignn", "train", "--dataset", "cora",
                           "--data-root", str(tmp_path / "none"), "--dropout", "1.5"],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "error" in line]
    assert errors == ["dignn train: error: argument --dropout: got '1.5'; give a number in "
                      "[0, 1)"]


# ------------------------------------------------------------------ did you mean --

def test_dataset_typos_name_the_close_datasets(capsys, no_data):
    for command in (["train"], ["sweep", "--grid", "mu=2"]):
        err = refused_while_parsing(command + ["--dataset", "cor"], capsys)
        assert "invalid choice: 'cor' (did you mean cora?)" in err
        assert "mutag" in err and "torch.save" in err  # the names and the file option
    err = refused_while_parsing(["train", "--dataset", "chamelon"], capsys)
    assert "did you mean chameleon or chameleon-directed?" in err
    err = refused_while_parsing(["train", "--dataset", "zzzz"], capsys)
    assert "did you mean" not in err and "choose from" in err
    err = refused_while_parsing(["plot", "mu", "--dataset", "cornel5"], capsys)
    assert "did you mean cornell5?" in err
    err = refused_while_parsing(["plot", "convergence", "--datasets", "cora,chamelon"],
                                capsys)
    assert "'chamelon' (did you mean chameleon or chameleon-directed?)" in err
    # a name in another case is the name
    assert cli.build_parser().parse_args(["train", "--dataset", "Cora"]).dataset == "cora"


def test_a_path_is_not_answered_with_names(tmp_path, capsys, no_data, monkeypatch):
    """What names a file (a folder, a suffix, a leading ~ or .) is said to be missing; a
    file in the working folder named like a typo is the user's file."""
    for text in (str(tmp_path / "cora.pt"), "./cor", "cora.pt", "~/no-such-cora"):
        err = refused_while_parsing(["train", "--dataset", text], capsys)
        assert f"no file at {text!r}" in err and "did you mean" not in err, err
    err = refused_while_parsing(["train", "--dataset", str(tmp_path)], capsys)
    assert "is a folder, not a dataset file" in err
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cor").write_bytes(b"x")
    assert cli.build_parser().parse_args(["train", "--dataset", "cor"]).dataset == "cor"


def test_choices_name_the_close_ones(capsys, no_data):
    err = refused_while_parsing(["train", "--preset", "paer"], capsys)
    assert "invalid choice: 'paer'" in err and "did you mean paper?" in err
    err = refused_while_parsing(["train", "--solver", "anderso"], capsys)
    assert "did you mean anderson?" in err
    err = refused_while_parsing(["trian"], capsys)
    assert "did you mean train?" in err
    err = refused_while_parsing(["train", "--laplacian", "xyz"], capsys)
    assert "invalid choice: 'xyz'" in err and "did you mean" not in err


# ------------------------------------------------ warnings above the progress bar --

def _segments(text: str):
    """The pieces of a terminal stream between carriage returns and newlines: what a bar
    draws over, or a line."""
    return [s for s in re.split(r"[\r\n]", text) if s.strip()]


def test_a_warning_is_written_above_an_open_bar(capsys):
    with warnings.catch_warnings():
        cli._show_warnings()
        bar = tqdm(total=10, desc="csbm split 1", file=sys.stderr, mininterval=0)
        bar.update(3)
        warnings.warn("mu = 0.3 <= lambda_max(Delta) ~ 1.5 (csbm split 1, at epoch 3): the "
                      "explanation", MuBelowSpectrumWarning)
        bar.update(7)
        bar.close()
    text = capsys.readouterr().err
    warned = [s for s in _segments(text) if "lambda_max" in s]
    assert warned == ["warning: mu = 0.3 <= lambda_max(Delta) ~ 1.5 (csbm split 1, at "
                      "epoch 3): the explanation"], text
    assert "3/10" in text and "10/10" in text  # the bar was drawn before and after


def _train_with_a_diverging_solve(tmp_path, progress: str) -> str:
    """stderr of a short run whose fixed point diverges (mu 0.3 below lambda_max ~ 1.57 of
    the random-walk Laplacian): a DivergenceWarning at the first epoch, with the bar open."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": PYTHON_PATH}
    proc = subprocess.run([sys.executable, "-m", "dignn", "train", "--epochs", "20",
                           "--splits", "0", "--hidden", "8", "--solver", "fixed_point",
                           "--mu", "0.3", "--laplacian", "rw", "--device", "cpu", progress],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "DivergenceWarning" in proc.stderr, proc.stderr
    return proc.stderr


def test_a_warning_during_training_lands_on_its_own_line(tmp_path):
    err = _train_with_a_diverging_solve(tmp_path, "--progress")
    assert "%|" in err and "20/20" in err  # the bar was drawn
    for segment in _segments(err):
        if "DivergenceWarning" in segment or segment.startswith("warning:"):
            # formerly "csbm split 0:   0%|   | 0/20 [...]/.../layer.py:244: DivergenceWarning"
            assert "%|" not in segment and not segment.startswith("csbm split"), segment
    diverged = [s for s in _segments(err) if "DivergenceWarning" in s]
    assert diverged and all(re.match(r"\S+\.py:\d+: DivergenceWarning: solver='fixed_point' "
                                     r"diverged at mu=0.3", s) for s in diverged), diverged


def test_without_progress_a_warning_is_a_plain_line(tmp_path):
    err = _train_with_a_diverging_solve(tmp_path, "--no-progress")
    assert "\r" not in err and "%|" not in err
    lines = err.splitlines()
    assert any(re.match(r"\S+\.py:\d+: DivergenceWarning: ", line) for line in lines), err
    assert any(line.startswith("warning: mu = 0.3 <= lambda_max") for line in lines), err
