"""Graph classification fidelity: the authors' DIGNN code and ``dignn`` trained side by side on
the same folds (MUTAG, NCI1), paired per fold.

The authors' side is THEIR code, imported from the user's checkout (``--authors`` or
``$DIGNN_AUTHORS``; :func:`fidelity_common.import_authors`) and run through their own functions:
``main.load_data`` (seeded ``TUDataset(...).shuffle()`` and ``StratifiedKFold(10, shuffle=True,
random_state=seed)``), ``main.build_model``, ``main.split_data`` (batches of 128, not
shuffled), ``main.train`` and ``main.test``, in the order of their ``main()``: seed, data, then
per fold a model, Adam, and per epoch a training pass, the training accuracy and the held-out
accuracy. Only ``TUDataset`` is pointed at a copy of this machine's raw files (their
``load_data`` would download into the checkout). The torch random stream of their side is
kept apart from dignn's (saved and restored around every dignn fold), so that running folds
0..k in order reproduces their ``main()`` run on those folds exactly.

``--variant swapped`` replaces their implicit layer (``model.model``, a ``DEQFixedPoint``) by
``dignn_kernels.FusedImplicitDiffusion.from_authors`` of it (the same weights and equation;
their solver's budget, max_iter + 2 applications, without their absolute early stop) where
their layer is too slow; ``--check-swap E`` first trains fold 0 for E epochs both ways and
records the per-epoch losses and accuracies of both.

The dignn side trains on exactly the authors' folds: the graphs of ``dignn.load_dataset``
(TUDataset's file order) with splits mapped through their shuffle's permutation, each fold's
held-out graphs being both validation and test set (as under dignn's GIN protocol), through
``dignn.training.train_graph_split``. Several dignn configurations can run on the same folds
(``--dignn-configs``): ``preset`` (``--dignn-preset`` plus ``--dignn-set`` overrides),
``authors-hparams`` (the authors' side's hyperparameters in dignn's architecture) and
architecture variants (the authors' design choices applied to dignn's model one at a time,
built here by wrapping dignn's model; :data:`ARCH_VARIANTS`).

Two readouts per side: ``fold_max`` (the authors' main(): each fold's best held-out accuracy
over the epochs, averaged over folds) and ``gin`` (dignn's GIN protocol: the single epoch that
maximizes the mean over the folds). Both are test-set selection, as the paper's table 5 is.

Usage:
    OMP_NUM_THREADS=1 python bench/peers/fidelity_graph.py --datasets mutag --folds 0-9 \\
        --epochs 150 --authors /work/authors_dignn --threads 1 --variant swapped
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import math
import os
import random
import shutil
import statistics
import sys
import time
import types
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import torch

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

SCHEMA = "dignn-fidelity/1"
DATASETS = ("mutag", "nci1")
TU_NAMES = {"mutag": "MUTAG", "nci1": "NCI1"}
# Table 5 of the paper, DIGNN-Delta_Phi (graph classification accuracy, percent).
PAPER = {"mutag": 94.6, "nci1": 77.9}
PROTOCOL = ("the authors' graphclassification/main.py: seed 42, TUDataset(...).shuffle(), "
            "StratifiedKFold(10, shuffle=True, random_state=42) on dataset.data.y, batches of "
            "128 in file order; per epoch a training pass then the held-out fold's accuracy; "
            "readout fold_max = mean over folds of each fold's best held-out accuracy over "
            "the epochs; readout gin = held-out accuracy at the one epoch maximizing the mean "
            "over the folds (both select on the held-out fold)")

# The authors' side: their get_args() defaults, then per dataset what their README command
# (MUTAG, the same as their MUTAG log's first line) or the appendix's table 7 (NCI1: their
# repository has neither a command nor a finished log for it) sets.
AUTHORS_DEFAULTS = dict(model="Neural", runs=10, epochs=1000, seed=42, lr=0.001,
                        weight_decay=0.0, num_hid=128, dropout=0.0, num_layers=3,
                        max_iter=50, threshold=1e-6, mu=4.0)
AUTHORS_SETTINGS = {
    "mutag": dict(mu=1.25, max_iter=20, num_hid=128, lr=0.001, weight_decay=0.0),
    "nci1": dict(mu=1.25, max_iter=4, num_hid=64, lr=0.001, weight_decay=1e-5),
}
AUTHORS_SOURCE = {
    "mutag": "their README's command (python main.py --input MUTAG --model Neural --mu 1.25 "
             "--max_iter 20 --num_hid 128 --lr 0.001 --weight_decay 0 --epochs 1000), the "
             "args of their MUTAG log",
    "nci1": "their main.py defaults with the appendix's table 7 row for NCI1 (mu 1.25, "
            "hidden 64, lr 0.001, weight decay 1e-5, max_iter 4, dropout 0); their NCI1 log "
            "(5 epochs of fold 0) ran the defaults mu 4, max_iter 50, hidden 128",
}

# Architecture variants: the authors' choices applied to dignn's DIGNNGraphClassifier one at
# a time (on top of the authors-hparams configuration, so that only the named part differs).
ARCH_VARIANTS = {
    "mlp-input": "input unit in -> 64 -> hidden (ReLU between, none after) then batch norm, "
                 "as the authors' MLP(num_neurons=[64, hidden]) + bn1, instead of "
                 "Linear+ReLU+batch norm",
    "logit-dropout": "dropout 0.5 on the logits in training, as the authors' forward",
    "no-shuffle": "training batches in the fold's order, not shuffled, as the authors' loader",
    "their-budget": "the fixed point's budget as theirs: max_iter + 2 applications of the map "
                    "and no relative stopping test (tol 0), as FusedImplicitDiffusion."
                    "from_authors reads their DEQFixedPoint",
    "all": "mlp-input + logit-dropout + no-shuffle + their-budget together",
    "cg": "not the authors': the exact solve (solver cg, the tuned preset's) instead of the "
          "fixed-point iteration, everything else authors-hparams",
}
# the variants that change TrainConfig fields rather than the model or the loader
_CONFIG_VARIANTS = ("their-budget", "cg")
DIGNN_CONFIGS = ("preset", "authors-hparams") + tuple(ARCH_VARIANTS)


# ----------------------------------------------------------------------------- readouts

def fold_max_readout(histories: Sequence[Sequence[float]]) -> Dict:
    """The authors' readout: per fold the best held-out accuracy over the epochs and its
    (first, 1-based) epoch.

    Args:
        histories: per fold, the held-out accuracy of every epoch.

    Returns:
        dict with ``per_fold`` (accuracies), ``epochs`` (1-based) and ``mean``.

    Raises:
        ValueError: no folds, or a fold without epochs.
    """
    if not histories:
        raise ValueError("fold_max_readout needs at least one fold's history")
    accs, epochs = [], []
    for k, h in enumerate(histories):
        if not len(h):
            raise ValueError(f"fold {k} has an empty history")
        finite = [v for v in h if not math.isnan(v)]
        best = max(finite) if finite else math.nan
        accs.append(float(best))
        epochs.append(list(h).index(best) + 1 if finite else 0)
    return {"per_fold": accs, "epochs": epochs, "mean": statistics.fmean(accs)}


def gin_readout(histories: Sequence[Sequence[float]]) -> Dict:
    """GIN's readout: the (first, 1-based) epoch maximizing the mean held-out accuracy over the
    folds, and each fold's accuracy at it.

    Raises:
        ValueError: no folds, or folds of different lengths.
    """
    if not histories:
        raise ValueError("gin_readout needs at least one fold's history")
    lengths = {len(h) for h in histories}
    if len(lengths) != 1 or 0 in lengths:
        raise ValueError(f"gin_readout needs every fold to have run the same (non-zero) number "
                         f"of epochs, got lengths {sorted(lengths)}")
    n = lengths.pop()
    means = [statistics.fmean(h[e] for h in histories) for e in range(n)]
    best = max(range(n), key=lambda e: (means[e], -e))
    return {"epoch": best + 1, "per_fold": [float(h[best]) for h in histories],
            "mean": means[best]}


def build_splits(folds: Sequence[int], ours: Dict[str, List], theirs: Dict[str, List]
                 ) -> List[Dict]:
    """The schema's per-fold entries of one dignn configuration against the authors' side.

    Args:
        folds: the fold numbers, in the order of the histories.
        ours, theirs: dicts with ``test_history`` (per fold, the held-out accuracy per epoch,
            fractions) and ``ms_per_epoch`` (per fold).

    Returns:
        list of dicts: ``split``, ``ours_acc``/``theirs_acc`` (fold_max readout, percent),
        ``ours_best_epoch``/``theirs_best_epoch``, ``ours_ms_per_epoch``/
        ``theirs_ms_per_epoch``, and the gin readout's ``ours_acc_gin``/``theirs_acc_gin``,
        ``ours_gin_epoch``/``theirs_gin_epoch``.
    """
    om, tm = fold_max_readout(ours["test_history"]), fold_max_readout(theirs["test_history"])
    og, tg = gin_readout(ours["test_history"]), gin_readout(theirs["test_history"])
    rows = []
    for i, k in enumerate(folds):
        rows.append({"split": int(k),
                     "ours_acc": 100 * om["per_fold"][i], "theirs_acc": 100 * tm["per_fold"][i],
                     "ours_best_epoch": om["epochs"][i], "theirs_best_epoch": tm["epochs"][i],
                     "ours_ms_per_epoch": float(ours["ms_per_epoch"][i]),
                     "theirs_ms_per_epoch": float(theirs["ms_per_epoch"][i]),
                     "ours_acc_gin": 100 * og["per_fold"][i],
                     "theirs_acc_gin": 100 * tg["per_fold"][i],
                     "ours_gin_epoch": og["epoch"], "theirs_gin_epoch": tg["epoch"]})
    return rows


def compare(splits: List[Dict], paired) -> Dict:
    """``paired`` (fidelity_common.paired) of both readouts of ``splits``."""
    return {"fold_max": paired([s["ours_acc"] for s in splits],
                               [s["theirs_acc"] for s in splits]),
            "gin": paired([s["ours_acc_gin"] for s in splits],
                          [s["theirs_acc_gin"] for s in splits])}


def versus(splits: List[Dict], before: List[Dict], paired) -> Dict:
    """Both readouts of one dignn configuration (``splits``) paired against another's
    (``before``, an earlier record's splits of the same folds): ``mean_diff`` is
    ``splits`` - ``before``.

    Raises:
        ValueError: the two lists are not of the same folds.
    """
    if [s["split"] for s in splits] != [b["split"] for b in before]:
        raise ValueError("versus() needs the splits of the same folds in the same order")
    return compare([{**s, "theirs_acc": b["ours_acc"], "theirs_acc_gin": b["ours_acc_gin"]}
                    for s, b in zip(splits, before)], paired)


def parse_folds(text: str) -> List[int]:
    """``"0-9"``, ``"0,3,5"`` or ``"0-2,7"`` -> sorted distinct folds in 0..9.

    Raises:
        ValueError: malformed text or a fold outside 0..9.
    """
    folds = set()
    try:
        for part in text.split(","):
            part = part.strip()
            if "-" in part:
                a, b = (int(v) for v in part.split("-", 1))
                if b < a:
                    raise ValueError
                folds.update(range(a, b + 1))
            else:
                folds.add(int(part))
    except ValueError:
        raise ValueError(f"--folds must be fold numbers or ranges such as 0-9 or 0,3,5; got "
                         f"{text!r}") from None
    if not folds or min(folds) < 0 or max(folds) > 9:
        raise ValueError(f"--folds must name folds 0..9 (10-fold cross-validation), got "
                         f"{text!r}")
    return sorted(folds)


def parse_sets(items: Sequence[str]) -> Dict:
    """``["hidden=128", "lr=0.001", "solver=cg"]`` -> typed overrides of TrainConfig fields
    (int, float, bool, None or str).

    Raises:
        ValueError: an item without ``=``.
    """
    out = {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"--dignn-set takes FIELD=VALUE (e.g. hidden=128), got {item!r}")
        key, value = item.split("=", 1)
        for cast in (int, float):
            try:
                out[key.strip()] = cast(value)
                break
            except ValueError:
                continue
        else:
            low = value.strip().lower()
            out[key.strip()] = {"true": True, "false": False, "none": None}.get(low, value)
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--datasets", default="mutag", help="comma list of " + ", ".join(DATASETS))
    p.add_argument("--folds", default="0-9", help="folds to run, e.g. 0-9 or 0,1 (default 0-9)")
    p.add_argument("--epochs", type=int, required=True, help="epochs of both sides")
    p.add_argument("--authors", default=None, help="the authors' checkout (or $DIGNN_AUTHORS)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--variant", choices=("theirs", "swapped"), default="swapped",
                   help="the authors' model and loop with their layer, or with this project's")
    p.add_argument("--check-swap", type=int, default=0, metavar="E",
                   help="first train fold 0 for E epochs with their layer and swapped, recorded")
    p.add_argument("--dignn-preset", choices=("tuned", "paper"), default="tuned")
    p.add_argument("--dignn-set", action="append", default=[], metavar="FIELD=VALUE",
                   help="TrainConfig overrides of the preset configuration (repeatable)")
    p.add_argument("--dignn-configs", default="preset,authors-hparams",
                   help="dignn configurations on the same folds: " + ", ".join(DIGNN_CONFIGS)
                        + ", or preset+VARIANT[+VARIANT...] (variants on the preset)")
    p.add_argument("--theirs-from", default=None, metavar="FILE",
                   help="reuse the authors' side of a previous record (same folds, epochs, "
                        "variant) instead of training it again")
    p.add_argument("--out", default=str(HERE.parent / "results" / "fidelity_{dataset}.json"),
                   help="output path; {dataset} is replaced by the dataset's name")
    p.add_argument("--data-root", default=os.environ.get("DIGNN_DATA", "/work/shared/data"))
    return p


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """The CLI's arguments, checked.

    Raises:
        SystemExit: argparse's exit (status 2) on a bad argument, with a message naming it.
    """
    p = build_parser()
    a = p.parse_args(argv)
    a.dataset_list = [d.strip().lower() for d in a.datasets.split(",") if d.strip()]
    bad = [d for d in a.dataset_list if d not in DATASETS]
    if bad or not a.dataset_list:
        p.error(f"--datasets must be a comma list of {', '.join(DATASETS)}, got {a.datasets!r}")
    try:
        a.fold_list = parse_folds(a.folds)
        a.overrides = parse_sets(a.dignn_set)
    except ValueError as err:
        p.error(str(err))
    if a.epochs < 1:
        p.error(f"--epochs must be >= 1, got {a.epochs}")
    if a.threads < 1:
        p.error(f"--threads must be >= 1, got {a.threads}")
    if a.check_swap < 0:
        p.error(f"--check-swap must be >= 0, got {a.check_swap}")
    a.config_list = [c.strip() for c in a.dignn_configs.split(",") if c.strip()]
    bad = [c for c in a.config_list if c not in DIGNN_CONFIGS and not (
        c.startswith("preset+") and c.split("+")[1:] and
        all(v in ARCH_VARIANTS and v != "all" for v in c.split("+")[1:]))]
    if bad or not a.config_list:
        p.error(f"--dignn-configs must be a comma list of {', '.join(DIGNN_CONFIGS)}, got "
                f"{a.dignn_configs!r}")
    if len(a.dataset_list) > 1 and "{dataset}" not in a.out:
        p.error("--out must contain {dataset} when several datasets run")
    return a


# ----------------------------------------------------------------------------- running

@contextlib.contextmanager
def _own_rng(state: Dict):
    """Runs the block on the random streams kept in ``state`` (torch, numpy, python) and puts
    the caller's streams back after, so that dignn's folds leave the authors' stream as their
    main() would have it."""
    import numpy as np
    import torch
    outer = (torch.get_rng_state(), np.random.get_state(), random.getstate())
    if state:
        torch.set_rng_state(state["torch"])
        np.random.set_state(state["numpy"])
        random.setstate(state["python"])
    try:
        yield
    finally:
        state.update(torch=torch.get_rng_state(), numpy=np.random.get_state(),
                     python=random.getstate())
        torch.set_rng_state(outer[0])
        np.random.set_state(outer[1])
        random.setstate(outer[2])


def _staged_root(name: str, data_root: str) -> Path:
    """A writable copy of ``<data_root>/<NAME>/raw`` (TUDataset writes processed/ beside)."""
    src = Path(data_root) / TU_NAMES[name] / "raw"
    if not src.is_dir():
        raise FileNotFoundError(f"{src} not found: --data-root must hold {TU_NAMES[name]}/raw")
    root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "dignn-fidelity"
    dst = root / TU_NAMES[name] / "raw"
    if not dst.is_dir():
        shutil.copytree(src, dst)
    return root


class Authors:
    """The authors' graph classification code, run through their own functions."""

    def __init__(self, checkout, name: str, data_root: str, variant: str):
        from fidelity_common import import_authors
        self.ns = import_authors(checkout, "graphclassification", ("models", "main"))
        self.main = self.ns.main
        root = _staged_root(name, data_root)
        their_tu = self.main.TUDataset
        # their load_data reads <their folder>/data/<NAME> (a download); same class, local copy
        self.main.TUDataset = lambda path, name: their_tu(str(root), name=name)
        self.variant = variant
        self.args = types.SimpleNamespace(**{**AUTHORS_DEFAULTS, **AUTHORS_SETTINGS[name],
                                             "input": TU_NAMES[name]})
        self.device = __import__("torch").device("cpu")

    def load(self):
        """Their main(): seeds, then load_data. Returns (dataset, idx_list, features,
        classes)."""
        import numpy as np
        import torch
        np.random.seed(self.args.seed)
        torch.manual_seed(self.args.seed)
        return self.main.load_data(self.args)

    def model(self, num_features: int, num_classes: int, variant: str):
        import torch
        model = self.main.build_model(self.args, num_features, num_classes).to(self.device)
        if variant == "swapped":
            from dignn_kernels import FusedImplicitDiffusion
            state = torch.get_rng_state()  # the layer's own init must not move their stream
            model.model = FusedImplicitDiffusion.from_authors(model.model)
            torch.set_rng_state(state)
        return model

    def fold(self, data, fold: int, epochs: int, variant: str, log=None) -> Dict:
        """One fold as their main() trains it; per epoch the training loss, the training and
        held-out accuracies and the wall time of the three."""
        import torch
        dataset, idx_list, nf, nc = data
        model = self.model(nf, nc, variant)
        opt = torch.optim.Adam(params=model.parameters(), lr=self.args.lr,
                               weight_decay=self.args.weight_decay)
        train_loader, test_loader = self.main.split_data(dataset, idx_list, fold)
        out = {"test_history": [], "train_acc_history": [], "train_loss_history": [],
               "epoch_seconds": []}
        for epoch in range(1, epochs + 1):
            t0 = time.perf_counter()
            loss = self.main.train(model, opt, train_loader, self.device)
            train_acc = self.main.test(model, train_loader, self.device)
            test_acc = self.main.test(model, test_loader, self.device)
            out["epoch_seconds"].append(time.perf_counter() - t0)
            out["test_history"].append(float(test_acc))
            out["train_acc_history"].append(float(train_acc))
            out["train_loss_history"].append(float(loss))
            if log and (epoch % 25 == 0 or epoch == epochs):
                log(f"  theirs fold {fold} epoch {epoch}: loss {loss:.4f} train "
                    f"{train_acc:.3f} test {test_acc:.3f}")
        out["ms_per_epoch"] = 1000 * statistics.fmean(out["epoch_seconds"])
        del out["epoch_seconds"]
        return out


def dignn_folds(dataset, perm, idx_list, folds: Sequence[int]):
    """dignn's GraphDataset with the authors' folds: their fold ``k`` indexes their shuffled
    dataset, whose item i is file item ``perm[i]``; the held-out graphs are the validation
    and the test set."""
    import dataclasses
    import torch
    from dignn.data import Split
    splits = []
    for k in range(len(idx_list)):
        train, test = (perm[torch.as_tensor(i, dtype=torch.long)] for i in idx_list[k])
        splits.append(Split(torch.sort(train).values, torch.sort(test).values,
                            torch.sort(test).values))
    return dataclasses.replace(dataset, splits=splits,
                               description=dataset.description + "; the authors' folds")


def authors_hparams(name: str, epochs: int) -> Dict:
    """TrainConfig fields equal to the authors' side: their width, rates, mu, solver budget
    (fixed-point with their threshold read as dignn's relative tolerance), no dropout, 3 node
    and 3 graph layers, add pooling, batch 128."""
    s = {**AUTHORS_DEFAULTS, **AUTHORS_SETTINGS[name]}
    return dict(hidden=s["num_hid"], lr=s["lr"], weight_decay=s["weight_decay"], mu=s["mu"],
                max_iter=s["max_iter"], tol=s["threshold"], dropout=s["dropout"],
                solver="fixed_point", node_layers=s["num_layers"],
                graph_layers=s["num_layers"], pooling="add", batch_size=128, epochs=epochs)


class _MLPInput(torch.nn.Module):
    """in -> 64 -> hidden with a ReLU between and none after (the authors' input unit)."""

    def __init__(self, in_channels: int, hidden: int):
        super().__init__()
        self.a = torch.nn.Linear(in_channels, 64)
        self.b = torch.nn.Linear(64, hidden)

    def forward(self, x):
        return self.b(self.a(x).relu())


def _variant_model(model, changes: Sequence[str]):
    """dignn's DIGNNGraphClassifier with the authors' choices ``changes`` patched in on the
    instance (its class and dignn's files are untouched)."""
    import torch.nn.functional as F
    if "mlp-input" in changes:
        model.mlp_in = _MLPInput(model.lin_in.in_features, model.lin_in.out_features)
        del model.lin_in

        def diffusion_input(x, edge_index, m=model):
            h = m.mlp_in(x.to(m.mlp_in.a.weight.dtype))
            return m.norm_in(F.dropout(h, m.dropout, m.training))
        model.diffusion_input = diffusion_input
    if "logit-dropout" in changes:
        plain = model.forward

        def forward(*args, m=model, **kwargs):
            return F.dropout(plain(*args, **kwargs), 0.5, m.training)
        model.forward = forward
    return model


@contextlib.contextmanager
def _patched_training(changes: Sequence[str]):
    """dignn.training with the variant's model and loader (restored after)."""
    from dignn import training
    build, loader = training.build_model, training._graph_loader
    if any(c in changes for c in ("mlp-input", "logit-dropout")):
        training.build_model = lambda ds, cfg: _variant_model(build(ds, cfg), changes)
    if "no-shuffle" in changes:
        training._graph_loader = (lambda graphs, index, bs, shuffle, seed, device:
                                  loader(graphs, index, bs, False, seed, device))
    try:
        yield
    finally:
        training.build_model, training._graph_loader = build, loader


def dignn_config(name: str, which: str, args):
    """(TrainConfig, architecture changes) of dignn configuration ``which``."""
    import dignn
    if which == "preset" or which.startswith("preset+"):
        # "preset+mlp-input+...": the preset configuration with those variants applied
        cfg = dignn.preset_config(name, "neural", args.dignn_preset, **args.overrides)
        changes = which.split("+")[1:]
        if "their-budget" in changes:
            cfg = cfg.replace(max_iter=cfg.max_iter + 2, tol=0.0, solver="fixed_point")
        if "cg" in changes:
            cfg = cfg.replace(solver="cg")
        return cfg.replace(epochs=args.epochs), changes
    cfg = dignn.preset_config(name, "neural", args.dignn_preset).replace(
        **authors_hparams(name, args.epochs))
    changes = {"authors-hparams": [],
               "all": ["mlp-input", "logit-dropout", "no-shuffle", "their-budget"]
               }.get(which, [which])
    if "their-budget" in changes:
        cfg = cfg.replace(max_iter=cfg.max_iter + 2, tol=0.0)
    if "cg" in changes:
        cfg = cfg.replace(solver="cg")
    return cfg, changes


def run_dataset(name: str, args, log) -> Dict:
    import torch
    import dignn
    from dignn.training import train_graph_split
    from fidelity_common import paired
    authors = Authors(args.authors, name, args.data_root, args.variant)
    theirs_rng: Dict = {}
    with _own_rng(theirs_rng):
        data = authors.load()
    dataset_shuffled, idx_list = data[0], data[1]
    perm = dataset_shuffled.indices()
    perm = torch.as_tensor(perm if perm is not None else range(len(dataset_shuffled)))
    ours_data = dignn_folds(dignn.load_dataset(name, data_root=args.data_root), perm, idx_list,
                            args.fold_list)
    y_file = torch.cat([g.y.reshape(-1) for g in ours_data.graphs])
    y_theirs = torch.cat([dataset_shuffled[i].y.reshape(-1) for i in range(len(perm))])
    if not torch.equal(y_file[perm], y_theirs):
        raise RuntimeError("the authors' shuffled dataset and dignn's graphs do not agree")
    fold_sets = [sorted(perm[torch.as_tensor(te)].tolist()) for _, te in idx_list]
    record = {"dataset": name, "paper": PAPER[name], "protocol": PROTOCOL,
              "epochs": args.epochs, "folds": args.fold_list,
              "authors_settings": {**vars(authors.args), "source": AUTHORS_SOURCE[name],
                                   "variant": args.variant},
              "held_out_graphs": {str(k): fold_sets[k] for k in args.fold_list}}
    # their labels for stratification: dataset.data.y is the file order, not the shuffled one
    record["stratified_on"] = ("dataset.data.y (file order) while the folds index the "
                               "shuffled dataset: the folds are not stratified by the "
                               "shuffled labels (their load_data, run as it is)")
    if args.check_swap:
        check = {}
        for variant in ("theirs", "swapped"):
            state: Dict = copy.deepcopy(theirs_rng)
            with _own_rng(state):
                check[variant] = authors.fold(data, args.fold_list[0], args.check_swap, variant)
        check["max_abs_loss_diff"] = max(abs(a - b) for a, b in zip(
            check["theirs"]["train_loss_history"], check["swapped"]["train_loss_history"]))
        check["same_accuracies"] = all(
            check["theirs"][k] == check["swapped"][k]
            for k in ("test_history", "train_acc_history"))
        record["swap_check"] = {"fold": args.fold_list[0], "epochs": args.check_swap, **check}
        log(f"{name}: swap check loss diff {check['max_abs_loss_diff']:.2e}, same accuracies "
            f"{check['same_accuracies']}, ms/epoch theirs {check['theirs']['ms_per_epoch']:.0f}"
            f" swapped {check['swapped']['ms_per_epoch']:.0f}")
    if args.theirs_from:
        import json
        prev = json.loads(Path(args.theirs_from).read_text())["datasets"][name]
        if prev["theirs"]["folds"] != args.fold_list or prev["epochs"] != args.epochs or \
                prev["authors_settings"]["variant"] != args.variant:
            raise ValueError(f"--theirs-from {args.theirs_from}: its folds/epochs/variant differ")
        theirs = prev["theirs"]
        theirs["reused_from"] = args.theirs_from
        earlier = {w: c["splits"] for w, c in prev.get("dignn", {}).items()}
    else:
        theirs = {"folds": [], "test_history": [], "train_acc_history": [],
                  "train_loss_history": [], "ms_per_epoch": []}
        first = args.fold_list[0]
        if first != 0 or args.fold_list != list(range(first, first + len(args.fold_list))):
            theirs["note"] = ("folds not run as 0..k in order: each fold's initialization is "
                              "not the one of their main() run")
    configs = {}
    for which in args.config_list:
        cfg, changes = dignn_config(name, which, args)
        configs[which] = {"config": cfg.as_dict(), "changes": changes,
                          "describe": [ARCH_VARIANTS.get(c, c) for c in changes],
                          "test_history": [], "ms_per_epoch": [], "train_loss_history": [],
                          "lambda_max": []}
    for k in args.fold_list:
        if not args.theirs_from:
            with _own_rng(theirs_rng):
                r = authors.fold(data, k, args.epochs, args.variant, log)
            theirs["folds"].append(k)
            for key in ("test_history", "train_acc_history", "train_loss_history",
                        "ms_per_epoch"):
                theirs[key].append(r[key])
            log(f"{name} fold {k} theirs: max {100 * max(r['test_history']):.2f} "
                f"ms/epoch {r['ms_per_epoch']:.1f}")
        for which in args.config_list:
            cfg, changes = dignn_config(name, which, args)
            c = configs[which]
            try:
                with _own_rng({}), _patched_training(changes):
                    res = train_graph_split(ours_data, cfg, k, progress=False, device="cpu")
            except (RuntimeError, ValueError) as err:  # e.g. a non-finite input to the layer
                c.setdefault("errors", {})[str(k)] = f"{type(err).__name__}: {err}"
                res = types.SimpleNamespace(test_history=[math.nan] * args.epochs,
                                            train_loss_history=[], ms_per_epoch=math.nan,
                                            lambda_max_start=math.nan, lambda_max_end=math.nan)
                log(f"{name} fold {k} dignn {which} failed: {err}")
            c["test_history"].append(res.test_history)
            c["train_loss_history"].append(res.train_loss_history)
            c["ms_per_epoch"].append(res.ms_per_epoch)
            c["lambda_max"].append([res.lambda_max_start, res.lambda_max_end])
            log(f"{name} fold {k} dignn {which}: max {100 * max(res.test_history):.2f} "
                f"ms/epoch {res.ms_per_epoch:.1f}")
    primary = args.config_list[0]
    out = {}
    for which, c in configs.items():
        splits = build_splits(args.fold_list, c, theirs)
        out[which] = {"splits": splits, "readouts": compare(splits, paired), **c}
        if args.theirs_from:
            # this configuration against the earlier record's dignn configurations, paired
            out[which]["versus"] = {w: versus(splits, before, paired)
                                    for w, before in earlier.items()}
    record.update(
        dignn_primary=primary, splits=out[primary]["splits"],
        paired=out[primary]["readouts"]["fold_max"], readout="fold_max",
        paired_gin=out[primary]["readouts"]["gin"],
        theirs=theirs, dignn=out)
    return record


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import torch
    from fidelity_common import header, write_json
    torch.set_num_threads(args.threads)

    def log(msg):
        print(time.strftime("%H:%M:%S"), msg, flush=True)
    for name in args.dataset_list:
        rec = run_dataset(name, args, log)
        from fidelity_common import import_authors
        info = import_authors(args.authors, "graphclassification", ("models",)).info
        doc = header(SCHEMA, sys.argv if argv is None else ["bench/peers/fidelity_graph.py",
                                                            *argv], args.threads, info)
        doc["variant"] = args.variant  # the authors' side: their layer or this one swapped in
        doc["settings"] = {"epochs": args.epochs, "folds": args.fold_list,
                           "variant": args.variant, "dignn_preset": args.dignn_preset,
                           "dignn_overrides": args.overrides,
                           "dignn_configs": args.config_list}
        doc["datasets"] = {name: rec}
        path = Path(args.out.replace("{dataset}", name))
        write_json(doc, path)
        for which, c in rec["dignn"].items():
            for ro, p in c["readouts"].items():
                log(f"{name} {which} {ro}: ours {p['ours_mean']:.2f} theirs "
                    f"{p['theirs_mean']:.2f} diff {p['mean_diff']:+.2f} +- {p['se']:.2f}")
        log(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
