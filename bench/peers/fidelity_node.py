"""Node classification, the authors' code and ``dignn`` side by side on the same splits.

The authors' side is their ``nodeclassification/main.py`` run as it is (``main.main(args)``
with their arguments, their data loading from files laid out as their loaders expect, their
seeds, their per-epoch selection on validation accuracy), its printed log parsed for each
split's test accuracy, best epoch and time. ``--variant swapped`` runs the same with their
implicit layer replaced by this project's (:meth:`FusedImplicitDiffusion.from_authors`, the
one-line swap of docs/layer.md), the same function to float rounding, where their layer is
too slow for the budget. The ``dignn`` side trains :func:`dignn.train` with a preset on the
very same splits (the authors' masks).

Usage::

    python bench/peers/fidelity_node.py --datasets cora --splits 0-4 --epochs 1000 \
        --authors ../authors_dignn --threads 1 --out bench/results/fidelity_cora.json

Writes one record (schema ``dignn-fidelity/1``, shared with bench/peers/fidelity_graph.py):
per split both test accuracies (percent), best epochs and ms per epoch; per dataset the
paired mean difference (dignn - authors) with its standard error.
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import io
import os
import re
import shutil
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import fidelity_common as fc  # noqa: E402

SCHEMA = "dignn-fidelity/1"
DATA_DEFAULT = HERE.parents[2] / "shared" / "data"

# dignn's dataset name -> the authors' --input, and their input unit (--preprocess: "adj",
# "linkx", or "" for none, i.e. the MLP input of the homophilous graphs).
DATASETS: Dict[str, Dict] = {
    "cora": {"input": "cora", "preprocess": ""},
    "chameleon-directed": {"input": "chameleon", "preprocess": "adj"},
    "amherst41": {"input": "amherst41", "preprocess": "linkx"},
    "cornell5": {"input": "cornell5", "preprocess": "linkx"},
}
# The paper's table (DIGNN-Delta_Phi), for the record.
PAPER = {"cora": 86.68, "chameleon-directed": 79.89, "amherst41": 83.34, "cornell5": 84.44}

_EPOCH = re.compile(r"^Epoch: (\d+), Train: ([\d.]+), Val: ([\d.]+), Test: ([\d.]+)$")
_RUN = re.compile(r"^\S+, \S+, Accuacy: ([\d.]+), Time: ([\d.]+)$")


# ------------------------------------------------------------- the authors' data layout --

def stage_their_data(dataset: str, data_root: Path, dest: Path) -> None:
    """Lays out the raw files where the authors' ``data.get_data("data", name)`` reads them,
    under ``dest/data``: links to the shared files, and for Chameleon the Geom-GCN feature
    file (not available offline) written from the npz release, which holds the same
    features, labels and splits."""
    root = dest / "data"
    if dataset == "cora":
        folder = root / "citation"
        folder.mkdir(parents=True, exist_ok=True)
        for f in (data_root / "Cora" / "geom-gcn" / "raw").iterdir():
            (folder / f.name).symlink_to(f)
    elif dataset == "chameleon-directed":
        raw = root / "chameleon" / "raw"
        raw.mkdir(parents=True, exist_ok=True)
        (raw / "out1_graph_edges.txt").symlink_to(
            data_root / "chameleon" / "geom-gcn" / "raw" / "out1_graph_edges.txt")
        npz = np.load(data_root / "chameleon" / "raw" / "chameleon.npz")
        x, y = npz["node_features"], npz["node_labels"]
        with open(raw / "out1_node_feature_label.txt", "w") as fh:
            fh.write("node_id\tfeature\tlabel\n")
            for i in range(x.shape[0]):
                fh.write(f"{i}\t{','.join(repr(float(v)) for v in x[i])}\t{int(y[i])}\n")
        for k in range(npz["train_masks"].shape[0]):
            np.savez(raw / f"chameleon_split_0.6_0.2_{k}.npz",
                     train_mask=npz["train_masks"][k], val_mask=npz["val_masks"][k],
                     test_mask=npz["test_masks"][k])
    elif dataset in ("amherst41", "cornell5"):
        raw = root / dataset / "raw"
        raw.mkdir(parents=True, exist_ok=True)
        (raw / f"{dataset.capitalize()}.mat").symlink_to(data_root / dataset / "raw" / "data.mat")
    else:
        raise ValueError(f"no authors' layout for {dataset!r}")


@contextlib.contextmanager
def _their_world(cwd: Path):
    """Their code as it runs on its own machine: cwd = its folder holding ``data/``, and the
    ``torch.load`` of the PyG version it was written for (weights_only=False: the files are
    the ones their own process wrote a moment before in our temporary folder)."""
    old_cwd, old_load = os.getcwd(), torch.load

    def load(*args, **kwargs):
        kwargs.setdefault("weights_only", False)
        return old_load(*args, **kwargs)
    os.chdir(cwd)
    torch.load = load
    try:
        yield
    finally:
        torch.load = old_load
        os.chdir(old_cwd)


def their_splits(authors, dataset: str, cwd: Path) -> Dict:
    """The data as their ``get_data`` returns it after their ``main`` seeds the generators
    (numpy 42, torch 42: their random facebook100 splits depend on it)."""
    name = DATASETS[dataset]["input"]
    with _their_world(cwd):
        np.random.seed(42)
        torch.manual_seed(42)
        out = authors.data.get_data("data", name, torch.device("cpu"))
    edge_index, x, y, _, _, train, val, test = out
    return {"edge_index": edge_index, "x": x, "y": y, "train": train, "val": val, "test": test}


# -------------------------------------------------------------------- the authors' run --

def their_args(dataset: str, row: Dict, epochs: int, runs: int) -> types.SimpleNamespace:
    """Their main.py's arguments: its defaults, the dataset's input unit, and the table's
    row (mu, num_hid, lr, weight_decay, max_iter, threshold, dropout)."""
    return types.SimpleNamespace(
        input=DATASETS[dataset]["input"], model="Neural", runs=runs, epochs=epochs,
        lr=row["lr"], weight_decay=row["weight_decay"], num_hid=row["hidden"],
        dropout=row["dropout"], max_iter=row["max_iter"], threshold=row["tol"], mu=row["mu"],
        preprocess=DATASETS[dataset]["preprocess"], train_rate=0.05, val_rate=0.05,
        num_heads=8, K=4, alpha=0.5, theta=1.0, num_layers=1)


def parse_log(text: str, epochs: int) -> List[Dict]:
    """Per run of their printed log: test accuracy at the best validation epoch (percent),
    that epoch (1-based: the last one whose validation accuracy beat every earlier one) and
    ms per epoch (their run's wall time over its epochs), and ``history``: per epoch the
    printed train accuracy, best validation accuracy so far and its test accuracy.

    Raises:
        ValueError: the log holds no complete run.
    """
    runs, best_val, best_epoch, history = [], -1.0, 0, []
    for line in text.splitlines():
        m = _EPOCH.match(line.strip())
        if m:
            epoch, val = int(m.group(1)), float(m.group(3))
            if epoch == 1:
                best_val, best_epoch, history = -1.0, 0, []
            history.append([float(m.group(i)) for i in (2, 3, 4)])
            if val > best_val:
                best_val, best_epoch = val, epoch
            continue
        m = _RUN.match(line.strip())
        if m:
            runs.append({"acc": 100 * float(m.group(1)), "best_epoch": best_epoch,
                         "ms_per_epoch": 1000 * float(m.group(2)) / epochs,
                         "history": history})
    if not runs:
        raise ValueError("their log holds no finished run (no 'Accuacy: ..., Time: ...' line)")
    return runs


def run_authors(authors, dataset: str, cwd: Path, args, variant: str) -> List[Dict]:
    """Their ``main.main(args)``, its log parsed (:func:`parse_log`). ``variant="swapped"``:
    each model's implicit layer replaced by :meth:`FusedImplicitDiffusion.from_authors` right
    after their ``build_model`` (same weights, same random draws)."""
    main = authors.main
    build = main.build_model
    if variant == "swapped":
        from dignn_kernels import FusedImplicitDiffusion

        def swapped_build(*a, **k):
            model = build(*a, **k)
            model.model = FusedImplicitDiffusion.from_authors(model.model)
            return model
        main.build_model = swapped_build
    log = io.StringIO()
    try:
        with _their_world(cwd), contextlib.redirect_stdout(log):
            main.main(args)
    finally:
        main.build_model = build
    return parse_log(log.getvalue(), args.epochs)


# ------------------------------------------------------------------------ dignn's run --

def dignn_dataset(dataset: str, data_root: Path, theirs: Dict):
    """dignn's own loading of ``dataset`` with the authors' splits in place of its own, and
    how its splits, features and graph compare with theirs."""
    import dignn
    from dignn.data import Split
    ds = dignn.load_dataset(dataset, data_root=data_root)
    splits = []
    for k in range(theirs["train"].size(1)):
        idx = [torch.nonzero(theirs[s][:, k]).flatten() for s in ("train", "val", "test")]
        splits.append(Split(*idx))
    same_splits = len(ds.splits) == len(splits) and all(
        all(torch.equal(torch.sort(getattr(a, s)).values, getattr(b, s))
            for s in ("train", "val", "test")) for a, b in zip(ds.splits, splits))
    x = ds.x.to_dense() if ds.x.layout != torch.strided else ds.x
    compare = {
        "splits_identical": bool(same_splits),
        "labels_identical": bool(torch.equal(ds.y.long(), theirs["y"].long())),
        "features_max_abs_diff": float((x.float() - theirs["x"].float()).abs().max()),
        "edges": {"dignn": int(ds.edge_index.size(1)), "authors": int(theirs["edge_index"].size(1))},
    }
    ours = {tuple(e) for e in ds.edge_index.t().tolist()}
    their = {tuple(e) for e in theirs["edge_index"].t().tolist()}
    compare["edges"]["same_pairs"] = ours == their
    compare["edges"]["same_pairs_flipped"] = ours == {(b, a) for a, b in their}
    ds.splits = splits
    return ds, compare


def run_dignn(ds, config, splits: Sequence[int]) -> List[Dict]:
    import dignn
    result = dignn.train(ds, config, splits=list(splits), progress=False, device="cpu")
    return [{"acc": 100 * s.test_acc, "best_epoch": int(s.best_epoch),
             "ms_per_epoch": float(s.ms_per_epoch), "lambda_max_end": s.lambda_max_end,
             "val_history": list(s.val_history), "test_history": list(s.test_history)}
            for s in result.splits]


def reused_authors(path, dataset: str, splits: Sequence[int], entry: Dict) -> List[Dict]:
    """The authors' side of ``dataset`` from an earlier record, checked to have run with the
    same arguments (but ``runs``) on the requested splits.

    Raises:
        SystemExit: the record lacks the dataset or a split, or ran other arguments.
    """
    import json
    old = json.load(open(path))["datasets"].get(dataset)
    if old is None:
        raise SystemExit(f"--reuse: {path} holds no {dataset!r}")
    mine = {k: v for k, v in entry["authors_args"].items() if k != "runs"}
    theirs = {k: v for k, v in old["authors_args"].items() if k != "runs"}
    if mine != theirs:
        raise SystemExit(f"--reuse: {path} ran the authors' code with {theirs}, not {mine}")
    by_split = {s["split"]: s for s in old["splits"] if "theirs_acc" in s}
    missing = [k for k in splits if k not in by_split]
    if missing:
        raise SystemExit(f"--reuse: {path} has no authors' result for splits {missing}")
    for key in ("swap_check", "authors_seconds"):
        if key in old:
            entry[key] = old[key]
    entry["authors_from"] = str(path)
    return [{"acc": by_split[k]["theirs_acc"], "best_epoch": by_split[k]["theirs_best_epoch"],
             "ms_per_epoch": by_split[k]["theirs_ms_per_epoch"],
             "history": by_split[k].get("theirs_history", [])} for k in splits]


# ----------------------------------------------------------------------------- main --

def _split_range(text: str) -> List[int]:
    out = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        out.extend(range(int(a), int(b or a) + 1))
    if not out or min(out) < 0:
        raise argparse.ArgumentTypeError(f"--splits: a list like 0-4 or 0,2,5, got {text!r}")
    return sorted(set(out))


def _overrides(items: Sequence[str]) -> Dict:
    out = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq:
            raise SystemExit(f"--dignn-set: KEY=VALUE, got {item!r}")
        try:
            out[key] = ast.literal_eval(value)  # numbers, None, True/False; else the text
        except (ValueError, SyntaxError):
            out[key] = value
    return out


def main(argv=None) -> Dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--datasets", default="cora")
    p.add_argument("--splits", type=_split_range, default=_split_range("0-4"))
    p.add_argument("--epochs", type=int, default=1000,
                   help="the authors' epochs (their default: 1000)")
    p.add_argument("--dignn-epochs", type=int, default=None,
                   help="dignn's epochs (default: the preset's)")
    p.add_argument("--authors", default=None, help="checkout of guoji-fu/DIGNN "
                   "(default $DIGNN_AUTHORS)")
    p.add_argument("--data-root", default=os.environ.get("DIGNN_DATA", str(DATA_DEFAULT)))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--variant", choices=("theirs", "swapped"), default="swapped")
    p.add_argument("--dignn-preset", choices=("tuned", "paper"), default="tuned")
    p.add_argument("--dignn-set", nargs="*", default=[],
                   help="TrainConfig overrides of the dignn side, KEY=VALUE")
    p.add_argument("--sides", default="authors,dignn")
    p.add_argument("--check-swap", type=int, default=0, metavar="EPOCHS",
                   help="first run the authors' side with their layer and with the swapped one "
                        "for EPOCHS epochs on the splits and record how their logs differ")
    p.add_argument("--reuse", default=None, metavar="RECORD",
                   help="take the authors' side from this earlier record (same dataset, "
                        "splits and authors' arguments) instead of running it again")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    import dignn
    authors = fc.import_authors(args.authors, "nodeclassification", ("models", "main", "data"))
    sides = set(args.sides.split(","))
    doc = fc.header(SCHEMA, sys.argv if argv is None else ["bench/peers/fidelity_node.py"] + argv,
                    args.threads, authors.info)
    doc["task"] = "node"
    doc["variant"] = args.variant
    doc["datasets"] = {}
    runs = max(args.splits) + 1
    for dataset in args.datasets.split(","):
        if dataset not in DATASETS:
            raise SystemExit(f"--datasets: one of {sorted(DATASETS)}, got {dataset!r}")
        row = dignn.preset_config(dataset, "neural", "paper").as_dict()
        config = dignn.preset_config(dataset, "neural", args.dignn_preset,
                                     epochs=args.dignn_epochs, **_overrides(args.dignn_set))
        with tempfile.TemporaryDirectory(prefix="dignn-fidelity-") as tmp:
            tmp = Path(tmp)
            stage_their_data(dataset, Path(args.data_root), tmp)
            theirs_data = their_splits(authors, dataset, tmp)
            entry = {"paper": PAPER.get(dataset), "protocol":
                     "test accuracy at the best-validation epoch (both sides), their splits",
                     "authors_args": vars(their_args(dataset, row, args.epochs, runs)),
                     "dignn_config": config.as_dict(), "epochs": {"authors": args.epochs,
                                                                 "dignn": config.epochs}}
            ours = theirs = None
            if args.check_swap:
                logs = {v: run_authors(authors, dataset, tmp, their_args(
                    dataset, row, args.check_swap, runs), v) for v in ("theirs", "swapped")}
                entry["swap_check"] = {
                    "epochs": args.check_swap, "splits": list(range(runs)),
                    "ms_per_epoch": {v: [r["ms_per_epoch"] for r in logs[v]] for v in logs},
                    "max_abs_diff_of_printed_accuracies": max(
                        abs(a - b) for r, q in zip(logs["theirs"], logs["swapped"])
                        for ha, hb in zip(r["history"], q["history"]) for a, b in zip(ha, hb))}
            if "dignn" in sides:
                ds, compare = dignn_dataset(dataset, Path(args.data_root), theirs_data)
                entry["data_compared"] = compare
                t0 = time.time()
                ours = run_dignn(ds, config, args.splits)
                entry["dignn_seconds"] = round(time.time() - t0, 1)
            if args.reuse:
                theirs = reused_authors(args.reuse, dataset, args.splits, entry)
            elif "authors" in sides:
                t0 = time.time()
                all_runs = run_authors(authors, dataset, tmp,
                                       their_args(dataset, row, args.epochs, runs), args.variant)
                theirs = [all_runs[k] for k in args.splits]
                entry["authors_seconds"] = round(time.time() - t0, 1)
        entry["splits"] = []
        for i, k in enumerate(args.splits):
            s = {"split": k}
            for side, res in (("ours", ours), ("theirs", theirs)):
                if res is not None:
                    s[f"{side}_acc"] = res[i]["acc"]
                    s[f"{side}_best_epoch"] = res[i]["best_epoch"]
                    s[f"{side}_ms_per_epoch"] = res[i]["ms_per_epoch"]
            if theirs is not None:
                s["theirs_history"] = theirs[i]["history"]
            if ours is not None:
                s["ours_lambda_max_end"] = ours[i]["lambda_max_end"]
                s["ours_val_history"] = ours[i]["val_history"]
                s["ours_test_history"] = ours[i]["test_history"]
            entry["splits"].append(s)
        if ours is not None and theirs is not None:
            entry["paired"] = fc.paired([r["acc"] for r in ours], [r["acc"] for r in theirs])
        doc["datasets"][dataset] = entry
        fc.write_json(doc, args.out)
        print(dataset, {k: v for k, v in entry.items() if k in ("paired", "data_compared")},
              flush=True)
    return doc


if __name__ == "__main__":
    main()
