"""The ``dignn`` command.

``dignn train`` trains DIGNN with a preset (the paper's tables 6/7, ``--preset paper``, or the
default ``tuned``), one model per split with model selection on validation accuracy, and prints
the test accuracy per split and their mean +- std. ``dignn plot convergence|mu`` draws the
paper's convergence figure and mu study as PNG files. ``dignn train`` with no ``--dataset``
trains on the generated CSBM graph (no data files, no network).

``dignn sweep`` trains a grid (or list) of settings on every split, chooses the one of the best
mean validation accuracy and reports only that setting's test accuracy. ``--protocol gin``
(graph datasets) reports GIN's 10-fold cross-validation number instead (:mod:`dignn.protocols`).
"""
from __future__ import annotations

import argparse
import builtins
import io
import json
import math
import os
import re
import shlex
import sys
import time
import warnings
from pathlib import Path
from typing import List, Optional, Sequence

from .flags import (POSITIVE, NON_NEGATIVE, PROBABILITY, POSITIVE_INT, INDEX, NUM_SPLITS,
                    TIMEOUT, SPLIT_LIST, MU_LIST, SPLIT_RATIO, _Number, _Numbers, _close,
                    _close_names, _seed_type, _threads)

__all__ = ["main", "build_parser"]


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose refusal of a choice (a subcommand, --preset, --solver, ...)
    also names the choices close to what was typed, and which takes ``-1e-6`` and ``-inf``
    as values (refused by the flag's range, not as options: no option begins with a digit).
    An unknown flag is refused by the subcommand's own parser (its usage, not the top
    level's) with the flags close to it, or the subcommand that has it (git's "did you
    mean")."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = re.compile(r"^-(\.?\d|inf$|infinity$|nan$)", re.I)
        self._leaf = False  # a subcommand's own parser (build_parser sets it)
        self._homes: dict = {}  # flag -> the commands that take it (build_parser sets it)

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        if extras and self._leaf:  # said here, with this subcommand's usage
            self.error(self._unrecognized(extras))
        return namespace, extras

    def parse_args(self, args=None, namespace=None):
        namespace, extras = self.parse_known_args(args, namespace)
        if extras:
            self.error(self._unrecognized(extras))
        parser = self  # a (sub)command that needs one of its own, said with its choices
        while parser is not None:
            subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
            if not subs:
                break
            chosen = getattr(namespace, subs[0].dest, None)
            if chosen is None:
                names = list(subs[0].choices)
                parser.error(f"a {subs[0].dest} is required: "
                             f"{', '.join(names[:-1])} or {names[-1]} ({parser.prog} --help "
                             f"says what each does)")
            parser = subs[0].choices[chosen]
        return namespace

    def _unrecognized(self, extras: Sequence[str]) -> str:
        """argparse's "unrecognized arguments: ..." with, for each unknown flag, the close
        flags of this command or the commands that take it, and for a bare dataset name the
        flag it needs."""
        from .catalog import DATASETS
        flags = sorted(o for o in self._option_string_actions if o.startswith("--"))
        hints = []
        for k, text in enumerate(extras):
            after_flag = k > 0 and extras[k - 1].startswith("-") and "=" not in extras[k - 1]
            if text.startswith("-") and not self._negative_number_matcher.match(text):
                flag = text.split("=", 1)[0]
                close = _close(flag.lstrip("-"), [f[2:] for f in flags], n=2)
                if close:
                    hints.append((flag, f"did you mean {' or '.join('--' + c for c in close)}"
                                        f"?"))
                elif self._homes.get(flag):
                    hints.append((flag, f"{flag} is an option of "
                                        f"{' and '.join(self._homes[flag])}, not of "
                                        f"{self.prog}"))
            elif text.lower() in DATASETS and "--dataset" in flags and not after_flag:
                hints.append((text, f"did you mean --dataset {text}?"))
        message = f"unrecognized arguments: {' '.join(extras)}"
        if len(hints) == 1:
            return f"{message} ({hints[0][1]})"
        if hints:
            return f"{message} ({'; '.join(f'{what}: {hint}' for what, hint in hints)})"
        return message

    def _check_value(self, action, value):
        try:
            super()._check_value(action, value)
        except argparse.ArgumentError as err:
            hint = _close_names(value, action.choices or ())
            if not hint:
                raise
            raise argparse.ArgumentError(action, err.message + hint) from None


class _Version(argparse.Action):
    """``--version``: the package's version and those of what it runs on (as in a bug
    report), read from the installed packages' metadata, without importing them."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                 help="print dignn's version (and torch's, PyG's and Python's) and exit"):
        super().__init__(option_strings, dest, nargs=0, default=default, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        parser._print_message(version_line() + "\n", sys.stdout)  # as argparse's own
        parser.exit()


def version_line() -> str:
    """``dignn 0.1.0 (torch 2.14.1, torch-geometric 2.8.1, Python 3.11.7)``: what
    ``dignn --version`` prints."""
    from importlib import metadata
    from . import __version__

    def installed(distribution: str) -> str:
        try:
            return f"{distribution} {metadata.version(distribution)}"
        except metadata.PackageNotFoundError:
            return f"{distribution} not installed"
    return (f"dignn {__version__} ({installed('torch')}, {installed('torch-geometric')}, "
            f"Python {sys.version.split()[0]})")


def _looks_like_path(text: str) -> bool:
    """Whether ``--dataset TEXT`` means a file: the dataset names have no folder, no suffix
    and no leading ``~`` or ``.``."""
    seps = [s for s in (os.sep, os.altsep) if s]
    return any(s in text for s in seps) or text.startswith(("~", ".")) or \
        Path(text).suffix != ""


def _dataset_arg(text: str) -> str:
    """A known dataset name (lower-cased) or the path of an existing file (kept as given);
    a name close to a known one is answered with it."""
    from .catalog import DATASETS
    if text.lower() in DATASETS:
        return text.lower()
    if text.lower().replace("_", "-") in DATASETS:  # as load_dataset, unless a file has it
        if not Path(text).expanduser().is_file():
            return text.lower().replace("_", "-")
    path = Path(text).expanduser()
    if path.is_file():
        return text
    names = ", ".join(sorted(DATASETS))
    file_help = ("the path of an existing file holding a torch_geometric Data or "
                 "InMemoryDataset saved with torch.save")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"invalid choice: {text!r} is a folder, not a "
                                         f"dataset file; give {file_help}, or a dataset "
                                         f"name: {names}")
    if _looks_like_path(text):
        raise argparse.ArgumentTypeError(f"invalid choice: no file at {text!r}; give "
                                         f"{file_help}, or a dataset name: {names}")
    raise argparse.ArgumentTypeError(
        f"invalid choice: {text!r}{_close_names(text, DATASETS)} (choose from {names}, or "
        f"give {file_help})")


def _node_dataset(text: str) -> str:
    """A node-classification dataset's name (lower-cased), the figures' data."""
    from .catalog import DATASETS
    nodes = sorted(n for n, task in DATASETS.items() if task == "node")
    name = text.strip().lower()
    name = name.replace("_", "-") if name.replace("_", "-") in DATASETS else name
    if name in nodes:
        return name
    if name in DATASETS:
        what = f"{name!r} is a {DATASETS[name]} dataset; the figures are drawn on node datasets"
    else:
        what = f"invalid choice: {name!r}{_close_names(name, nodes)}"
    raise argparse.ArgumentTypeError(f"{what} (choose from {', '.join(nodes)})")


def _node_datasets(text: str) -> List[str]:
    """Comma-separated node dataset names (at least one)."""
    names = [_node_dataset(n) for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"names no dataset ({text!r}); give comma-separated "
                                         f"names such as csbm or cora,chameleon")
    return names


def _device_arg(text: str) -> str:
    """A device spec :func:`dignn.device.resolve_device` takes (kept as typed)."""
    from .device import device_spec_error
    bad = device_spec_error(text)
    if bad is not None:
        raise argparse.ArgumentTypeError(bad)
    return text


def _option(p, *flags: str, **how) -> None:
    """``p.add_argument(*flags, **how)``; a flag whose type says its range (:class:`_Number`,
    :class:`_Numbers`) has the range appended to its help, so that ``--help`` states what
    the parse accepts."""
    kind = how.get("type")
    if hasattr(kind, "describe") and how.get("help"):
        how["help"] = f"{how['help']}; {kind.describe()}"
    p.add_argument(*flags, **how)


def _add_data_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-root", metavar="DIR", default=None,
                   help="folder with the raw datasets in PyG's layout <root>/<name>/raw "
                        "(read only; default $DIGNN_DATA, else the cache)")
    p.add_argument("--cache-dir", metavar="DIR", default=None,
                   help="where raw files are copied and PyG writes processed files "
                        "(default $DIGNN_CACHE or ~/.cache/dignn)")


def _add_run_args(p: argparse.ArgumentParser, progress_default: bool) -> None:
    """Where and how a run executes: device, threads, compilation, progress."""
    from .catalog import DEVICE_HELP, MAX_THREADS_PER_CORE
    p.add_argument("--device", default="auto", type=_device_arg, metavar="DEV",
                   help=DEVICE_HELP)
    p.add_argument("--threads", type=_threads, default=None, metavar="N",
                   help="torch CPU threads (default: 1 for small graphs, where more threads "
                        "only wait on each other, else every core this process may use); "
                        f"an integer >= 1 and at most {MAX_THREADS_PER_CORE} per core this "
                        f"process may use")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=False,
                   help="torch.compile each model's forward (default: off)")
    _option(p, "--sync-every", type=POSITIVE_INT, default=10, metavar="K",
            help="epochs between the host reads that update the progress bar and test "
                 "--patience (default: 10; nothing else leaves the device)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction,
                   default=progress_default,
                   help=f"progress bars on stderr (default: {'on' if progress_default else 'off'})")


def _overrides() -> list:
    """The options that override a preset's TrainConfig fields, as (flag, add_argument
    keywords); each defaults to None (the preset's value)."""
    from .catalog import BACKENDS, REORDERINGS, SOLVERS
    return [
        ("--mu", dict(type=POSITIVE, metavar="MU",
                      help="source-constraint strength mu of Z = X - (1/mu) Delta Z")),
        ("--hidden", dict(type=POSITIVE_INT, metavar="N",
                          help="hidden width (the paper's num hid)")),
        ("--lr", dict(type=POSITIVE, metavar="LR", help="Adam learning rate")),
        ("--weight-decay", dict(type=NON_NEGATIVE, metavar="WD", help="Adam weight decay")),
        ("--dropout", dict(type=PROBABILITY, metavar="P",
                           help="dropout rate after each layer")),
        ("--max-iter", dict(type=POSITIVE_INT, metavar="N",
                            help="most iterations (CSR sweeps) of the implicit layer's "
                                 "solves")),
        ("--tol", dict(type=NON_NEGATIVE, metavar="TOL",
                       help="relative tolerance of the implicit layer's solves: fixed_point "
                            "stops at the first sweep t with ||Z_t - Z_{t-1}||_F <= tol "
                            "||Z_t||_F, cg and anderson once ||X - Z - Delta Z / mu||_F <= "
                            "tol ||X||_F, within --max-iter sweeps (the authors' code's "
                            "threshold is another test: an absolute bound on ||Z_t - "
                            "Z_{t-1}|| that runs max_iter + 2 applications)")),
        ("--input-unit", dict(choices=["mlp", "adj", "linkx"],
                              help="input unit: mlp on X, adj on A X, or linkx "
                                   "MLP(concat(MLP(A), MLP(X)))")),
        ("--patience", dict(type=POSITIVE_INT, metavar="N",
                            help="stop a split after N epochs without a better validation "
                                 "accuracy")),
        ("--seed", dict(type=_seed_type(), metavar="S",
                        help="base seed; split k trains with seed S + k")),
        ("--solver", dict(choices=SOLVERS,
                          help="the implicit layer's solver (cg: exact for every mu > 0)")),
        ("--backend", dict(choices=BACKENDS,
                           help="the implicit layer's kernels (default auto: cpu on the CPU; "
                                "on a GPU cuda, or triton for graphs of 2M CSR entries and "
                                "more)")),
        ("--dtype", dict(choices=["float32", "float64"],
                         help="the model's parameters and features (default float32; float64 "
                              "to compare runs to rounding, e.g. distributed against one "
                              "process)")),
        ("--reorder", dict(choices=REORDERINGS,
                           help="renumber the nodes for memory locality inside the implicit "
                                "layer (rcm, degree, community or auto; transparent to the "
                                "results' order; default none)")),
        ("--storage-dtype", dict(choices=["bfloat16", "float16"],
                                 help="store the implicit layer's iterates in 16 bits, sums in "
                                      "float32 (fixed_point solver; every backend)")),
        ("--spectral-norm", dict(action=argparse.BooleanOptionalAction,
                                 help="spectrally normalize the neural Laplacian's Θχ and Θφ "
                                      "(--no-spectral-norm turns off what a preset turns on)")),
    ]


def _check_swept_numbers(settings) -> None:
    """Refuses, before any data is read, a swept value out of the range of the option that
    sets the same field (``--grid mu=-1`` as ``--mu -1``), in one line naming the setting."""
    kinds = {flag[2:].replace("-", "_"): how["type"] for flag, how in _overrides()
             if isinstance(how.get("type"), _Number)}
    kinds["epochs"] = POSITIVE_INT
    for k, setting in enumerate(settings):
        for field, value in setting.items():
            kind = kinds.get(field)
            if kind is None or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue  # None, or a value of the wrong type: the sweep's own checks say it
            try:
                kind.check(value)
            except argparse.ArgumentTypeError:
                shown = ", ".join(f"{f}={v}" for f, v in setting.items())
                raise ValueError(f"setting {k} ({shown}): {field} must be {kind.describe()} "
                                 f"(as --{field.replace('_', '-')}), got {value!r}") from None


def _add_training_args(p: argparse.ArgumentParser, json_help: str) -> None:
    """The options ``dignn train`` and ``dignn sweep`` share (the dataset, its splits, the
    preset and its overrides, the protocol, where the run executes) and ``--json``, which
    each describes in ``json_help``."""
    from .catalog import DATASETS
    from .presets import PRESETS
    from .protocols import PROTOCOLS
    p.add_argument("--dataset", default="csbm", type=_dataset_arg, metavar="NAME|FILE",
                   help=f"dataset: one of {', '.join(sorted(DATASETS))} (default: csbm, a "
                        f"generated graph that needs no files), or a file written by "
                        f"torch.save holding a torch_geometric Data (node classification; "
                        f"splits from its train/val/test masks or --split-ratio) or an "
                        f"InMemoryDataset / list of Data with one label per graph (graph "
                        f"classification); such a file trains with the generic user-data "
                        f"preset and is read without running code from it "
                        f"(torch.load(weights_only=True)); see --trust-pickle")
    p.add_argument("--trust-pickle", action="store_true",
                   help="--dataset FILE: also read a file that only full unpickling loads "
                        "(e.g. torch.save(dataset) of a dataset class); unpickling runs code "
                        "the file names: only for files you trust (Python: "
                        "load_user_file(..., allow_pickle=True))")
    _option(p, "--split-ratio", type=SPLIT_RATIO, default=None, metavar="TR,VA,TE",
            help="dataset file without masks: seeded random splits with these shares of the "
                 "labeled nodes (graphs)")
    _option(p, "--num-splits", type=NUM_SPLITS, default=None, metavar="N",
            help="dataset file: the number of --split-ratio splits or of cross-validation "
                 "folds of graphs (default 10); csbm and penn94-synthetic: the number of "
                 "generated splits")
    _add_data_args(p)
    p.add_argument("--laplacian", default="neural", choices=["neural", "rw"],
                   help="the implicit layer's Laplacian: neural (the learnable graph neural "
                        "Laplacian Delta_Phi, table 7) or rw (random walk, table 6); "
                        "default: neural")
    _option(p, "--splits", type=SPLIT_LIST, default=None, metavar="0,1,...",
            help="split (fold) indices to run (default: all)")
    _option(p, "--epochs", type=POSITIVE_INT, default=None, metavar="N",
            help="training epochs per split (default: the preset's)")
    p.add_argument("--preset", default="tuned", choices=list(PRESETS),
                   help="hyperparameters: 'paper' = appendix tables 6 (rw) and 7 (neural); "
                        "'tuned' (default) = those with the changes listed in docs/reproducing.md")
    p.add_argument("--json", metavar="PATH", default=None, help=json_help)
    p.add_argument("--protocol", choices=PROTOCOLS, default="holdout",
                   help="holdout (default, every dataset): per split the epoch of best "
                        "validation accuracy, its test accuracy reported; gin (graph datasets): "
                        "GIN's 10-fold cross-validation, train on 9 folds, report the mean "
                        "held-out accuracy at the one epoch maximizing it (the paper's table 5 "
                        "protocol; optimistic: no separate test set)")
    over = p.add_argument_group("overrides of the preset")
    for flag, how in _overrides():
        _option(over, flag, default=None, **how)
    _add_run_args(p, progress_default=True)


def _add_train_only_args(t: argparse.ArgumentParser) -> None:
    """Options of ``dignn train`` that ``dignn sweep`` does not take: checkpoints and
    training across processes."""
    ck = t.add_argument_group("checkpoints")
    ck.add_argument("--checkpoint", metavar="PATH", default=None,
                    help="save the run's state to PATH (replaced atomically): model, "
                         "optimizer, epoch, split, model selection, random generators and "
                         "the finished splits' results")
    _option(ck, "--checkpoint-every", type=POSITIVE_INT, default=None, metavar="K",
            help="with --checkpoint: save every K epochs (default 10) and after each split")
    ck.add_argument("--resume", action="store_true",
                    help="with --checkpoint: continue the run saved there (same dataset, "
                         "settings and splits); the per-epoch losses are those of the "
                         "uninterrupted run")
    lg = t.add_argument_group("configuration files and logs")
    lg.add_argument("--config", metavar="FILE.toml", default=None,
                    help="read the options from a TOML file: one key per flag, its name "
                         "without the dashes (data-root or data_root = \"../data\", epochs = "
                         "200, splits = [0, 1], progress = false); flags given here override "
                         "the file")
    lg.add_argument("--print-config", action="store_true",
                    help="print the resolved options (--config, then the flags) as TOML that "
                         "--config reads back, and exit without training")
    lg.add_argument("--log-dir", metavar="DIR", default=None,
                    help="write per-epoch logs: DIR/<dataset>/split_<k>.csv (epoch, "
                         "train_loss, train_acc, val_loss, val_acc, test_acc, lambda_max, "
                         "solver_iterations, ms_per_epoch) and a TensorBoard run "
                         "DIR/<dataset>/split_<k>/ with the same scalars (needs tensorboard: "
                         "pip install \"dignn-kernels[logs]\"); rows are written at the "
                         "--sync-every reads")
    dd = t.add_argument_group("training across processes (torchrun)")
    dd.add_argument("--distributed", action="store_true",
                    help="train the node model full-graph over the processes torchrun "
                         "starts (torchrun --nproc-per-node N -m dignn train --distributed "
                         "...): each owns a part of the nodes; gloo on the CPU, NCCL on GPUs "
                         "(one per process, by LOCAL_RANK); rank 0 prints and writes --json "
                         "and --checkpoint")
    dd.add_argument("--partition", choices=["contiguous", "metis"], default="contiguous",
                    help="how the nodes are split over the processes: contiguous blocks of "
                         "about equal work (default) or METIS (needs pymetis: pip install "
                         "pymetis)")
    dd.add_argument("--partition-file", metavar="PATH", default=None,
                    help="read the partition from PATH, or write it there when missing, so "
                         "that a big graph is partitioned once (it must have one part per "
                         "process)")
    _option(dd, "--timeout", type=TIMEOUT, default=300.0, metavar="SECONDS",
            help="the most any collective may wait (default 300): when a process dies or "
                 "hangs, the others stop with an error within it instead of waiting "
                 "forever; it also bounds the wait for rank 0 to prepare the dataset's "
                 "cache and the partition")


def _add_study_args(g, name_default: str, storage_default: str) -> None:
    """The study options ``dignn tune`` and ``dignn sweep`` share."""
    g.add_argument("--study-name", metavar="NAME", default=None,
                   help=f"the study's name in the storage (default {name_default}); the same "
                        f"name and storage resume it")
    g.add_argument("--storage", metavar="URL", default=None,
                   help=f"an Optuna storage: sqlite:///study.db, postgresql+psycopg2://user@"
                        f"host/db, or a path (a SQLite file); default: {storage_default}")
    _option(g, "--workers", type=POSITIVE_INT, default=1, metavar="K",
            help="processes on this machine sharing the study (default 1)")
    _option(g, "--heartbeat", type=POSITIVE_INT, default=10, metavar="SECONDS",
            help="seconds between a running trial's heartbeats in the storage; a trial "
                 "silent for twice that (a killed worker's) is marked failed (default 10)")


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``dignn``: every value is checked here, before any data is read
    (numbers against their ranges, names against the choices, with the close ones named)."""
    # Only torch-free modules here: `dignn --help` must not wait for torch to import.
    parser = _Parser(prog="dignn", description=__doc__.split("\n\n")[1].replace("``", ""),
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action=_Version)
    # (a missing command is refused by _Parser.parse_args, which names the commands)
    sub = parser.add_subparsers(dest="command", required=False)

    t = sub.add_parser("train", help="train DIGNN and report test accuracy per split")
    _add_training_args(t, json_help='write {"dataset", "laplacian", "test_acc": [per split], '
                                    '"mean", "std"} (accuracies as fractions), the device, '
                                    'torch version, backend, ms per epoch and the config')
    _add_train_only_args(t)

    w = sub.add_parser("sweep",
                       help="choose hyperparameters on validation accuracy; report the chosen "
                            "setting's test accuracy only",
                       description="Trains every setting on every split, chooses the setting "
                                   "of the best mean validation accuracy (gin protocol: the "
                                   "best cross-validation accuracy; ties: the first listed) "
                                   "and prints the test accuracy of that setting only. The "
                                   "options of dignn train fix what is not swept.")
    _add_training_args(w, json_help="write every setting's overrides, per-split validation "
                                    "accuracies, their mean and std, best epochs and seconds, "
                                    "the chosen setting and its test accuracies, the command, "
                                    "device, wall time and peak memory")
    grid = w.add_mutually_exclusive_group(required=True)
    grid.add_argument("--grid", nargs="+", metavar="KEY=V1,V2",
                      help="values of TrainConfig fields; every combination is a setting "
                           "(e.g. --grid mu=1.25,2.2 dropout=0.1,0.5; none for an optional "
                           "field, true/false for a switch)")
    grid.add_argument("--settings", metavar="FILE.json",
                      help='a JSON list of settings, e.g. [{"mu": 1.25}, {"mu": 2.2, '
                           '"dropout": 0.1}]')
    _option(w, "--max-settings", type=POSITIVE_INT, default=64, metavar="N",
            help="refuse more than N settings (default: 64)")
    st = w.add_argument_group("the study (Optuna's grid sampler)")
    _add_study_args(st, "dignn-sweep-<dataset>", "in memory; with --workers a temporary "
                                                 "SQLite file")

    u = sub.add_parser("tune",
                       help="search hyperparameters with Optuna (TPE, pruning) on validation "
                            "accuracy; test accuracy is recorded, never used to choose",
                       description="Runs an Optuna study: each trial trains the settings "
                                   "suggested by the TPE sampler on the splits, its objective "
                                   "the mean validation accuracy; unpromising trials are "
                                   "pruned on their per-epoch validation accuracy. The "
                                   "options of dignn train fix what is not tuned. Needs "
                                   "pip install \"dignn-kernels[tune]\".")
    _add_training_args(u, json_help="write the study: every trial's state, settings, "
                                    "validation and test accuracies per split, and the best "
                                    "trial (chosen on validation accuracy) with its config")
    tu = u.add_argument_group("the study")
    _option(tu, "--trials", type=POSITIVE_INT, required=True, metavar="N",
            help="the finished (complete or pruned) trials the study should hold; a resumed "
                 "study runs only the missing ones")
    _option(tu, "--timeout", type=TIMEOUT, default=None, metavar="SECONDS",
            help="start no trial after this many seconds (per worker)")
    _add_study_args(tu, "dignn-<dataset>-<laplacian>",
                    "a SQLite file beside --json (its name with .db), else "
                    "dignn_tune_<dataset>.db here")
    tu.add_argument("--space", metavar="FILE.toml", default=None,
                    help="the search space: one table per setting, [mu] low = 1.0 high = 10.0 "
                         "log = true, or [hidden] choices = [16, 32] (default: the paper's "
                         "ranges of mu, lr, dropout, weight-decay, hidden and, for node "
                         "datasets, input-unit)")
    tu.add_argument("--try-preset", action=argparse.BooleanOptionalAction, default=True,
                    help="a new study's first trial trains the preset's own values of the "
                         "space (with the options given), so the study measures them beside "
                         "what it finds (default; --no-try-preset: the sampler's from the "
                         "first trial)")
    tu.add_argument("--export", metavar="FILE.toml", default=None,
                    help="write the best trial's settings as a config file that dignn train "
                         "--config reads")
    _option(tu, "--sampler-seed", type=_seed_type(), default=0, metavar="S",
            help="the TPE sampler's seed (worker k: S + k; default 0)")
    tu.add_argument("--pruner", choices=["median", "none"], default="median",
                    help="stop a trial whose validation accuracy at an epoch is below the "
                         "median of earlier trials' there (default), or never")
    _option(tu, "--pruner-startup", type=POSITIVE_INT, default=5, metavar="N",
            help="trials finished before any is pruned (default 5)")
    _option(tu, "--pruner-warmup", type=INDEX, default=10, metavar="EPOCHS",
            help="epochs of a trial before it may be pruned (default 10)")

    p = sub.add_parser("plot", help="draw the paper's convergence figure or mu study, or the "
                                    "training curves of a --log-dir (PNG)")
    psub = p.add_subparsers(dest="figure", required=False)
    c = psub.add_parser("convergence", help="||Z_t - Z_{t-1}||_F against t")
    c.add_argument("--datasets", default=["csbm"], type=_node_datasets, metavar="A,B",
                   help="comma-separated node datasets (default: csbm; the paper: "
                        "cora,chameleon)")
    _option(c, "--mu", type=POSITIVE, default=2.0, metavar="MU", help="mu (the paper uses 2)")
    _option(c, "--max-iter", type=POSITIVE_INT, default=30, metavar="N",
            help="iterations to plot")
    c.add_argument("--out", default="dignn_convergence.png", metavar="PNG",
                   help="the figure's path (default: dignn_convergence.png)")
    m = psub.add_parser("mu", help="residual, generalization gap and accuracy against mu")
    m.add_argument("--dataset", default="csbm", type=_node_dataset, metavar="NAME",
                   help="node dataset (default: csbm; the paper: cora)")
    _option(m, "--mus", type=MU_LIST, default=[1.0, 1.25, 1.5, 2.0, 2.5, 5.0],
            metavar="1,1.25,...", help="the values of mu to train with")
    _option(m, "--max-iter", type=POSITIVE_INT, default=10, metavar="N",
            help="T (the paper: 10)")
    m.add_argument("--out", default="dignn_mu.png", metavar="PNG",
                   help="the figure's path (default: dignn_mu.png)")
    cv = psub.add_parser("curves", help="loss and accuracy per epoch of the logs dignn train "
                                        "--log-dir wrote, one line per split")
    cv.add_argument("log_dir", metavar="DIR",
                    help="the --log-dir of dignn train runs (its <dataset>/split_<k>.csv)")
    cv.add_argument("--out", default=None, metavar="PNG",
                    help="the figure's path (default: DIR/curves.png)")
    for q in (c, m):
        _add_data_args(q)
        _option(q, "--epochs", type=POSITIVE_INT, default=None, metavar="N",
                help="training epochs per model (default: the preset's)")
        q.add_argument("--json", metavar="PATH", default=None, help="also write the numbers")
        _add_run_args(q, progress_default=False)
    _mark_leaves(parser)
    return parser


def _mark_leaves(parser: _Parser) -> None:
    """Marks the subcommands' own parsers (an unknown flag is refused there, with their
    usage) and tells each which commands take each flag."""
    leaves, stack = [], [parser]
    while stack:
        p = stack.pop()
        subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            leaves.append(p)
        for action in subs:
            stack.extend(action.choices.values())
    homes: dict = {}
    for leaf in leaves:
        leaf._leaf = True
        for flag in leaf._option_string_actions:
            homes.setdefault(flag, []).append(leaf.prog)
    for p in leaves + [parser]:
        p._homes = homes


def _override_values(args) -> dict:
    """The TrainConfig overrides parsed from the command line (None: not given)."""
    import dataclasses
    from .presets import TrainConfig
    return {f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)
            if f.name != "laplacian" and hasattr(args, f.name)}


def _write_line(text: str, file=None) -> None:
    """Writes ``text`` and a newline to ``file`` (default: stderr) through the progress bars'
    writer, ``tqdm.write``: it clears the open bars, writes the text on lines of its own and
    draws the bars again below it, so that a warning during training never lands inside a
    bar's line. With no bar open (``--no-progress``) it is a plain line."""
    file = sys.stderr if file is None else file
    try:
        from tqdm.auto import tqdm  # the class of dignn.training's bars
    except ImportError:  # pragma: no cover - tqdm is a dependency
        builtins.print(text, file=file, flush=True)
        return
    tqdm.write(text, file=file)
    file.flush()


def _show_warnings() -> None:
    """Every warning on a line of its own above the progress bars (:func:`_write_line`); mu
    warnings as one readable line each; PyG's import-time deprecation notices are not the
    user's concern."""
    from .spectral import MuBelowSpectrumWarning
    warnings.filterwarnings("ignore", message=r".*torch\.jit\.script.*is deprecated",
                            category=FutureWarning)
    warnings.filterwarnings("ignore", message=r"Sparse (CSR tensor support|invariant checks)")
    warnings.simplefilter("always", MuBelowSpectrumWarning)
    default_show = warnings.showwarning
    shown = []

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, MuBelowSpectrumWarning):
            text = str(message)
            # the explanation once; later warnings only say where and how large lambda_max is
            _write_line(f"warning: {text if not shown else text.split(': ')[0]}", file)
            shown.append(text)
            return
        # the usual text of the warning, as the showwarning found here writes it (a caller
        # that records warnings instead, as pytest does, writes nothing)
        text = io.StringIO()
        default_show(message, category, filename, lineno, text, line)
        if text.getvalue():
            _write_line(text.getvalue().rstrip("\n"), file)
    warnings.showwarning = show


def _run_setup(args, prog: str):
    """The device of ``--device`` (or None after printing the one-line error)."""
    from .device import DeviceUnavailableError, resolve_device, source_commit
    source_commit()  # the commit of the code this run starts with (its record names it)
    try:
        return resolve_device(args.device)
    except DeviceUnavailableError as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return None


def _sweep_work(dataset, hidden: int) -> int:
    """(nodes + edges) x channels of one CSR sweep: of the graph for node tasks, of a batch
    of graphs for graph classification."""
    if dataset.task == "node":
        return (dataset.num_nodes + dataset.edge_index.size(1)) * hidden
    graphs = dataset.graphs
    per_graph = sum(g.num_nodes + g.num_edges for g in graphs) / max(len(graphs), 1)
    return int(per_graph * 128 * hidden)


def peak_memory(device, training: Optional[dict] = None) -> dict:
    """The process's peak resident memory (GB) and, on a GPU, torch's peak allocation there.
    ``training``: what :func:`_start_training_memory` returned: then also the resident
    memory when training began and its peak during training (``training_*``)."""
    import resource
    import torch
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    out = {"peak_rss_gb": round(max(peak, (training or {}).get("peak_before_gb", 0.0)), 3)}
    if training is not None:
        out.update(training_start_rss_gb=training["start_gb"],
                   training_peak_rss_gb=_proc_status_gb("VmHWM"))
    if getattr(device, "type", None) == "cuda":
        out["peak_cuda_allocated_gb"] = round(torch.cuda.max_memory_allocated(device) / 2**30,
                                              3)
    return out


def _proc_status_gb(key: str) -> Optional[float]:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return round(int(line.split()[1]) / 2**20, 3)
    except OSError:
        pass
    return None


def _start_training_memory() -> Optional[dict]:
    """Restarts the count of the peak resident memory (Linux: /proc/self/clear_refs), so that
    the peak of training shows apart from that of loading the data; None where it cannot."""
    import resource
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return None
    start = _proc_status_gb("VmRSS")
    return None if start is None else {"peak_before_gb": before, "start_gb": start}


def _write_record(args, record: dict, preset: str, seconds: float, device) -> None:
    """Writes a run's JSON to ``--json`` with what reproduces and sizes it: the preset, the
    exact command, the wall time and the peak memory."""
    from .device import describe_source
    record.update(preset=preset, wall_seconds=round(seconds, 2),
                  command="dignn " + shlex.join(args.argv),
                  **peak_memory(device, getattr(args, "training_memory", None)),
                  **describe_source())
    from .files import write_atomically
    text = (json.dumps(record, indent=2) + "\n").encode()
    write_atomically(Path(args.json).expanduser(), lambda f: f.write(text))


def _set_threads(args, work: int) -> str:
    """Sets torch's CPU threads and says how many and why."""
    import torch
    from .device import choose_threads
    threads, why = choose_threads(work, args.threads)
    torch.set_num_threads(threads)
    return f"{threads} CPU thread{'s' if threads > 1 else ''} ({why})"


def _backend_error(config, device) -> Optional[str]:
    """Why ``config.backend`` cannot run on ``device`` (None when it can)."""
    from dignn_kernels import available_backends
    if config.backend != "auto" and config.backend not in available_backends(device):
        return (f"--backend {config.backend} cannot run on {device}; there: "
                f"{', '.join(available_backends(device))} (or auto)")
    return None


def _preset_of(args):
    """(the preset_config key, the preset's label) of ``--dataset``: a named dataset's own
    row, or the generic row for a user's file."""
    from .catalog import DATASETS
    from .presets import USER_DATA
    if args.dataset in DATASETS:
        return args.dataset, args.preset
    return USER_DATA, "user-data (generic)"


def _user_data_solver(key, config, overrides, dataset):
    """``config`` with the presets' solver rule applied to a user's graph now that it is read
    (:func:`dignn.presets.preset_solver`: the preset was built before the file was, as if
    undirected), unless ``--solver`` or ``--storage-dtype`` chose otherwise."""
    from .presets import USER_DATA, preset_solver
    from .training import _is_directed
    if key != USER_DATA or overrides.get("solver") is not None or \
            overrides.get("storage_dtype") is not None:
        return config
    return config.replace(solver=preset_solver(_is_directed(dataset)))


def _load(args):
    """The dataset of ``--dataset`` (a name or a user's file) and its splits
    (``--split-ratio``, ``--num-splits``)."""
    from .catalog import DATASETS
    from .data import load_dataset, load_user_file
    if args.dataset not in DATASETS:
        return load_user_file(args.dataset, split_ratio=args.split_ratio,
                              num_splits=args.num_splits or 10,
                              allow_pickle=args.trust_pickle)
    bad = _dataset_option_error(args)
    if bad is not None:
        raise ValueError(bad)
    extra = {"num_splits": args.num_splits} if args.num_splits else {}
    return load_dataset(args.dataset, args.data_root, args.cache_dir, **extra)


# --------------------------------------------- what is refused before torch is imported --
# main() asks _early_error first: every input error that needs no data is said within the
# time Python and argparse take (no torch, no dignn_kernels, no PyG), in the one line the
# later checks would print.

def _dataset_option_error(args) -> Optional[str]:
    """Why the dataset options of ``train``/``sweep`` do not go together (None: they do)."""
    from .catalog import DATASETS, GENERATED
    if args.dataset not in DATASETS:
        return None
    if args.trust_pickle:
        return (f"--trust-pickle applies to a dataset file (--dataset FILE); {args.dataset} is "
                f"read by its own loader")
    generated = args.dataset in GENERATED
    if args.split_ratio is not None or (args.num_splits and not generated):
        return (f"--split-ratio{'' if generated else ' and --num-splits'} apply to a dataset "
                f"file; {args.dataset} comes with its own splits (select some with --splits)")
    return None


def _split_count(args) -> Optional[tuple]:
    """(the number of splits or folds the run will have, how that is known), without reading
    the data; None where only the data tells (a dataset file's own masks)."""
    from .catalog import DATASETS, DEFAULT_NUM_SPLITS, GENERATED, NUM_SPLITS
    if args.protocol == "gin":
        from .protocols import GIN_NUM_FOLDS
        return GIN_NUM_FOLDS, f"--protocol gin makes {GIN_NUM_FOLDS} folds"
    if args.dataset in DATASETS:
        if args.dataset in GENERATED and args.num_splits:
            return args.num_splits, f"{args.dataset} is made with --num-splits " \
                                    f"{args.num_splits} splits"
        count = NUM_SPLITS[args.dataset]
        return count, f"{args.dataset} has {count} split{'s' if count > 1 else ''}"
    if args.split_ratio is not None:
        count = args.num_splits or DEFAULT_NUM_SPLITS
        return count, f"--split-ratio makes {count} splits (--num-splits)"
    return None


def _splits_error(args) -> Optional[str]:
    """Why ``--splits`` names a split the run does not have (None: it names none such)."""
    known = None if args.splits is None else _split_count(args)
    if known is None:
        return None
    count, why = known
    bad = sorted({k for k in args.splits if k >= count})
    if not bad:
        return None
    return (f"argument --splits: {', '.join(map(str, bad))} out of range: {why}, "
            f"{'0' if count == 1 else f'0..{count - 1}'}")


def _protocol_error(args) -> Optional[str]:
    """Why ``--protocol gin`` cannot run here (a node dataset, or --patience), as
    :func:`dignn.protocols.apply_protocol` and ``check_protocol_config`` say it."""
    from .catalog import DATASETS
    if args.protocol != "gin":
        return None
    task = DATASETS.get(args.dataset)
    if task is not None and task != "graph":
        return (f"the gin protocol (10-fold cross-validation) is for graph classification "
                f"datasets; {args.dataset} is a {task} classification dataset: use "
                f"--protocol holdout")
    if args.patience is not None:
        from .protocols import check_protocol_config
        try:
            check_protocol_config(args.protocol, argparse.Namespace(patience=args.patience))
        except ValueError as err:
            return str(err)
    return None


def _checkpoint_option_error(args) -> Optional[str]:
    """Why ``--checkpoint``, ``--checkpoint-every`` and ``--resume`` do not go together."""
    if args.checkpoint is None:
        if args.resume or args.checkpoint_every is not None:
            return "--resume and --checkpoint-every need --checkpoint PATH (the checkpoint file)"
        return None
    if args.resume and not _is_file(args.checkpoint):
        return (f"--resume: no checkpoint file at --checkpoint {args.checkpoint!r}; start "
                f"without --resume to write one there")
    return None


def _is_file(path) -> bool:
    """Whether there is a file at ``path``; True where the file system cannot tell (a name
    it does not take: the write's own checks say that)."""
    try:
        return Path(path).expanduser().is_file()
    except (OSError, ValueError):
        return True


def _data_root_error(args, names: Sequence[str]) -> Optional[str]:
    """Why the data root (``--data-root``, else ``$DIGNN_DATA``) cannot be read, for runs on
    datasets read from files (``names``); as :mod:`dignn.data.storage` says it."""
    from .catalog import DATASETS, GENERATED
    if not any(n in DATASETS and n not in GENERATED for n in names):
        return None
    if args.data_root is not None:
        root, given_as = Path(args.data_root).expanduser(), "data_root (--data-root)"
    elif os.environ.get("DIGNN_DATA"):
        root, given_as = Path(os.environ["DIGNN_DATA"]).expanduser(), \
            "the data root $DIGNN_DATA"
    else:
        return None
    if args.cache_dir is not None:
        cache = Path(args.cache_dir).expanduser()
    elif os.environ.get("DIGNN_CACHE"):
        cache = Path(os.environ["DIGNN_CACHE"]).expanduser()
    else:
        cache = Path.home() / ".cache" / "dignn"
    try:
        exists, folder = root.exists(), root.is_dir()
    except (OSError, ValueError):  # a name the file system does not take: the loader says it
        return None
    if not exists:
        return (f"{given_as} {str(root)!r} was given but does not exist; pass an existing "
                f"folder laid out as <root>/<name>/raw/..., or give no data root at all to use "
                f"only the cache {str(cache)!r} (which PyG fills by downloading)")
    if not folder:
        return (f"{given_as} {str(root)!r} is a file, not a folder; pass the folder laid out "
                f"as <root>/<name>/raw/... (a dataset file goes to --dataset FILE)")
    if not os.access(root, os.R_OK | os.X_OK):
        return (f"{given_as} {str(root)!r} cannot be read (no permission to list it); make "
                f"it readable, or pass a readable folder laid out as <root>/<name>/raw/...")
    return None


def _log_dir_error(path) -> Optional[str]:
    """Why ``--log-dir`` cannot hold the logs (None: it can, or only writing will tell)."""
    text = os.fspath(path)
    if not text.strip():
        return "--log-dir is empty; give a folder such as logs"
    try:
        folder = Path(text).expanduser()
        if folder.exists() and not folder.is_dir():
            return (f"--log-dir {text!r} is a file, not a folder; give a folder (it gets "
                    f"<dataset>/split_<k>.csv and TensorBoard runs)")
    except (OSError, ValueError):
        return None
    return None


def _config_arguments(parser, argv: Sequence[str], config):
    """The arguments of ``argv`` with the options of the file ``config`` (``--config``) under
    the flags given in ``argv``, which override them; a :class:`dignn.config.ConfigError`
    for a file that cannot be used."""
    from .config import load_config
    train = _subcommand(parser, "train")
    values = load_config(config, train)
    saved = {a.dest: a.default for a in train._actions if a.dest in values}
    train.set_defaults(**values)
    try:
        merged = parser.parse_args(argv)
    finally:
        train.set_defaults(**saved)
    merged.config_values = values
    return merged


def _subcommand(parser, name: str):
    """The parser of the subcommand ``name`` of ``parser``."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return subs[0].choices[name]


def _print_config(parser, args) -> int:
    from .config import to_toml
    header = ("dignn train options (dignn train --config FILE reads them; flags given with "
              "it override them)")
    sys.stdout.write(to_toml(args, _subcommand(parser, "train"), header))
    sys.stdout.flush()
    return 0


def _curves_dir_error(path) -> Optional[str]:
    """Why ``dignn plot curves DIR`` has no logs to draw in DIR (None: it may have)."""
    try:
        folder = Path(path).expanduser()
        if folder.is_dir():
            return None
        what = "is a file, not a folder" if folder.exists() else "does not exist"
    except (OSError, ValueError):
        return None
    return (f"no per-epoch logs: {path!r} {what}; give the --log-dir of a dignn train run "
            f"(it holds <dataset>/split_<k>.csv)")


def _tunable_keys() -> List[str]:
    """The TrainConfig fields ``dignn tune --space`` may search: those a flag of ``dignn
    train`` sets (so that ``--export`` can write them)."""
    return sorted([flag[2:].replace("-", "_") for flag, _ in _overrides()] + ["epochs"])


def _study_error(args) -> Optional[str]:
    """Why ``dignn tune``/``sweep`` cannot start a study: Optuna missing, a --space file
    that cannot be used."""
    from . import tune
    if tune.optuna_missing():
        return tune.OPTUNA_HINT
    if args.command == "tune" and tune.protocol_error(args.protocol) is not None:
        return tune.protocol_error(args.protocol)
    if getattr(args, "space", None) is not None:
        try:
            args.space_params = tune.load_space(args.space, _tunable_keys())
        except ValueError as err:
            return str(err)
    return None


def _early_error(args) -> Optional[str]:
    """The first input error of ``args`` that needs no data and no torch (None: none):
    options that do not go together, --splits past the dataset's splits, a data root that
    cannot be read, a GPU asked for where none can be visible."""
    from .device import early_device_error
    checks = []
    if args.command in ("tune", "sweep"):
        checks += [lambda: _study_error(args)]
    if args.command in ("train", "sweep", "tune"):
        checks += [lambda: _dataset_option_error(args), lambda: _protocol_error(args),
                   lambda: _splits_error(args), lambda: _data_root_error(args, [args.dataset])]
    if args.command == "train":
        checks += [lambda: _checkpoint_option_error(args)]
        if not args.distributed and args.partition_file is not None:
            checks += [lambda: "--partition-file applies to --distributed runs"]
        if args.distributed and args.log_dir is not None:
            checks += [lambda: "--log-dir applies to runs in one process, not to "
                               "--distributed runs"]
        if args.log_dir is not None:
            checks += [lambda: _log_dir_error(args.log_dir)]
    if args.command == "plot" and args.figure != "curves":
        names = args.datasets if args.figure == "convergence" else [args.dataset]
        checks += [lambda: _data_root_error(args, names)]
    if args.command == "plot" and args.figure == "curves":
        checks += [lambda: _curves_dir_error(args.log_dir)]
    else:
        checks += [lambda: early_device_error(args.device)]
    for check in checks:
        bad = check()
        if bad is not None:
            return bad
    return None


def _checkpointing(args, write: bool = True):
    """The :class:`~dignn.training.Checkpointing` of ``--checkpoint``, ``--checkpoint-every``
    and ``--resume`` (None without ``--checkpoint``)."""
    from .files import check_writable
    from .training import Checkpointing
    if args.checkpoint is None:
        bad = _checkpoint_option_error(args)
        if bad is not None:
            raise ValueError(bad)
        return None
    if write:
        check_writable(args.checkpoint, "--checkpoint", "run.ckpt")
    bad = _checkpoint_option_error(args)
    if bad is not None:
        raise ValueError(bad)
    return Checkpointing(args.checkpoint, args.checkpoint_every or 10, args.resume, write)


def _check_outputs(args, write: bool = True) -> None:
    """Refuses, before any data is read, the output paths (--json, plot's --out) that could
    not be written, so that a long run does not fail at its end."""
    from .files import check_writable
    if not write:
        return
    if getattr(args, "json", None) is not None:
        check_writable(args.json, "--json", "run.json")
    if getattr(args, "out", None) is not None:
        check_writable(args.out, "--out", "figure.png")
    partition_file = getattr(args, "partition_file", None)
    if partition_file is not None and not Path(partition_file).expanduser().is_file():
        check_writable(partition_file, "--partition-file", "graph.part")


def _train(args) -> int:
    if not args.distributed:
        if args.partition_file is not None:
            print("dignn train: error: --partition-file applies to --distributed runs",
                  file=sys.stderr)
            return 2
        return _train_run(args)
    import torch.distributed as dist
    from .distributed import init_distributed
    try:
        rank, world, device = init_distributed(args.device, args.timeout)
    except (ValueError, RuntimeError) as err:
        print(f"dignn train: error: {err}", file=sys.stderr)
        return 2
    try:
        code = _train_run(args, (rank, world, device))
    except KeyboardInterrupt:  # torchrun passes Ctrl-C to every rank: rank 0 says it
        if rank == 0:
            _say_interrupted(args)
        sys.stdout.flush()
        os._exit(INTERRUPTED)  # the group's teardown could wait on peers already gone
    except RuntimeError as err:  # a collective failed: a peer died or timed out
        sys.stdout.flush()
        print(f"dignn train: error: rank {rank} of {world}: {err}", file=sys.stderr,
              flush=True)
        os._exit(1)  # the process group's teardown could wait on the dead peer
    except BaseException:  # a bad input: main says it, after the group is taken down
        dist.destroy_process_group()
        raise
    dist.destroy_process_group()
    return code


def _epoch_logs(args):
    """The :class:`dignn.logs.EpochLogs` of ``--log-dir`` (None without it), its folder made
    now (a folder that cannot be made is refused before any data is read); without the
    tensorboard package it says in one line that only the CSV files are written."""
    from .logs import TENSORBOARD_HINT, EpochLogs, tensorboard_available
    if args.log_dir is None:
        return None
    bad = _log_dir_error(args.log_dir)
    if bad is not None:
        raise ValueError(bad)
    folder = Path(args.log_dir).expanduser()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ValueError(f"--log-dir {args.log_dir!r} cannot be made: "
                         f"{err.strerror or err}") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"--log-dir {args.log_dir!r} takes no files (no permission to "
                         f"write there); give a folder you can write to")
    tensorboard = tensorboard_available()
    if not tensorboard:
        builtins.print(f"note: --log-dir writes the CSV logs only; {TENSORBOARD_HINT}",
                       file=sys.stderr, flush=True)
    return EpochLogs(folder, tensorboard=tensorboard)


def _train_run(args, distributed=None) -> int:
    """``dignn train`` in one process, or (``distributed``: (rank, world size, device)) on
    one rank of a distributed run, where rank 0 alone prints and writes. A bad input raises
    (:func:`main` says it in one line)."""
    from .device import describe_device
    from .presets import check_training_numbers, preset_config
    from .protocols import GIN_DESCRIPTION, apply_protocol, check_protocol_config, gin_score
    from .training import still_falling_note, train
    rank = 0 if distributed is None else distributed[0]
    quiet = rank != 0

    def print(*what, **how):  # noqa: A001 - rank 0 speaks for every rank
        if not quiet or how.get("file") is sys.stderr:
            builtins.print(*what, **how)

    if distributed is None:
        device = _run_setup(args, "dignn train")
        if device is None:
            return 2
    else:
        device = distributed[2]
    _check_outputs(args, write=not quiet)
    checkpoint = _checkpointing(args, write=not quiet)
    epoch_log = _epoch_logs(args) if not quiet else None
    key, preset_name = _preset_of(args)
    config = preset_config(key, args.laplacian, args.preset, **_override_values(args))
    check_training_numbers(config)
    check_protocol_config(args.protocol, config)
    start = time.perf_counter()
    dataset = apply_protocol(_load_in_turn(args, distributed), args.protocol)
    config = _user_data_solver(key, config, _override_values(args), dataset)
    fit = None
    if distributed is not None:
        fit = _distributed_fit(args, dataset, config, distributed)
    if _backend_error(config, device):
        print(f"dignn train: error: {_backend_error(config, device)}", file=sys.stderr)
        return 2
    world = 1 if distributed is None else distributed[1]
    threads = _set_threads(args, _sweep_work(dataset, config.hidden) // world)
    env = describe_device(device)
    print(f"{dataset.description}", flush=True)
    if distributed is not None:
        stats = fit.graph.partition.stats(config.hidden)
        print(f"distributed over {world} processes ({fit.graph.partition.method} partition): "
              f"owned nodes {stats['owned_nodes']}, halo nodes {stats['halo_nodes']}, "
              f"{stats['bytes_per_sweep'] / 2**20:.2f} MiB exchanged per sweep", flush=True)
    print(f"device {env['device']} ({env['device_name']}), torch {env['torch']}, {threads}",
          flush=True)
    shown = {k: v for k, v in config.as_dict().items()
             if k not in ("backend",) and not (dataset.task == "node" and
                                                k in ("batch_size", "pooling"))}
    print(f"preset {preset_name}: " + ", ".join(f"{k}={v}" for k, v in shown.items()),
          flush=True)

    def report(r):
        score = "micro-F1" if r.metric == "micro_f1" else "acc"
        print(f"split {r.split}: test {score} {100 * r.test_acc:.2f}% (val "
              f"{100 * r.val_acc:.2f}%"
              f", best epoch {r.best_epoch}/{r.epochs_run}, {r.seconds:.1f} s, "
              f"{r.ms_per_epoch:.2f} ms/epoch, lambda_max {r.lambda_max_start:.3g} -> "
              f"{r.lambda_max_end:.3g}, mu {config.mu:g})", flush=True)
    args.training_memory = _start_training_memory()
    run = train(dataset, config, args.splits, progress=args.progress and not quiet,
                on_split=report, device=device, compile_model=args.compile,
                sync_every=args.sync_every, checkpoint=checkpoint, fit=fit,
                epoch_log=epoch_log)
    total = time.perf_counter() - start
    if args.protocol == "gin":
        cv = gin_score(run.splits)
        accs = ", ".join(f"{100 * a:.2f}" for a in cv.per_fold)
        print(f"{dataset.name} ({config.laplacian}): {GIN_DESCRIPTION}: accuracy "
              f"{100 * cv.mean:.2f} +- {100 * cv.std:.2f} % at epoch {cv.epoch} over "
              f"{len(run.splits)} fold(s) [{accs}] in {total:.1f} s")
    else:
        accs = ", ".join(f"{100 * a:.2f}" for a in run.test_acc)
        score = "micro-F1" if run.metric == "micro_f1" else "accuracy"
        print(f"{dataset.name} ({config.laplacian}): test {score} {100 * run.mean:.2f} +- "
              f"{100 * run.std:.2f} % over {len(run.splits)} split(s) [{accs}] in "
              f"{total:.1f} s")
    backends = ",".join(sorted({s.backend for s in run.splits if s.backend}))
    print(f"  {run.ms_per_epoch:.2f} ms per epoch (train step + evaluation) on "
          f"{env['device_name']}, backend {backends}, torch {env['torch']}"
          f"{', compiled' if args.compile else ''}")
    if dataset.task == "graph":
        peak = [s.test_acc_max for s in run.splits]
        print(f"  for comparison only (test-set selection, not an estimate): the best test "
              f"accuracy of any epoch, averaged over folds as the paper's authors' code "
              f"reports it: {100 * sum(peak) / len(peak):.2f} %")
    if distributed is not None:
        memory = _gather_objects(peak_memory(device, args.training_memory))
    if args.json and not quiet:
        record = run.to_json()
        record["protocol"] = args.protocol
        if args.protocol == "gin":  # per-fold selection on the held-out folds is not kept
            for name in ("val_acc", "best_epoch"):
                record.pop(name)
            record.update(cv.to_json())
        if distributed is not None:
            record["distributed"] = {"world_size": world, "partition": stats,
                                     "peak_memory_per_rank": memory}
        _write_record(args, record, preset_name, total, device)
    note = still_falling_note(run)
    if note is not None and not quiet:  # last, after the numbers it qualifies (on stderr)
        sys.stdout.flush()
        builtins.print(note, file=sys.stderr, flush=True)
    return 0


def _gather_objects(value) -> list:
    """``value`` of every rank, in rank order (on every rank)."""
    import torch.distributed as dist
    values = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


def _load_in_turn(args, distributed):
    """:func:`_load`; across processes rank 0 first (it may prepare the cache, which the others
    then read), the others after it."""
    if distributed is None:
        return _load(args)
    import torch.distributed as dist
    if distributed[0] == 0:
        try:
            dataset = _load(args)
        finally:
            dist.barrier()
        return dataset
    dist.barrier()
    return _load(args)


def _distributed_fit(args, dataset, config, distributed):
    """The :class:`dignn.distributed.DistributedRun` of this rank (partitioning the graph, or
    reading ``--partition-file``)."""
    from .distributed import DistributedRun, check_node_task, load_partition
    check_node_task(dataset)
    part = load_partition(dataset, distributed[1], args.partition, args.partition_file)
    return DistributedRun(dataset, config, part, distributed[2])


def _settings_table(result) -> List[str]:
    """The sweep's settings, one row each: the swept values and the validation score."""
    keys = list(dict.fromkeys(k for s in result.settings for k in s.overrides))
    gin = result.protocol == "gin"
    score = "CV acc % (mean +- std, epoch)" if gin else \
        f"val acc % (mean +- std over {len(result.best.splits)} splits)"
    rows = [["#"] + keys + [score, "seconds"]]
    for s in result.settings:
        value = f"{100 * s.val_mean:.2f} +- {100 * s.val_std:.2f}" + \
            (f", epoch {s.gin.epoch}" if gin else "")
        rows.append([str(s.index)] + [str(s.overrides.get(k, "-")) for k in keys] +
                    [value, f"{s.seconds:.1f}"])
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
    marked = [f"  {line}" for line in lines]
    marked[1 + result.chosen] = "*" + marked[1 + result.chosen][1:]
    return marked


def _sweep(args) -> int:
    from .device import describe_device
    from .presets import preset_config
    from .protocols import GIN_DESCRIPTION
    from . import sweep
    device = _run_setup(args, "dignn sweep")
    if device is None:
        return 2
    fixed = _override_values(args)
    _check_outputs(args)
    if args.grid:
        settings = sweep.expand_grid(sweep.parse_grid(args.grid), args.max_settings)
    else:
        settings = sweep.load_settings(args.settings)
    sweep.check_settings(settings, args.max_settings,
                         fixed=[k for k, v in fixed.items() if v is not None])
    _check_swept_numbers(settings)
    key, preset_name = _preset_of(args)
    base = preset_config(key, args.laplacian, args.preset, **fixed)
    start = time.perf_counter()
    dataset = _load(args)
    base = _user_data_solver(key, base, fixed, dataset)
    configs = [base.replace(**s) for s in settings]
    for k, config in enumerate(configs):
        if _backend_error(config, device):
            print(f"dignn sweep: error: setting {k}: {_backend_error(config, device)}",
                  file=sys.stderr)
            return 2
    threads = _set_threads(args, max(_sweep_work(dataset, c.hidden) for c in configs))
    env = describe_device(device)
    print(f"{dataset.description}", flush=True)
    print(f"device {env['device']} ({env['device_name']}), torch {env['torch']}, {threads}",
          flush=True)
    print(f"preset {preset_name}, laplacian {args.laplacian}; {len(settings)} setting(s) x "
          f"{len(args.splits) if args.splits else len(dataset.splits)} split(s); protocol "
          f"{args.protocol}; choice: {sweep.SELECTION_RULE[args.protocol]}", flush=True)

    def report(s, total):
        print(sweep.setting_line(s, total), flush=True)
    import functools
    import torch
    from . import tune
    storage = tune.storage_url(args.storage) if args.storage else None
    if storage is not None or args.workers > 1:
        print(f"study {args.study_name or f'dignn-sweep-{dataset.name}'!r} in "
              f"{tune.shown_url(storage) or 'a temporary SQLite file'}, {args.workers} "
              f"worker(s)", flush=True)
    try:
        result = sweep.run_sweep(dataset, base, settings, splits=args.splits,
                                 protocol=args.protocol, progress=args.progress,
                                 on_setting=report, device=device,
                                 compile_model=args.compile, sync_every=args.sync_every,
                                 storage=storage, study_name=args.study_name,
                                 workers=args.workers, heartbeat=args.heartbeat,
                                 load=functools.partial(_load, args),
                                 threads=torch.get_num_threads())
    except tune.WorkerFailed as err:
        how = ("run the same command again to resume the sweep" if storage is not None else
               "its study was a temporary file: give --storage to make a sweep resumable")
        print(f"dignn sweep: error: {err}: {how}", file=sys.stderr, flush=True)
        return 1
    total = time.perf_counter() - start
    print("\n".join(_settings_table(result)))
    best = result.best
    rank = "cross-validation" if args.protocol == "gin" else "mean validation"
    print(f"chosen: setting {best.index} ({best.describe()}), the best {rank} accuracy")
    accs = ", ".join(f"{100 * a:.2f}" for a in result.test_acc)
    if args.protocol == "gin":
        print(f"{dataset.name} ({args.laplacian}): {GIN_DESCRIPTION}, chosen setting: "
              f"accuracy {100 * result.test_mean:.2f} +- {100 * result.test_std:.2f} % at "
              f"epoch {best.gin.epoch} over {len(best.splits)} fold(s) [{accs}]; the setting "
              f"was chosen on the same folds; {total:.1f} s in all")
    else:
        print(f"{dataset.name} ({args.laplacian}): test accuracy of the chosen setting "
              f"{100 * result.test_mean:.2f} +- {100 * result.test_std:.2f} % over "
              f"{len(best.splits)} split(s) [{accs}]; {total:.1f} s in all")
    if args.json:
        record = result.to_json()
        _write_record(args, record, preset_name, total, device)
    return 0


def _tune(args) -> int:
    import functools
    import torch
    from . import tune
    from .files import check_writable
    from .presets import preset_config
    from .protocols import apply_protocol
    device = _run_setup(args, "dignn tune")
    if device is None:
        return 2
    fixed = _override_values(args)
    _check_outputs(args)
    if args.export is not None:
        check_writable(args.export, "--export", "best.toml")
    space = getattr(args, "space_params", None)
    key, preset_name = _preset_of(args)
    base = preset_config(key, args.laplacian, args.preset, **fixed)
    if _backend_error(base, device):
        print(f"dignn tune: error: {_backend_error(base, device)}", file=sys.stderr)
        return 2
    start = time.perf_counter()
    dataset = _load(args)
    base = _user_data_solver(key, base, fixed, dataset)
    if space is None:
        space = tune.default_space(dataset.task)
    both = sorted(set(space) & {k for k, v in fixed.items() if v is not None})
    if both:
        raise ValueError(f"{', '.join(both)} is both fixed by an option and tuned; give it in "
                         f"one place only (drop the option, or its table in --space)")
    widest = max([base.hidden] + [int(v) for p in space.values() if p.name == "hidden"
                                  for v in (p.choices or (p.high,))])
    threads = _set_threads(args, _sweep_work(dataset, widest))
    storage = tune.storage_url(args.storage) if args.storage else \
        tune.default_storage(dataset.name, args.json)
    name = args.study_name or f"dignn-{dataset.name}-{args.laplacian}"
    job = tune.TuneJob(functools.partial(_load, args), base, space, name, storage,
                       splits=args.splits, protocol=args.protocol, device=str(device),
                       sync_every=args.sync_every, compile_model=args.compile,
                       threads=torch.get_num_threads(), seed=args.sampler_seed,
                       pruner=args.pruner, startup_trials=args.pruner_startup,
                       warmup_epochs=args.pruner_warmup, heartbeat=args.heartbeat,
                       dataset_name=dataset.name, enqueue_base=args.try_preset)
    print(f"{dataset.description}", flush=True)
    print(f"device {device}, {threads}; preset {preset_name}, laplacian {args.laplacian}",
          flush=True)
    print(f"study {name!r} in {tune.shown_url(storage)}: {args.trials} trial(s), "
          f"{args.workers} worker(s), pruner {args.pruner}; objective: {tune.OBJECTIVE}",
          flush=True)
    print("space: " + "; ".join(p.describe() for p in space.values()), flush=True)
    try:
        study = tune.run_study(job, args.trials, args.workers, args.timeout,
                               dataset=apply_protocol(dataset, args.protocol))
    except tune.WorkerFailed as err:
        print(f"dignn tune: error: {err}: run the same command again to resume the study",
              file=sys.stderr, flush=True)
        return 1
    total = time.perf_counter() - start
    record = tune.study_record(study, job)
    counts = ", ".join(f"{n} {state.lower()}" for state, n in record["counts"].items())
    print(f"study {name!r}: {len(record['trials'])} trial(s): {counts}")
    best = record.get("best")
    if best is None:
        print(f"no trial completed: nothing to choose"
              f"{f'; {args.export} was not written' if args.export else ''}", flush=True)
    else:
        params = ", ".join(f"{k}={v}" for k, v in best["params"].items())
        accs = ", ".join(f"{100 * a:.2f}" for a in best.get("test_acc", []))
        print(f"best: trial {best['number']} ({params}): mean validation accuracy "
              f"{100 * best['value']:.2f} %; its test accuracy "
              f"{100 * best.get('test_mean', math.nan):.2f} % [{accs}]; {total:.1f} s in all")
        if args.export is not None:
            _tune_export(args, best["params"], name, storage)
            print(f"wrote {args.export} (dignn train --config {args.export})")
    if args.json:
        from .device import describe_device
        record.update(describe_device(device))
        _write_record(args, record, preset_name, total, device)
    return 0


def _tune_export(args, params: dict, name: str, storage: str) -> None:
    """Writes the best trial's settings (over this command's options) as a ``dignn train
    --config`` file."""
    from . import tune
    from .config import to_toml
    from .files import write_atomically
    train = _subcommand(build_parser(), "train")
    values = argparse.Namespace(**{a.dest: a.default for a in train._actions
                                   if a.dest != argparse.SUPPRESS})
    for dest in vars(values):
        if dest not in ("json", "help", "timeout") and hasattr(args, dest) and \
                not dest.startswith("_"):
            setattr(values, dest, getattr(args, dest))
    for key, value in params.items():
        setattr(values, key, value)
    header = (f"the best trial of Optuna study {name!r} in {tune.shown_url(storage)}\n"
              f"dignn train --config FILE trains it (flags given with it override it)")
    text = to_toml(values, train, header).encode("utf-8")
    write_atomically(Path(args.export).expanduser(), lambda f: f.write(text))


def _plot_curves(args) -> int:
    """``dignn plot curves DIR``: the CSV logs of ``--log-dir`` drawn as one PNG."""
    from .files import check_writable
    from .logs import read_curves
    out = args.out if args.out is not None else str(Path(args.log_dir) / "curves.png")
    check_writable(out, "--out", "curves.png")
    curves = read_curves(args.log_dir)
    from . import plot
    path = plot.plot_curves(curves, out)
    for name, rows in curves.items():
        best = max(rows, key=lambda r: (r["val_acc"] if r["val_acc"] == r["val_acc"]
                                        else -1.0, -r["epoch"]))
        print(f"{name}: {len(rows)} epochs, training loss {rows[0]['train_loss']:.4g} -> "
              f"{rows[-1]['train_loss']:.4g}, best validation accuracy "
              f"{100 * best['val_acc']:.2f}% at epoch {int(best['epoch'])}")
    print(f"wrote {path}")
    return 0


def _plot(args) -> int:
    if args.figure == "curves":
        return _plot_curves(args)
    from . import plot
    from .files import write_atomically
    device = _run_setup(args, "dignn plot")
    if device is None:
        return 2
    _check_outputs(args)

    def threads(work):
        print(f"device {device}, {_set_threads(args, work)}", flush=True)
    run = dict(device=device, progress=args.progress, compile_model=args.compile,
               sync_every=args.sync_every, threads=threads)
    if args.figure == "convergence":
        study = plot.convergence_study(args.datasets, args.data_root, args.cache_dir, mu=args.mu,
                                       num_iter=args.max_iter, epochs=args.epochs, **run)
        path = plot.plot_convergence(study, args.out)
        for name, row in study.items():
            print(f"{name}: ||Z_t - Z_t-1||_F from {row['residuals'][0]:.3g} (t=1) to "
                  f"{row['residuals'][-1]:.3g} (t={len(row['residuals'])}), "
                  f"lambda_max ~ {row['lambda_max']:.3g}, mu {row['mu']:g}")
    else:
        study = plot.mu_study(args.dataset, args.mus, args.data_root, args.cache_dir,
                              epochs=args.epochs, max_iter=args.max_iter, **run)
        path = plot.plot_mu(study, args.out)
        for i, mu in enumerate(study["mu"]):
            print(f"mu {mu:g}: residual {study['residual'][i]:.3g}, gap "
                  f"{study['gap'][i]:.3g}, test acc {100 * study['test_acc'][i]:.2f}%, "
                  f"lambda_max ~ {study['lambda_max'][i]:.3g}")
    print(f"wrote {path}")
    if args.json:
        text = (json.dumps(study, indent=2) + "\n").encode()
        write_atomically(Path(args.json).expanduser(), lambda f: f.write(text))
    return 0


def _input_error(err: BaseException) -> bool:
    """Whether ``err`` is about the command's input (a file, a path, a value, a missing
    package or dataset), said in one line, rather than a fault of dignn, which keeps its
    traceback."""
    if isinstance(err, (ValueError, OSError, ImportError)):
        return True
    from .data.storage import DatasetUnavailableError
    return isinstance(err, DatasetUnavailableError) or _out_of_memory(err)


def _out_of_memory(err: BaseException) -> bool:
    import torch
    return isinstance(err, (MemoryError, torch.OutOfMemoryError)) or (
        isinstance(err, RuntimeError) and "can't allocate memory" in str(err))


def _error_line(err: BaseException, args=None) -> str:
    """What :func:`main` prints after ``error:``: a file that could not be written names
    the option that chose it."""
    from .files import WriteError
    if isinstance(err, WriteError):
        return err.describe(None if args is None else _output_option(args, err.path))
    if _out_of_memory(err) and not isinstance(err, (ValueError, OSError)):
        asked = re.search(r"allocate ([0-9.]+ ?[KMGTP]?i?B|[0-9]+ bytes)", str(err))
        return (f"out of memory{f' (an allocation of {asked.group(1)})' if asked else ''}: "
                f"this graph with these settings needs more memory than this machine has; "
                f"lower --hidden (or the batch size), or use a machine with more memory")
    return str(err)


# The exit status after Ctrl-C, as shells report a command that SIGINT ended (128 + 2).
INTERRUPTED = 128 + 2

# The options that name a file the command writes, by their attribute in the parsed args.
_OUTPUTS = {"json": "--json", "checkpoint": "--checkpoint", "out": "--out",
            "partition_file": "--partition-file", "export": "--export"}


def _output_option(args, path) -> Optional[str]:
    """The option (e.g. ``--json``) whose value is ``path``, None if none is."""
    def resolved(value):
        return os.path.abspath(os.path.expanduser(os.fspath(value)))
    for attr, option in _OUTPUTS.items():
        value = getattr(args, attr, None)
        if value is not None and resolved(value) == resolved(path):
            return option
    log_dir = getattr(args, "log_dir", None)
    if log_dir is not None and Path(resolved(path)).is_relative_to(resolved(log_dir)):
        return "--log-dir"
    return None


def _file_state(path) -> Optional[tuple]:
    """What tells a file's versions apart (device, inode, size, modification time), None
    when there is no file at ``path``."""
    try:
        st = os.stat(Path(path).expanduser())
    except (OSError, ValueError):
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _interrupted_line(args) -> str:
    """What Ctrl-C ends the command with: for ``dignn train --checkpoint``, whether the
    checkpoint there is this run's, whole, to continue with ``--resume``."""
    line = f"dignn {args.command}: interrupted"
    checkpoint = getattr(args, "checkpoint", None)
    if args.command != "train":
        return line
    if checkpoint is None:
        return f"{line}; nothing was saved (--checkpoint PATH saves a run that --resume " \
               f"continues)"
    now = _file_state(checkpoint)
    if now is not None and (args.resume or now != getattr(args, "checkpoint_state", None)):
        again = "the same command" if args.resume else "the same command with --resume"
        return f"{line}; the checkpoint {checkpoint!r} is intact: run {again} to continue"
    return f"{line} before the first checkpoint was saved to {checkpoint!r}; nothing to " \
           f"resume from: run the command again"


def _close_progress_bars() -> None:
    """Ends the progress bars still drawn, so that the next line starts a line of its own
    (a bar cut short while it was being made, which tqdm cannot close, gets its newline
    here and draws nothing more, not even when collected)."""
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover - tqdm is a dependency
        return
    for bar in list(getattr(tqdm, "_instances", ())):
        cut_short = hasattr(bar, "sp") and not hasattr(bar, "last_print_t")
        try:
            bar.close()
        except Exception:  # noqa: BLE001 - a bar in a state tqdm did not foresee
            cut_short = True
        bar.disable = True
        if cut_short:
            try:
                bar.fp.write("\n")
            except (AttributeError, OSError, ValueError):
                pass


def _say_interrupted(args) -> int:
    """Prints the one line that ends an interrupted command; returns its exit status."""
    _close_progress_bars()
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        pass
    print(_interrupted_line(args), file=sys.stderr, flush=True)
    return INTERRUPTED


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs a ``dignn`` command; returns its exit status: 0; 2 after a bad input or a file
    that could not be written, said on stderr as ``dignn <command>: error: <what is wrong
    and what to do>``; 130 after Ctrl-C (SIGINT), said in one line (with, for a
    checkpointed run, whether it can be resumed)."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    if args.command == "train" and args.config is not None:
        from .config import ConfigError
        try:
            args = _config_arguments(parser, argv, args.config)
        except ConfigError as err:
            print(f"dignn train: error: {err}", file=sys.stderr, flush=True)
            return 2
    if args.command == "train" and args.print_config:
        return _print_config(parser, args)
    args.argv = argv  # the command, for --json
    if getattr(args, "checkpoint", None) is not None:  # after Ctrl-C: did this run save it?
        args.checkpoint_state = _file_state(args.checkpoint)
    try:
        with warnings.catch_warnings():
            try:
                early = _early_error(args)  # before torch is imported
                if early is not None:
                    print(f"dignn {args.command}: error: {early}", file=sys.stderr, flush=True)
                    return 2
                _show_warnings()
                if args.command == "train":
                    return _train(args)
                if args.command == "sweep":
                    return _sweep(args)
                if args.command == "tune":
                    return _tune(args)
                return _plot(args)
            except Exception as err:  # noqa: BLE001 - only input errors are caught, see below
                if not _input_error(err):
                    raise
                sys.stdout.flush()
                print(f"dignn {args.command}: error: {_error_line(err, args)}",
                      file=sys.stderr, flush=True)
                return 2
    except KeyboardInterrupt:
        return _say_interrupted(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
