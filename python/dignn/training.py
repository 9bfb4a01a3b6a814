"""Training with model selection on the validation score, on any device.

Three tasks, one epoch loop and one model selection: node classification (one graph, full
batch, cross-entropy, accuracy), graph classification (mini-batches of ``config.batch_size``
graphs, cross-entropy, accuracy) and multi-label node classification across graphs (the
paper's PPI experiment, appendix table tab:tab4: mini-batches of ``config.batch_size``
training graphs, binary cross-entropy with logits over every label, micro-F1 of the
predictions logit > 0). For each split a fresh model is trained for ``config.epochs`` epochs
with Adam; after every epoch the model is evaluated and the test score at the epoch of the
best validation score is reported (ties go to the lower validation loss). ``config.patience``
optionally stops a split early. The spectral check (:mod:`dignn.spectral`) runs on the
implicit layer's input before training and after it.

Everything of a split lives on ``device``: features, edges, labels, split indices, the model,
the optimizer (fused Adam on a GPU), the evaluation and the model selection (tasks on many
graphs copy each training batch there; their evaluation batches are collated and copied once).
Nothing inside an epoch is read back to the host: the metrics of each epoch, the best
validation score and
the weights of the best epoch are kept on the device (the weights by a conditional copy), and
the host reads one small vector every ``sync_every`` epochs for the progress bar and the
patience test. The per-epoch training losses (of the training step, in training mode) are
kept there too and read once, at the end, as ``SplitResult.train_loss_history``. Selection
freezes at the epoch where patience runs out, so the result is the same as with a check after
every epoch; at most ``sync_every - 1`` epochs are trained in vain.

With a :class:`Checkpointing`, the run's state is saved every ``every`` epochs and after each
split: the model, the optimizer, the epoch, the split, the model selection's state (the best
scores, the weights of the best epoch, the metric history), the random number generators
(torch's CPU generator, the CUDA one of the device, the training batches' shuffling) and the
results of the finished splits. ``train(..., checkpoint=Checkpointing(path, every,
resume=True))`` continues from it; the per-epoch losses are then those of the uninterrupted
run, bit for bit (tested).
"""
from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from dignn_kernels.archive import load_checked

from .data import GraphDataset, InductiveDataset, NodeDataset, from_pyg, load_user_file
from .device import describe_device, resolve_device
from .files import remove_stale_temporaries, write_atomically
from .models import DIGNNGraphClassifier, DIGNNNodeClassifier
from .presets import TrainConfig, check_training_numbers
from .spectral import check_mu, estimate_lambda_max, laplacian_operator

__all__ = ["SplitResult", "RunResult", "build_model", "validate_config", "train",
           "train_node_split", "train_graph_split", "train_multilabel_split", "TASK_METRICS",
           "multilabel_counts", "micro_f1", "train_graph_data", "Checkpointing", "late_fall",
           "still_falling_note", "STILL_FALLING"]

# The per-epoch metric vector: the task's score (see TASK_METRICS) and mean loss on the
# train, validation and test sets.
_METRICS = ("train_score", "val_score", "test_score", "train_loss", "val_loss", "test_loss")

# The score each task is selected and reported on.
TASK_METRICS = {"node": "accuracy", "graph": "accuracy", "multilabel": "micro_f1"}
# How result fields and JSON keys name a metric: test_acc, test_micro_f1, ...
_METRIC_KEYS = {"accuracy": "acc", "micro_f1": "micro_f1"}

Dataset = Union[NodeDataset, GraphDataset, InductiveDataset]


def multilabel_counts(logits: Tensor, target: Tensor) -> Tensor:
    """(TP, FP, FN, TN) of the predictions ``logits > 0`` against the 0/1 ``target`` of the
    same shape, counted over every node and label, as float64 on the logits' device. Counts
    of several batches add up to the counts of their union."""
    predicted, actual = logits > 0, target > 0.5
    tp = (predicted & actual).sum()
    fp = predicted.sum() - tp
    fn = actual.sum() - tp
    return torch.stack([tp, fp, fn, actual.numel() - tp - fp - fn]).double()


def micro_f1(counts: Tensor) -> Tensor:
    """Micro-averaged F1 = 2 TP / (2 TP + FP + FN) from :func:`multilabel_counts` (the
    paper's PPI metric). Where that is 0/0 (no positive label, none predicted) it is 0, as
    scikit-learn's ``f1_score(average="micro")`` returns by default; with no entries at all
    (an empty set) NaN."""
    tp, fp, fn, tn = counts.unbind(-1)
    denominator = 2 * tp + fp + fn
    f1 = 2 * tp / denominator.clamp_min(1)
    return torch.where(denominator + tn > 0, f1, torch.full_like(f1, math.nan))


@dataclass
class SplitResult:
    """One split's result. ``test_acc``, ``val_acc``, ``train_acc``, ``test_acc_max`` and the
    histories hold the split's score, named by ``metric``: accuracy, or micro-F1 for the
    multi-label task (the field names are kept for every task)."""

    split: int
    test_acc: float
    val_acc: float
    best_epoch: int
    epochs_run: int
    seconds: float
    lambda_max_start: float
    lambda_max_end: float
    train_acc: float = float("nan")
    train_loss: float = float("nan")  # eval-mode losses at the selected epoch
    test_loss: float = float("nan")
    # The highest test accuracy of any epoch: test-set selection, NOT a valid estimate; only
    # to compare with papers that report it (the DIGNN authors' graph classification code
    # averages the per-fold maximum over epochs).
    test_acc_max: float = float("nan")
    val_history: List[float] = field(default_factory=list, repr=False)  # per epoch
    test_history: List[float] = field(default_factory=list, repr=False)
    # the training step's loss (training mode: dropout on) of every epoch, 1 to epochs_run
    train_loss_history: List[float] = field(default_factory=list, repr=False)
    model: Optional[torch.nn.Module] = field(default=None, repr=False)  # keep_model=True
    ms_per_epoch: float = float("nan")  # wall time of the epoch loop / epochs trained
    backend: Optional[str] = None  # the implicit layer's backend that ran
    metric: str = "accuracy"  # what the scores are: "accuracy" or "micro_f1"


@dataclass
class RunResult:
    """The splits' results; ``test_acc``, ``mean`` and ``std`` are of ``metric``.

    Args:
        dataset: the dataset's name.
        laplacian: the config's Laplacian.
        config: the :class:`~dignn.presets.TrainConfig` trained.
        splits: one :class:`SplitResult` per split trained, in order.
        environment: device, device name, torch and CUDA versions, threads, compiled.
        metric: ``"accuracy"`` or ``"micro_f1"`` (:data:`TASK_METRICS` of the task).

    Example:
        >>> from dignn import load_dataset, preset_config, train
        >>> data = load_dataset("csbm", num_nodes=40, num_splits=2)
        >>> config = preset_config("csbm", epochs=2, hidden=8)
        >>> run = train(data, config, splits=[0, 1], progress=False, device="cpu")
        >>> len(run.test_acc), run.metric, 0.0 <= run.mean <= 1.0
        (2, 'accuracy', True)
        >>> sorted(run.to_json())[:3]
        ['backend', 'best_epoch', 'compiled']
    """

    dataset: str
    laplacian: str
    config: TrainConfig
    splits: List[SplitResult] = field(default_factory=list)
    environment: Dict = field(default_factory=dict)  # device, device_name, torch, cuda, ...
    metric: str = "accuracy"  # "accuracy" or "micro_f1" (TASK_METRICS of the dataset's task)

    @property
    def test_acc(self) -> List[float]:
        """Each split's test score (at its epoch of the best validation score)."""
        return [s.test_acc for s in self.splits]

    @property
    def mean(self) -> float:
        """The mean test score over the splits (NaN for none)."""
        accs = self.test_acc
        return sum(accs) / len(accs) if accs else float("nan")

    @property
    def std(self) -> float:
        """Sample standard deviation over the splits (0 for a single split)."""
        accs = self.test_acc
        if len(accs) < 2:
            return 0.0
        m = self.mean
        return math.sqrt(sum((a - m) ** 2 for a in accs) / (len(accs) - 1))

    @property
    def ms_per_epoch(self) -> float:
        """Mean wall time of an epoch (training step + evaluation) over the splits."""
        times = [s.ms_per_epoch for s in self.splits]
        return sum(times) / len(times) if times else float("nan")

    def to_json(self) -> Dict:
        """The record ``dignn train --json`` writes. Scores are named by the metric:
        ``test_acc``/``val_acc`` for accuracy, ``test_micro_f1``/``val_micro_f1`` for
        micro-F1; ``metric`` says which, ``mean`` and ``std`` are of it."""
        key = _METRIC_KEYS[self.metric]
        return {
            "dataset": self.dataset,
            "laplacian": self.laplacian,
            "metric": self.metric,
            f"test_{key}": self.test_acc,
            "mean": self.mean,
            "std": self.std,
            "splits": [s.split for s in self.splits],
            f"val_{key}": [s.val_acc for s in self.splits],
            "best_epoch": [s.best_epoch for s in self.splits],
            "seconds": [round(s.seconds, 2) for s in self.splits],
            "ms_per_epoch": round(self.ms_per_epoch, 3),
            "ms_per_epoch_per_split": [round(s.ms_per_epoch, 3) for s in self.splits],
            "backend": sorted({s.backend for s in self.splits if s.backend}),
            **self.environment,
            "lambda_max": [[s.lambda_max_start, s.lambda_max_end] for s in self.splits],
            f"test_{key}_max_over_epochs": [s.test_acc_max for s in self.splits],
            "train_loss_history": [s.train_loss_history for s in self.splits],
            "config": self.config.as_dict(),
        }


# A split ends "with its training loss still falling fast" when, of the whole fall of its
# training loss (from its first epochs to its last), more than this share came in the last
# quarter of its epochs: a loss near its floor falls almost nothing there (the default CSBM
# run: -7% to 6% on its 10 splits; Cora's tuned preset cut at 100 epochs: 2-5%), one stopped
# early still falls (`--epochs 20`: 12-13% on Cora's splits 0-2, above 10% on 6 of CSBM's 10
# splits; a straight line: 28%).
STILL_FALLING = 0.1


def late_fall(history: Sequence[float]) -> float:
    """The share of a split's training-loss fall that came in its last quarter of epochs:
    (L(3/4) - L(end)) / (L(start) - L(end)), each L the mean over a tenth of the epochs (at
    least one) at that point, so that dropout's epoch-to-epoch noise averages out. NaN for
    fewer than 8 epochs, a loss that did not fall, or a non-finite one.

    Example:
        >>> from dignn.training import late_fall
        >>> round(late_fall([2.0 - 0.05 * t for t in range(20)]), 2)  # a straight line
        0.28
        >>> round(late_fall([1.0 + 0.5 ** t for t in range(40)]), 2)  # at its floor
        0.0
    """
    h = [float(v) for v in history]
    n = len(h)
    if n < 8 or not all(math.isfinite(v) for v in h):
        return math.nan
    w = max(1, n // 10)

    def mean(end: int) -> float:
        return sum(h[end - w:end]) / w
    start, quarter, end = mean(w), mean(n - n // 4), mean(n)
    if not start > end:
        return math.nan
    return (quarter - end) / (start - end)


def still_falling_note(run: "RunResult") -> Optional[str]:
    """The note a run ends with when the training loss of at least half of its splits that
    trained every epoch (not stopped by patience) was still falling fast at the end
    (:func:`late_fall` above :data:`STILL_FALLING`): the model is likely far from fitted. None
    otherwise."""
    epochs = run.config.epochs
    full = [s for s in run.splits if s.epochs_run >= epochs and s.train_loss_history]
    falls = [(late_fall(s.train_loss_history), s) for s in full]
    falling = [(f, s) for f, s in falls if f > STILL_FALLING]
    if not falling or 2 * len(falling) < len(full):
        return None
    share, split = max(falling, key=lambda fs: fs[0])
    h = split.train_loss_history
    unit = "split" if len(full) == 1 else f"{len(falling)} of {len(full)} splits, most on split"
    return (f"note: the training loss was still falling fast when training stopped after "
            f"{epochs} epochs: {100 * share:.0f}% of its fall came in the last quarter of the "
            f"epochs ({unit} {split.split}: {h[0]:.3f} at epoch 1, {h[-1]:.3f} at epoch "
            f"{len(h)}), so the model is likely far from fitted; more epochs (e.g. --epochs "
            f"{2 * epochs}) may well raise the accuracy")


def validate_config(dataset: Dataset, config: TrainConfig) -> None:
    """Refuses a config that could not train on ``dataset``, before any training: the
    optimizer's and the loop's numbers here, the model's own checks (widths, dropout, mu,
    solver, backend, ...) by building it."""
    check_training_numbers(config)
    build_model(dataset, config)


def build_model(dataset: Dataset, config: TrainConfig):
    """The model for ``dataset`` under ``config``. With ``config.spectral_norm`` the neural
    Laplacian's Θχ and Θφ are spectrally normalized (||Θ||_2 = 1, as in the paper's mu
    study), which bounds lambda_max (Theorem "Spectral Range of Delta_Phi"). The multi-label
    task across graphs takes the ``mlp`` input unit only (appendix "Model architectures": a
    1-layer MLP for node classification on homophilic graphs, PPI included)."""
    if config.dtype not in ("float32", "float64"):
        raise ValueError(f"dtype must be 'float32' or 'float64', got {config.dtype!r}")
    common = dict(laplacian=config.laplacian, mu=config.mu, max_iter=config.max_iter,
                  tol=config.tol, dropout=config.dropout, backend=config.backend,
                  solver=config.solver, storage_dtype=config.storage_dtype,
                  reorder=config.reorder)
    if dataset.task == "graph":
        model = DIGNNGraphClassifier(dataset.num_features, config.hidden,
                                     dataset.num_classes, pooling=config.pooling,
                                     node_layers=config.node_layers,
                                     graph_layers=config.graph_layers, **common)
    else:
        if dataset.task == "multilabel" and config.input_unit != "mlp":
            raise ValueError(f"input_unit={config.input_unit!r} cannot train on "
                             f"{dataset.name}, whose test graphs are not its training graphs: "
                             f"'linkx' learns one weight row per node of a single graph and "
                             f"'adj' is not supported on batches of graphs; use "
                             f"input_unit='mlp' (--input-unit mlp)")
        model = DIGNNNodeClassifier(dataset.num_features, config.hidden, dataset.num_classes,
                                    input_unit=config.input_unit, adj_norm=config.adj_norm,
                                    num_nodes=(dataset.num_nodes if dataset.task == "node"
                                               else None),
                                    input_dropout=config.input_dropout,
                                    # one graph for the whole run (PyG's cached=True); the
                                    # multi-label task's graphs change batch to batch
                                    cached=dataset.task == "node", **common)
    if config.spectral_norm:
        if config.laplacian != "neural":
            raise ValueError("spectral_norm applies to the neural Laplacian's Θχ and Θφ; "
                             "use it with laplacian='neural'")
        from torch.nn.utils.parametrizations import spectral_norm
        spectral_norm(model.diffusion.theta_chi)
        spectral_norm(model.diffusion.theta_phi)
    return model.to(getattr(torch, config.dtype))


@dataclass
class Checkpointing:
    """Where a run saves its state (``path``, one file, replaced atomically), how often
    (``every`` epochs within a split; a split's end is always saved), and whether to continue
    from that file (``resume``: it must exist and be of the same dataset, configuration and
    splits). ``write=False`` only reads (the ranks other than 0 of a distributed run, whose
    state is rank 0's)."""

    path: Union[str, os.PathLike]
    every: int = 10
    resume: bool = False
    write: bool = True

    def __post_init__(self):
        if not isinstance(self.path, (str, os.PathLike)) or not os.fspath(self.path):
            raise ValueError(f"checkpoint path must be a file path, got {self.path!r}")
        self.path = Path(self.path).expanduser()
        if isinstance(self.every, bool) or not isinstance(self.every, int) or self.every < 1:
            raise ValueError(f"checkpoint every must be a positive number of epochs, got "
                             f"{self.every!r}")
        if self.path.is_dir():
            raise ValueError(f"checkpoint path {str(self.path)!r} is a folder; give a file "
                             f"path (--checkpoint), e.g. {str(self.path / 'run.ckpt')!r}")


_CHECKPOINT_FORMAT = 1


def _rng_states(device: torch.device, generator: Optional[torch.Generator]) -> Dict:
    """The random number generators an epoch draws from: torch's CPU generator, the CUDA
    generator of ``device`` (dropout there) and ``generator`` (the shuffling of batches)."""
    states = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        states["cuda"] = torch.cuda.get_rng_state(device)
    if generator is not None:
        states["batches"] = generator.get_state()
    return states


def _set_rng_states(states: Dict, device: torch.device,
                    generator: Optional[torch.Generator]) -> None:
    torch.set_rng_state(states["cpu"])
    if device.type == "cuda":
        if "cuda" not in states:
            raise ValueError("the checkpoint was saved by a run on the CPU; its dropout draws "
                             "cannot continue on a GPU: resume with --device cpu")
        torch.cuda.set_rng_state(states["cuda"], device)
    if generator is not None:
        generator.set_state(states["batches"])


def _result_state(result: "SplitResult") -> Dict:
    return {f.name: getattr(result, f.name) for f in dataclasses.fields(result)
            if f.name != "model"}


def _save_with_checksums(state, f) -> None:
    """torch.save with CRC-32s of every record (whatever torch's global option says), which
    :func:`~dignn_kernels.archive.archive_damage` compares when resuming."""
    crc = torch.serialization.get_crc32_options()
    torch.serialization.set_crc32_options(True)
    try:
        torch.save(state, f)
    finally:
        torch.serialization.set_crc32_options(crc)


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [""])[0][:200]


def _damaged(path, why: str) -> ValueError:
    return ValueError(f"the checkpoint {path} cannot be resumed from: {why}; it is damaged "
                      f"(a truncated or altered file) or not written by dignn train: start "
                      f"anew without resume (--resume), or give another checkpoint path "
                      f"(--checkpoint)")


def _plain_equal(a, b) -> bool:
    """``a == b`` for the plain values of a run's identity (dicts, lists, numbers, strings);
    False where either holds something else (a tensor, whose == would not be a bool)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_plain_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_plain_equal(x, y) for x, y in zip(a, b))
    plain = (str, int, float, bool, type(None))
    return isinstance(a, plain) and isinstance(b, plain) and a == b


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _same_kind(saved, live) -> bool:
    """Whether an optimizer setting of a checkpoint is of the kind this run's is (a number
    for a number, a pair of numbers for a pair, ...)."""
    if _is_number(live) or (isinstance(live, Tensor) and live.dim() == 0):
        return _is_number(saved) or (isinstance(saved, Tensor) and saved.dim() == 0)
    if isinstance(live, (list, tuple)):
        return isinstance(saved, (list, tuple)) and len(saved) == len(live) and \
            all(_same_kind(a, b) for a, b in zip(saved, live))
    return type(saved) is type(live)


# The fields of a finished split's SplitResult in a checkpoint, and what each must be.
_RESULT_FIELDS = {
    "split": _is_int, "best_epoch": _is_int, "epochs_run": _is_int,
    **{name: _is_number for name in ("test_acc", "val_acc", "seconds", "lambda_max_start",
                                     "lambda_max_end", "train_acc", "train_loss", "test_loss",
                                     "test_acc_max", "ms_per_epoch")},
    **{name: (lambda v: isinstance(v, list) and all(_is_number(x) for x in v))
       for name in ("val_history", "test_history", "train_loss_history")},
    "backend": lambda v: v is None or isinstance(v, str),
    "metric": lambda v: v in _METRIC_KEYS,
}


def _checked_finished(finished, identity: Dict, path) -> List[Dict]:
    """The finished splits' results of a checkpoint, every field checked."""
    if not isinstance(finished, list):
        raise _damaged(path, f"'finished' must be a list of split results, got "
                             f"{type(finished).__name__}")
    seen = set()
    for k, entry in enumerate(finished):
        if not isinstance(entry, dict) or set(entry) != set(_RESULT_FIELDS):
            got = sorted(entry) if isinstance(entry, dict) else type(entry).__name__
            raise _damaged(path, f"finished split result {k} must have the fields "
                                 f"{sorted(_RESULT_FIELDS)}, got {got}")
        bad = [name for name, ok in _RESULT_FIELDS.items() if not ok(entry[name])]
        if bad:
            raise _damaged(path, f"finished split result {k} has bad {', '.join(bad)} "
                                 f"({', '.join(f'{n}={entry[n]!r:.40}' for n in bad)})")
        if entry["split"] not in identity["splits"] or entry["split"] in seen:
            raise _damaged(path, f"finished split result {k} is of split {entry['split']}, "
                                 f"not one of this run's splits {identity['splits']} (or "
                                 f"listed twice)")
        if entry["metric"] != TASK_METRICS[identity["task"]]:
            raise _damaged(path, f"finished split result {k} is scored by "
                                 f"{entry['metric']!r}, this task by "
                                 f"{TASK_METRICS[identity['task']]!r}")
        seen.add(entry["split"])
    return finished


def _checked_current(current, identity: Dict, finished: List[Dict], path) -> Optional[Dict]:
    """The state within a split of a checkpoint (None: between splits), its structure
    checked; :func:`_check_split_fits` checks it against the model when it is restored."""
    if current is None:
        return None
    keys = {"split", "epoch", "seconds", "model", "optimizer", "selector", "rng"}
    if not isinstance(current, dict) or set(current) != keys:
        got = sorted(current) if isinstance(current, dict) else type(current).__name__
        raise _damaged(path, f"the state within a split must have the fields {sorted(keys)}, "
                             f"got {got}")
    split, epoch, seconds = current["split"], current["epoch"], current["seconds"]
    epochs = identity["config"].get("epochs")
    if not _is_int(split) or split not in identity["splits"] or \
            any(f["split"] == split for f in finished):
        raise _damaged(path, f"the state within a split is of split {split!r}, not an "
                             f"unfinished split of this run ({identity['splits']})")
    if not _is_int(epoch) or not 1 <= epoch < (epochs if _is_int(epochs) else 2**62):
        raise _damaged(path, f"the state within split {split} is at epoch {epoch!r}, outside "
                             f"1..{epochs - 1 if _is_int(epochs) else 'epochs - 1'}")
    if not _is_number(seconds) or not math.isfinite(seconds) or seconds < 0:
        raise _damaged(path, f"the state within split {split} has {seconds!r} seconds")
    model = current["model"]
    if not isinstance(model, dict) or not all(isinstance(k, str) and isinstance(v, Tensor)
                                              for k, v in model.items()):
        raise _damaged(path, "the model state must map parameter names to tensors")
    opt = current["optimizer"]
    if not isinstance(opt, dict) or not isinstance(opt.get("state"), dict) or \
            not isinstance(opt.get("param_groups"), list):
        raise _damaged(path, "the optimizer state must hold 'state' and 'param_groups'")
    sel = current["selector"]
    tensors = ("best", "best_test", "best_epoch", "stopped_at")
    if not isinstance(sel, dict) or set(sel) != set(tensors) | {"saved", "rows"} or \
            not all(isinstance(sel[k], Tensor) for k in tensors) or \
            not isinstance(sel["saved"], list) or \
            not all(isinstance(t, Tensor) for t in sel["saved"]) or \
            not (sel["rows"] is None or isinstance(sel["rows"], Tensor)):
        raise _damaged(path, "the model selection's state must hold the tensors "
                             f"{', '.join(tensors)}, the list 'saved' and 'rows'")
    rng = current["rng"]
    if not isinstance(rng, dict) or "cpu" not in rng or set(rng) - {"cpu", "cuda", "batches"} \
            or not all(isinstance(v, Tensor) and v.dtype == torch.uint8 and v.dim() == 1
                       for v in rng.values()):
        raise _damaged(path, "the random generators' states must be byte tensors 'cpu' "
                             "(and 'cuda', 'batches')")
    return current


def _check_split_fits(state: Dict, model, opt, sel: "_Selector", device: torch.device,
                      generator: Optional[torch.Generator], path) -> None:
    """Refuses a split's saved state that does not fit this run's model, optimizer, model
    selection and generators (a shape, a dtype, a count), before any of it is loaded: a
    mismatch would otherwise fail later or, broadcast by a copy, go unnoticed."""
    def same(what: str, saved: Tensor, live: Tensor) -> None:
        if saved.shape != live.shape or saved.dtype != live.dtype:
            raise _damaged(path, f"{what} is {saved.dtype} {list(saved.shape)}, this run's "
                                 f"{live.dtype} {list(live.shape)}")

    live = model.state_dict()
    saved = state["model"]
    if list(saved) != list(live):
        missing = sorted(set(live) - set(saved))[:3]
        extra = sorted(set(saved) - set(live))[:3]
        raise _damaged(path, f"its model state does not fit this run's model (missing "
                             f"{missing}, unexpected {extra})")
    for name, tensor in saved.items():
        same(f"the model's {name!r}", tensor, live[name])
    params = [p for group in opt.param_groups for p in group["params"]]
    groups, live_groups = state["optimizer"]["param_groups"], opt.state_dict()["param_groups"]
    if len(groups) != len(live_groups):
        raise _damaged(path, f"its optimizer has {len(groups)} parameter groups, this run's "
                             f"{len(live_groups)}")
    for k, (group, live_group) in enumerate(zip(groups, live_groups)):
        if not isinstance(group, dict) or set(group) != set(live_group):
            raise _damaged(path, f"its optimizer's parameter group {k} does not have the "
                                 f"settings of this run's ({sorted(live_group)})")
        odd = [key for key, value in group.items() if not _same_kind(value, live_group[key])]
        if odd or len(group["params"]) != len(live_group["params"]):
            raise _damaged(path, f"its optimizer's parameter group {k} has settings of the "
                                 f"wrong kind ({', '.join(odd) or 'params'})")
    for index, entry in state["optimizer"]["state"].items():
        if not _is_int(index) or not 0 <= index < len(params) or not isinstance(entry, dict):
            raise _damaged(path, f"its optimizer state names parameter {index!r} of "
                                 f"{len(params)}")
        for key, value in entry.items():
            if not isinstance(value, Tensor):
                raise _damaged(path, f"its optimizer's {key!r} of parameter {index} is a "
                                     f"{type(value).__name__}, not a tensor")
            if value.dim() > 0 and value.shape != params[index].shape:
                raise _damaged(path, f"its optimizer's {key!r} of parameter {index} has shape "
                                     f"{list(value.shape)}, the parameter "
                                     f"{list(params[index].shape)}")
    ours = sel.state_dict()
    for name in ("best", "best_test", "best_epoch", "stopped_at"):
        same(f"the model selection's {name!r}", state["selector"][name], ours[name])
    if len(state["selector"]["saved"]) != len(ours["saved"]):
        raise _damaged(path, f"the model selection keeps {len(state['selector']['saved'])} "
                             f"weights, this run's model {len(ours['saved'])}")
    for k, (tensor, live_tensor) in enumerate(zip(state["selector"]["saved"], ours["saved"])):
        same(f"the model selection's weight {k}", tensor, live_tensor)
    rows = state["selector"]["rows"]
    if rows is None or rows.dim() != 2 or rows.shape != (state["epoch"], len(_METRICS) + 1) \
            or rows.dtype != torch.float64:
        got = None if rows is None else f"{rows.dtype} {list(rows.shape)}"
        raise _damaged(path, f"the model selection's history is {got}, not float64 "
                             f"[{state['epoch']}, {len(_METRICS) + 1}] (one row per epoch)")
    best_epoch = int(state["selector"]["best_epoch"])
    if not 0 <= best_epoch <= state["epoch"]:
        raise _damaged(path, f"the best epoch {best_epoch} is outside 0..{state['epoch']}")
    rng = state["rng"]
    expected = {"cpu": torch.get_rng_state()}
    if device.type == "cuda" and "cuda" in rng:
        expected["cuda"] = torch.cuda.get_rng_state(device)
    if generator is not None:
        if "batches" not in rng:
            raise _damaged(path, "it has no state of the training batches' shuffling")
        expected["batches"] = generator.get_state()
    for name, value in expected.items():
        if rng[name].numel() != value.numel():
            raise _damaged(path, f"the {name} generator's state has {rng[name].numel()} "
                                 f"bytes, not {value.numel()}")


class _RunCheckpoint:
    """A run's checkpoint: the finished splits' results and, within a split, its state; read
    once when resuming, written (atomically: a temporary file renamed over the old one) every
    few epochs and after each split."""

    def __init__(self, settings: Checkpointing, identity: Dict):
        self.settings = settings
        self.identity = identity
        self.finished: List[Dict] = []
        self.current: Optional[Dict] = None  # the state within the split being trained
        if settings.resume:
            self._load()
        if settings.write:  # what a killed run left half-written
            remove_stale_temporaries(settings.path)

    def _load(self) -> None:
        path = self.settings.path
        if not path.is_file():
            raise ValueError(f"resume: no checkpoint at {path}; start without resume "
                             f"(--resume) to write one there")
        state = load_checked(path, lambda why: _damaged(path, why), map_location="cpu")
        if not isinstance(state, dict) or state.get("format") != _CHECKPOINT_FORMAT:
            raise ValueError(f"{path} is not a dignn checkpoint of format "
                             f"{_CHECKPOINT_FORMAT}; start anew without resume (--resume), "
                             f"or give another checkpoint path (--checkpoint)")
        theirs = state.get("identity")
        if not isinstance(theirs, dict):
            raise _damaged(path, "it has no run identity (dataset, settings, splits)")
        differs = [key for key in self.identity
                   if not _plain_equal(theirs.get(key), self.identity[key])]
        if differs:
            detail = "; ".join(f"{key}: checkpoint {theirs.get(key)!r}, now "
                               f"{self.identity[key]!r}" for key in differs)
            raise ValueError(f"the checkpoint {path} is of another run ({detail}); resume "
                             f"with the same dataset, settings and splits, or start anew "
                             f"without resume")
        self.finished = _checked_finished(state.get("finished"), self.identity, path)
        self.current = _checked_current(state.get("current"), self.identity, self.finished,
                                        path)

    def finished_result(self, split: int) -> Optional["SplitResult"]:
        for state in self.finished:
            if state["split"] == split:
                return SplitResult(**state)
        return None

    def split_state(self, split: int) -> Optional[Dict]:
        return self.current if self.current and self.current["split"] == split else None

    def finish_split(self, result: "SplitResult") -> None:
        self.finished.append(_result_state(result))
        self.current = None
        self.write()

    def write(self) -> None:
        if not self.settings.write:
            return
        state = {"format": _CHECKPOINT_FORMAT, "identity": self.identity,
                 "finished": self.finished, "current": self.current}
        write_atomically(self.settings.path, lambda f: _save_with_checksums(state, f),
                         sync=True)


class _SplitSaver:
    """Checkpoints of one split: restores the split's saved state (when resuming) into the
    model, optimizer, selection and generators, and saves them every ``every`` epochs."""

    def __init__(self, run: _RunCheckpoint, split: int, model, opt, sel: _Selector,
                 device: torch.device, generator: Optional[torch.Generator] = None):
        self.run, self.split, self.model, self.opt, self.sel = run, split, model, opt, sel
        self.device, self.generator = device, generator
        self.epoch, self.seconds = 0, 0.0
        state = run.split_state(split)
        if state is not None:
            _check_split_fits(state, model, opt, sel, device, generator, run.settings.path)
            model.load_state_dict(state["model"])
            try:
                opt.load_state_dict(state["optimizer"])
            except (ValueError, KeyError, TypeError, RuntimeError) as err:
                raise _damaged(run.settings.path, f"its optimizer state does not fit this "
                                                  f"run's model ({_first_line(err)})") from None
            sel.load_state_dict(state["selector"])
            _set_rng_states(state["rng"], device, generator)
            self.epoch, self.seconds = state["epoch"], state["seconds"]

    def resume_point(self):
        """(the first epoch to train, the seconds trained before it)."""
        return self.epoch + 1, self.seconds

    def due(self, epoch: int) -> bool:
        return epoch % self.run.settings.every == 0

    def save(self, epoch: int, seconds: float) -> None:
        self.run.current = {"split": self.split, "epoch": epoch, "seconds": seconds,
                            "model": self.model.state_dict(),
                            "optimizer": self.opt.state_dict(),
                            "selector": self.sel.state_dict(),
                            "rng": _rng_states(self.device, self.generator)}
        self.run.write()


def _progress(total: int, desc: str, enabled: bool):
    if not enabled:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover - tqdm is a dependency
        return None
    return tqdm(total=total, desc=desc, leave=True, file=sys.stderr, dynamic_ncols=True)


class _Selector:
    """Model selection kept on the device: per epoch one metric vector (see ``_METRICS``) and
    the training step's loss are appended, the best (val score, val loss), its epoch and test
    score are updated with ``torch.where``, and so are copies of the weights of the best
    epoch. The host reads
    nothing until :meth:`poll` (every few epochs) and :meth:`result` (once, at the end).
    ``metric`` names the score (:data:`TASK_METRICS`)."""

    def __init__(self, model: torch.nn.Module, device: torch.device,
                 patience: Optional[int], metric: str = "accuracy"):
        self.model = model
        self.metric = metric
        self.keys = list(model.state_dict().keys())
        self.live = list(model.state_dict().values())  # share storage with the model
        self.saved = [t.detach().clone() for t in self.live]
        f64 = dict(dtype=torch.float64, device=device)
        self.best = torch.tensor([-1.0, math.inf], **f64)  # (val score, val loss)
        self.best_test = torch.full((), math.nan, **f64)
        self.best_epoch = torch.zeros((), dtype=torch.long, device=device)
        self.stopped_at = torch.zeros((), dtype=torch.long, device=device)  # 0: running
        self.patience = patience
        self.rows: List[Tensor] = []

    @torch.no_grad()
    def update(self, epoch: int, metrics: Tensor, train_loss: Tensor) -> None:
        val = metrics[1:5:3]  # (val score, val loss)
        improved = (val[0] > self.best[0]) | ((val[0] == self.best[0]) &
                                              (val[1] < self.best[1]))
        improved &= self.stopped_at == 0
        self.best = torch.where(improved, val, self.best)
        self.best_test = torch.where(improved, metrics[2], self.best_test)
        self.best_epoch = torch.where(improved, epoch, self.best_epoch)
        for saved, live in zip(self.saved, self.live):
            torch.where(improved, live, saved, out=saved)
        if self.patience is not None:
            out_of_patience = (self.stopped_at == 0) & (epoch - self.best_epoch >=
                                                        self.patience)
            self.stopped_at = torch.where(out_of_patience, epoch, self.stopped_at)
        self.rows.append(torch.cat([metrics, train_loss.detach().double().reshape(1)]))

    def poll(self, train_loss: Tensor, extra: Optional[Tensor] = None):
        """One host read: [training loss, best val score, its test score, stopped-at
        epoch]; with ``extra`` (a float64 vector on the device, e.g. the rows of an epoch
        log) read in the same copy: (those four, ``extra``'s values)."""
        polled = torch.stack([train_loss.detach().double().reshape(()), self.best[0],
                              self.best_test, self.stopped_at.double()])
        if extra is None:
            return polled.tolist()
        values = torch.cat([polled, extra.reshape(-1)]).tolist()
        return values[:4], values[4:]

    def result(self, split: int, seconds: float, epochs_trained: int, lam_start: float,
               lam_end: float) -> SplitResult:
        history = torch.stack(self.rows).cpu() if self.rows else torch.empty(0, 7)
        best, stopped = int(self.best_epoch), int(self.stopped_at)
        epochs_run = stopped or history.size(0)
        history = history[:epochs_run]
        row = history[best - 1].tolist() if best > 0 else [math.nan] * 6
        test = history[:, 2]
        finite = test[~torch.isnan(test)]
        return SplitResult(split, row[2], row[1], best, epochs_run, seconds, lam_start,
                           lam_end, train_acc=row[0], train_loss=row[3], test_loss=row[5],
                           test_acc_max=float(finite.max()) if finite.numel() else math.nan,
                           val_history=history[:, 1].tolist(),
                           test_history=test.tolist(),
                           train_loss_history=history[:, 6].tolist(),
                           ms_per_epoch=1000.0 * seconds / max(epochs_trained, 1),
                           metric=self.metric)

    def state_dict(self) -> Dict:
        """What :meth:`load_state_dict` needs to continue the selection (for checkpoints)."""
        return {"best": self.best, "best_test": self.best_test,
                "best_epoch": self.best_epoch, "stopped_at": self.stopped_at,
                "saved": list(self.saved),
                "rows": torch.stack(self.rows) if self.rows else None}

    def load_state_dict(self, state: Dict) -> None:
        for name in ("best", "best_test", "best_epoch", "stopped_at"):
            setattr(self, name, state[name].to(getattr(self, name).device))
        for saved, value in zip(self.saved, state["saved"]):
            saved.copy_(value)
        rows = state["rows"]
        self.rows = [] if rows is None else list(rows.to(self.best.device).unbind(0))

    def restore(self) -> None:
        """Loads the selected epoch's weights back into the model."""
        if int(self.best_epoch) > 0:
            self.model.load_state_dict(dict(zip(self.keys, self.saved)))


class _NodeSets:
    """The train, validation and test nodes of a split as one index vector, so that an
    epoch's six metrics take a handful of kernels and no host read. ``sizes``: the sets'
    sizes to divide by (default: of ``split``; across processes, the global sizes, while
    ``split`` holds this rank's nodes)."""

    def __init__(self, split, sizes: Optional[Sequence[int]] = None):
        parts = (split.train, split.val, split.test)
        self.index = torch.cat(parts)
        self.local_sizes = [t.numel() for t in parts]
        self.divisors = torch.tensor(list(sizes) if sizes is not None else self.local_sizes,
                                     dtype=torch.float64).to(self.index.device).unsqueeze(1)

    def sums(self, logits: Tensor, y: Tensor) -> Tensor:
        """[3, 2]: (correct predictions, loss sum) of the train, validation and test set."""
        logits, y = logits[self.index], y[self.index]
        loss = F.cross_entropy(logits, y, reduction="none").double()
        correct = (logits.argmax(dim=1) == y).double()
        return torch.stack([part.sum(0) for part in
                            torch.stack([correct, loss], dim=1).split(self.local_sizes)])

    def means(self, sums: Tensor) -> Tensor:
        """The metric vector (see ``_METRICS``) of :meth:`sums`; 0/0 = NaN for an empty
        set."""
        return (sums / self.divisors).t().reshape(6)

    def metrics(self, logits: Tensor, y: Tensor) -> Tensor:
        return self.means(self.sums(logits, y))


def _split_setup(dataset, config: TrainConfig, split: int, device: torch.device,
                 compile_model: bool, prepare: Optional[Callable] = None):
    """A fresh model seeded with ``config.seed + split`` on ``device`` (passed through
    ``prepare`` when given, before the optimizer sees its parameters) and its Adam optimizer
    (fused on a GPU); the model's forward compiled when asked."""
    torch.manual_seed(config.seed + split)
    model = build_model(dataset, config).to(device)
    if prepare is not None:
        model = prepare(model)
    opt = torch.optim.Adam(model.parameters(), lr=config.lr, weight_decay=config.weight_decay,
                           fused=device.type == "cuda" or None)
    if compile_model:
        model.compile()
    return model, opt


def _check_sync_every(sync_every: int) -> None:
    if isinstance(sync_every, bool) or not isinstance(sync_every, int) or sync_every < 1:
        raise ValueError(f"sync_every must be a positive integer, got {sync_every!r}")


class _EpochRecorder:
    """The per-epoch rows of a :class:`dignn.logs.SplitLog`, kept on the device until the
    loop's host reads: the model selection's metric rows (``_Selector.rows``), the implicit
    layer's forward iterations in each epoch's training step (a forward hook that keeps the
    layer's stats tensor, unread) and the host's epoch times. :meth:`pending` is what the next
    poll reads with its own values; :meth:`flush` writes the rows from what it read."""

    def __init__(self, log, model, sel: _Selector, device: torch.device):
        self.log, self.sel, self.device = log, sel, device
        self.written = 0  # rows of sel.rows already in the log
        self.iterations: Dict[int, Tensor] = {}  # epoch -> float64 scalar on the device
        self.seconds: Dict[int, float] = {}  # epoch -> host wall time of the epoch
        self.block: List[int] = []  # the epochs trained since the last flush
        self.block_start: Optional[float] = None
        self.solves: List[Tensor] = []
        self.nan = torch.full((), math.nan, dtype=torch.float64, device=device)
        layer = getattr(model, "diffusion", None)
        self.hook = None if layer is None else layer.register_forward_hook(self._forward)

    def _forward(self, layer, args, out) -> None:
        stats = getattr(layer, "_stats", None)
        if layer.training and isinstance(stats, Tensor) and stats.numel() > 0:
            self.solves.append(stats.reshape(-1)[0])

    def epoch_done(self, epoch: int, start: float, end: float) -> None:
        if self.solves:
            its = torch.stack([s.to(self.device, torch.float64) for s in self.solves]).mean()
        else:
            its = self.nan
        self.solves = []
        self.iterations[epoch] = its
        self.seconds[epoch] = end - start
        if self.block_start is None:
            self.block_start = start
        self.block.append(epoch)

    def pending(self) -> Tensor:
        """The rows not yet written (7 values each), then their iterations: one float64
        vector on the device."""
        rows = self.sel.rows[self.written:]
        if not rows:
            return self.nan.reshape(0)
        epochs = range(self.written + 1, len(self.sel.rows) + 1)
        its = [self.iterations.get(e, self.nan) for e in epochs]
        return torch.cat([torch.stack(rows).reshape(-1), torch.stack(its)])

    def flush(self, values: List[float], stopped: int) -> None:
        """Writes the rows of ``values`` (what :meth:`pending` held, as read), up to the
        epoch ``stopped`` at when patience ran out (0: all)."""
        width = len(_METRICS) + 1
        count = len(values) // (width + 1)
        first = self.written + 1
        if self.device.type == "cuda" and self.block:  # the host waited only at the read
            mean = (time.perf_counter() - self.block_start) / len(self.block)
            times = {e: mean for e in self.block}
        else:
            times = self.seconds
        rows = []
        for k in range(count):
            epoch = first + k
            if stopped and epoch > stopped:
                break
            r = values[k * width:(k + 1) * width]
            its = values[count * width + k]
            seconds = times.get(epoch)
            rows.append({"epoch": epoch, "train_loss": r[6], "train_acc": r[0],
                         "val_loss": r[4], "val_acc": r[1], "test_acc": r[2],
                         "lambda_max": None,
                         "solver_iterations": its if math.isnan(its) or not its.is_integer()
                         else int(its),
                         "ms_per_epoch": None if seconds is None else 1000.0 * seconds})
        self.log.write(rows)
        self.written += count
        self.block, self.block_start = [], None

    def close(self) -> None:
        if self.hook is not None:
            self.hook.remove()
            self.hook = None


def _run_epochs(config: TrainConfig, model, sel: _Selector, bar, sync_every: int,
                epoch_fn: Callable[[], Tensor], device: torch.device,
                saver: Optional["_SplitSaver"] = None, log=None):
    """The epoch loop shared by node and graph tasks: ``epoch_fn`` trains one epoch and
    returns (training loss, metric vector), both on the device. ``saver``: checkpoints every
    few epochs, and where a resumed split starts. ``log``: a :class:`dignn.logs.SplitLog`
    that gets each epoch's row at the host reads (no read of its own). Returns (seconds,
    epochs), both counting the epochs trained before a resume."""
    recorder = None if log is None else _EpochRecorder(log, model, sel, device)
    try:
        return _epoch_loop(config, sel, bar, sync_every, epoch_fn, device, saver, recorder)
    finally:
        if recorder is not None:
            recorder.close()


def _epoch_loop(config: TrainConfig, sel: _Selector, bar, sync_every: int,
                epoch_fn: Callable[[], Tensor], device: torch.device,
                saver: Optional["_SplitSaver"], recorder: Optional[_EpochRecorder]):
    first, seconds_before = (1, 0.0) if saver is None else saver.resume_point()
    if bar is not None and first > 1:
        bar.update(first - 1)
    start = time.perf_counter()
    epoch = first - 1
    for epoch in range(first, config.epochs + 1):
        began = time.perf_counter() if recorder is not None else 0.0
        loss, metrics = epoch_fn()
        sel.update(epoch, metrics, loss)
        if recorder is not None:
            recorder.epoch_done(epoch, began, time.perf_counter())
        if saver is not None and saver.due(epoch) and epoch < config.epochs:
            saver.save(epoch, seconds_before + time.perf_counter() - start)
        if epoch % sync_every == 0 or epoch == config.epochs:
            if recorder is None:
                loss_value, best_val, best_test, stopped = sel.poll(loss)
            else:
                polled, rows = sel.poll(loss, recorder.pending())
                loss_value, best_val, best_test, stopped = polled
                recorder.flush(rows, int(stopped))
            if bar is not None:  # the numbers first: the update draws them with its count
                bar.set_postfix(loss=f"{loss_value:.3f}", val=f"{best_val:.3f}",
                                test=f"{best_test:.3f}", refresh=False)
                bar.update(epoch - bar.n)
            if stopped:
                break
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return seconds_before + time.perf_counter() - start, epoch


def train_node_split(dataset: NodeDataset, config: TrainConfig, split: int,
                     progress: bool = True, keep_model: bool = False, *,
                     device: Union[str, torch.device, None] = None,
                     compile_model: bool = False, sync_every: int = 10,
                     checkpoint: Optional[_RunCheckpoint] = None,
                     log=None) -> SplitResult:
    """Trains and selects one model on split ``split``. ``device``: where (default: where
    ``dataset`` is); ``compile_model``: ``torch.compile`` the model's forward;
    ``sync_every``: epochs between host reads (progress bar, patience); ``checkpoint``:
    :func:`train`'s checkpoint of the run (saves, and the state to resume from); ``log``: a
    :class:`dignn.logs.SplitLog` that gets a row per epoch (written at the host reads)."""
    _check_sync_every(sync_every)
    device = dataset.device if device is None else resolve_device(device)
    dataset = dataset.to(device)
    model, opt = _split_setup(dataset, config, split, device, compile_model)
    s = dataset.splits[split]
    x, y, ei = dataset.x.to(getattr(torch, config.dtype)), dataset.y, dataset.edge_index
    sets = _NodeSets(s)
    lam_start = _spectral(model, x, ei, f"{dataset.name} split {split}, at initialization")
    sel = _Selector(model, device, config.patience, TASK_METRICS["node"])
    saver = None if checkpoint is None else _SplitSaver(checkpoint, split, model, opt, sel,
                                                        device)
    bar = _progress(config.epochs, f"{dataset.name} split {split}", progress)

    def epoch_fn():
        model.train()
        opt.zero_grad()
        loss = F.cross_entropy(model(x, ei)[s.train], y[s.train])
        loss.backward()
        opt.step()
        model.eval()
        with torch.no_grad():
            return loss.detach(), sets.metrics(model(x, ei), y)

    seconds, trained = _run_epochs(config, model, sel, bar, sync_every, epoch_fn, device,
                                   saver, log)
    return _finish_split(model, sel, bar, split, seconds, trained, lam_start,
                         lambda: _spectral(model, x, ei,
                                           f"{dataset.name} split {split}, after training"),
                         keep_model)


def _finish_split(model, sel: _Selector, bar, split: int, seconds: float, trained: int,
                  lam_start: float, spectral_end: Callable[[], float],
                  keep_model: bool) -> SplitResult:
    """After the epoch loop: the selected weights back in the model, the spectral check on
    them (``spectral_end``), the result with the backend that ran (and the model if kept)."""
    if bar is not None:
        bar.close()
    sel.restore()
    result = sel.result(split, seconds, trained, lam_start, spectral_end())
    result.backend = model.diffusion.backend_used
    result.model = model if keep_model else None
    return result


def _spectral(model, x, edge_index, where: str) -> float:
    model.eval()
    with torch.no_grad():
        h = model.diffusion_input(x, edge_index)
    layer = model.diffusion
    if layer.solver == "cg":
        op = laplacian_operator(layer, h, edge_index)
        if op.symmetric:  # cg solves (C + L/mu) Z = C X for every mu > 0: no bound to warn of
            return estimate_lambda_max(op).lambda_max
    return check_mu(layer, h, edge_index, where=where).lambda_max


def _graph_loader(graphs, index: Tensor, batch_size: int, shuffle: bool, seed: int,
                  device: torch.device):
    """A PyG DataLoader over the graphs at ``index`` of ``graphs`` (a list or a PyG
    dataset)."""
    from torch_geometric.loader import DataLoader
    subset = [graphs[i] for i in index.tolist()]
    gen = torch.Generator().manual_seed(seed) if shuffle else None
    return DataLoader(subset, batch_size=batch_size, shuffle=shuffle, generator=gen,
                      pin_memory=device.type == "cuda")  # .generator: gen


def _batches(loader, device: torch.device):
    for batch in loader:
        yield batch.to(device, non_blocking=True)


def _count(n: int, device: torch.device) -> Tensor:
    """``n`` as a float64 scalar made on the device (a fill, no copy from the host)."""
    return torch.full((), float(n), dtype=torch.float64, device=device)


class _GraphClassification:
    """Graph labels: cross-entropy, accuracy over graphs."""

    metric = TASK_METRICS["graph"]
    unit = "fold"  # what a split is called in messages
    min_graphs = 2  # batch norm needs more than one graph's nodes
    num_sums = 3

    @staticmethod
    def logits(model, batch) -> Tensor:
        return model(batch.x, batch.edge_index, batch.batch, batch.num_graphs)

    @staticmethod
    def loss(logits: Tensor, batch) -> Tensor:
        return F.cross_entropy(logits, batch.y)

    @staticmethod
    def sums(logits: Tensor, batch) -> Tensor:
        """(correct graphs, loss sum, graphs)."""
        return torch.stack([(logits.argmax(1) == batch.y).sum().double(),
                            F.cross_entropy(logits, batch.y, reduction="sum").double(),
                            _count(batch.num_graphs, logits.device)])

    @staticmethod
    def score_and_loss(sums: Tensor) -> Tensor:
        return sums[:2] / sums[2]  # 0/0 = NaN for an empty set


class _MultiLabel:
    """Node labels across graphs, several per node: binary cross-entropy with logits over
    every (node, label) pair, micro-F1 of the predictions logit > 0 (the paper's PPI
    metric)."""

    metric = TASK_METRICS["multilabel"]
    unit = "split"
    min_graphs = 1  # a graph's nodes already make a batch for batch norm
    num_sums = 5

    @staticmethod
    def logits(model, batch) -> Tensor:
        return model(batch.x, batch.edge_index)

    @staticmethod
    def loss(logits: Tensor, batch) -> Tensor:
        return F.binary_cross_entropy_with_logits(logits, batch.y.to(logits.dtype))

    @staticmethod
    def sums(logits: Tensor, batch) -> Tensor:
        """(TP, FP, FN, TN, loss sum) over the batch's nodes and labels."""
        loss = F.binary_cross_entropy_with_logits(logits, batch.y.to(logits.dtype),
                                                  reduction="sum")
        return torch.cat([multilabel_counts(logits, batch.y), loss.double().reshape(1)])

    @staticmethod
    def score_and_loss(sums: Tensor) -> Tensor:
        counts = sums[:4]
        return torch.stack([micro_f1(counts), sums[4] / counts.sum()])


@torch.no_grad()
def _evaluate_batches(model, task, batches, device: torch.device) -> Tensor:
    """(score, mean loss) of ``task`` over ``batches`` (on the device already), as a float64
    pair on the device."""
    model.eval()
    sums = torch.zeros(task.num_sums, dtype=torch.float64, device=device)
    for batch in batches:
        sums += task.sums(task.logits(model, batch), batch)
    return task.score_and_loss(sums)


def _train_batched_split(dataset, task, config: TrainConfig, split: int, progress: bool,
                         keep_model: bool, device, compile_model: bool,
                         sync_every: int, checkpoint: Optional[_RunCheckpoint] = None,
                         log=None) -> SplitResult:
    """One split of a task on many graphs: shuffled mini-batches of ``config.batch_size``
    training graphs (seeded with ``config.seed + split``) copied to the device from pinned
    memory without blocking; evaluation on the training, validation and test graphs in
    batches collated and copied to the device once."""
    _check_sync_every(sync_every)
    device = torch.device("cpu") if device is None else resolve_device(device)
    model, opt = _split_setup(dataset, config, split, device, compile_model)
    s = dataset.splits[split]
    train_loader = _graph_loader(dataset.graphs, s.train, config.batch_size, True,
                                 config.seed + split, device)
    eval_sets = [list(_batches(_graph_loader(dataset.graphs, idx, 1024, False, 0, device),
                               device)) for idx in (s.train, s.val, s.test)]
    first = eval_sets[0][0]
    where = f"{dataset.name} {task.unit} {split}"
    lam_start = _spectral(model, first.x, first.edge_index, f"{where}, at initialization")
    sel = _Selector(model, device, config.patience, task.metric)
    saver = None if checkpoint is None else _SplitSaver(checkpoint, split, model, opt, sel,
                                                        device, train_loader.generator)
    bar = _progress(config.epochs, where, progress)

    def epoch_fn():
        model.train()
        total = torch.zeros(2, dtype=torch.float64, device=device)  # loss sum, graphs
        for batch in _batches(train_loader, device):
            if batch.num_graphs < task.min_graphs:
                continue
            opt.zero_grad()
            loss = task.loss(task.logits(model, batch), batch)
            loss.backward()
            opt.step()
            total += torch.stack([loss.detach().double() * batch.num_graphs,
                                  _count(batch.num_graphs, device)])
        score_loss = torch.stack([_evaluate_batches(model, task, batches, device)
                                  for batches in eval_sets])  # rows: train, val, test
        return total[0] / total[1].clamp_min(1), score_loss.t().reshape(6)

    seconds, trained = _run_epochs(config, model, sel, bar, sync_every, epoch_fn, device,
                                   saver, log)
    return _finish_split(model, sel, bar, split, seconds, trained, lam_start,
                         lambda: _spectral(model, first.x, first.edge_index,
                                           f"{where}, after training"),
                         keep_model)


def train_graph_split(dataset: GraphDataset, config: TrainConfig, split: int,
                      progress: bool = True, keep_model: bool = False, *,
                      device: Union[str, torch.device, None] = None,
                      compile_model: bool = False, sync_every: int = 10,
                      checkpoint: Optional[_RunCheckpoint] = None,
                      log=None) -> SplitResult:
    """As :func:`train_node_split` for graph classification (fold ``split``): batches of
    graphs are copied to ``device`` (default: the CPU) from pinned memory, without
    blocking."""
    return _train_batched_split(dataset, _GraphClassification, config, split, progress,
                                keep_model, device, compile_model, sync_every, checkpoint,
                                log)


def train_multilabel_split(dataset: InductiveDataset, config: TrainConfig, split: int = 0,
                           progress: bool = True, keep_model: bool = False, *,
                           device: Union[str, torch.device, None] = None,
                           compile_model: bool = False, sync_every: int = 10,
                           checkpoint: Optional[_RunCheckpoint] = None,
                           log=None) -> SplitResult:
    """As :func:`train_node_split` for multi-label node classification across graphs (PPI,
    appendix table tab:tab4): trains on batches of ``config.batch_size`` training graphs with
    binary cross-entropy over every label, selects the epoch of the best validation micro-F1
    (ties: lower validation loss) and reports the test micro-F1 there, each computed over all
    nodes of the set's graphs. ``device`` defaults to the CPU."""
    return _train_batched_split(dataset, _MultiLabel, config, split, progress, keep_model,
                                device, compile_model, sync_every, checkpoint, log)


def train(dataset: Dataset, config: TrainConfig,
          splits: Optional[Sequence[int]] = None, progress: bool = True,
          on_split: Optional[Callable[[SplitResult], None]] = None, *,
          device: Union[str, torch.device, None] = "auto", compile_model: bool = False,
          sync_every: int = 10, checkpoint: Optional[Checkpointing] = None,
          fit: Optional[Callable[..., SplitResult]] = None, epoch_log=None) -> RunResult:
    """Trains one model per split in ``splits`` (default: all) on ``device`` (``"auto"``: the
    GPU when one is visible) and collects the results, scored by the dataset's task
    (:data:`TASK_METRICS`: accuracy, or micro-F1 for multi-label PPI); ``on_split`` is called
    after each split (the CLI prints there; for a split finished before a resume too).
    ``compile_model`` compiles each model's forward with ``torch.compile``; ``sync_every``
    is the number of epochs between host reads. ``checkpoint``: save the run's state there
    and, with ``resume``, continue from it (:class:`Checkpointing`). ``fit``: what trains
    one split (default: the task's ``train_*_split``; :mod:`dignn.distributed` passes its
    own). ``epoch_log``: a :class:`dignn.logs.EpochLogs` (``--log-dir``) that gets a CSV
    (and TensorBoard) log of every split trained, written at the host reads.

    Args:
        dataset: a NodeDataset, GraphDataset or InductiveDataset (:func:`dignn.load_dataset`,
            :func:`dignn.from_pyg`).
        config: the :class:`~dignn.presets.TrainConfig` (:func:`dignn.preset_config`).
        splits: the split indices to train (default: all of ``dataset.splits``).
        progress: show a progress bar per split.
        on_split: called with each :class:`SplitResult`.
        device: ``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or a ``torch.device``.
        compile_model: compile each model's forward with ``torch.compile``.
        sync_every: epochs between host reads (>= 1).
        checkpoint: a :class:`Checkpointing`, or None.
        fit: what trains one split, or None.
        epoch_log: a :class:`dignn.logs.EpochLogs`, or None.

    Returns:
        RunResult: the splits' results, scored by the task's metric.

    Raises:
        ValueError: a config number out of range (naming the field and its option), split
            indices out of range, a bad ``sync_every``, or a checkpoint of another run.
        DeviceUnavailableError: ``device`` names a GPU that is not there.

    Example:
        >>> from dignn import load_dataset, preset_config, train
        >>> data = load_dataset("csbm", num_nodes=40, num_splits=2)
        >>> config = preset_config("csbm", epochs=2, hidden=8)
        >>> run = train(data, config, splits=[0], progress=False, device="cpu")
        >>> run.splits[0].epochs_run, run.metric
        (2, 'accuracy')
    """
    check_training_numbers(config)
    n = len(dataset.splits)
    splits = list(range(n)) if splits is None else list(splits)
    bad = [k for k in splits if not (isinstance(k, int) and 0 <= k < n)]
    if bad or not splits:
        raise ValueError(f"splits must be indices in 0..{n - 1} for {dataset.name} (it has {n} "
                         f"splits), got {splits}")
    _check_sync_every(sync_every)
    device = resolve_device(device)
    if dataset.task == "node" and fit is None:  # a given fit places the data itself
        dataset = dataset.to(device)
    run = RunResult(dataset.name, config.laplacian, config,
                    environment={**describe_device(device), "threads": torch.get_num_threads(),
                                 "compiled": bool(compile_model)},
                    metric=TASK_METRICS[dataset.task])
    if fit is None:
        fit = {"node": train_node_split, "graph": train_graph_split,
               "multilabel": train_multilabel_split}[dataset.task]
    saved = None if checkpoint is None else _RunCheckpoint(
        checkpoint, {"dataset": dataset.name, "task": dataset.task, "splits": splits,
                     "config": config.as_dict()})
    if epoch_log is not None:
        import inspect
        if "log" not in inspect.signature(fit).parameters:
            raise ValueError("per-epoch logs (epoch_log, --log-dir) are written by the "
                             "built-in training of one process; this fit takes no log")
    for k in splits:
        result = None if saved is None else saved.finished_result(k)
        if result is None:
            log = None if epoch_log is None else epoch_log.split(dataset.name, k)
            try:
                result = fit(dataset, config, k, progress, device=device,
                             compile_model=compile_model, sync_every=sync_every,
                             checkpoint=saved, **({} if log is None else {"log": log}))
                if log is not None:
                    log.finish(result.lambda_max_end, result.best_epoch)
            finally:
                if log is not None:
                    log.close()
            if saved is not None:
                saved.finish_split(result)
        run.splits.append(result)
        if on_split is not None:
            on_split(result)
    return run


def train_graph_data(data, laplacian: str = "neural", splits: Optional[Sequence[int]] = None,
                     split_ratio: Optional[Sequence[float]] = None, num_splits: int = 10,
                     split_seed: int = 0, name: Optional[str] = None,
                     device="auto", progress: bool = False, allow_pickle: bool = False,
                     **overrides):
    """Trains DIGNN on a user's graph(s) with the generic preset
    (:data:`dignn.presets.USER_DATA`) and returns the :class:`RunResult`.

    ``data``: a ``Data`` (node classification), a ``Dataset``/``InMemoryDataset`` or list
    of ``Data`` (graph classification), a :class:`~dignn.data.NodeDataset` or
    :class:`~dignn.data.GraphDataset`, or the path of a file for
    :func:`dignn.data.load_user_file`. ``split_ratio``, ``num_splits``, ``split_seed`` (the
    ``seed`` of :func:`dignn.data.from_pyg`) and ``name`` make the splits and name the run;
    ``splits`` picks split indices to train (default: all). ``allow_pickle``: unpickle a
    file that plain ``torch.load(weights_only=True)`` refuses (it can run code from the
    file: only for files you trust). ``overrides`` are
    :class:`~dignn.presets.TrainConfig` fields (``epochs=50``, ``hidden=32``, ``mu=2.5``).

    Args:
        data: a PyG ``Data``, a dataset or list of ``Data``, a NodeDataset/GraphDataset, or
            a file path (``str`` or ``os.PathLike``).
        laplacian: ``"neural"`` or ``"rw"``.
        splits: split indices to train (default: all).
        split_ratio: (train, val, test) shares for random splits (see
            :func:`dignn.data.from_pyg`).
        num_splits: the splits (or folds) to make.
        split_seed: split ``k`` is drawn with seed ``split_seed + k``.
        name: the run's dataset name.
        device: ``"auto"``, ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
        progress: show progress bars.
        allow_pickle: unpickle a file that needs it (runs its code: trusted files only).
        **overrides: TrainConfig fields.

    Returns:
        RunResult: the splits' results.

    Raises:
        UserDataError: data or a file that cannot be trained on (what to change).
        ValueError: an unknown TrainConfig field or a value out of range.

    Example:
        >>> import torch
        >>> from torch_geometric.data import Data
        >>> from dignn import train_graph_data
        >>> _ = torch.manual_seed(0)
        >>> data = Data(x=torch.randn(12, 3), y=torch.tensor([0, 1] * 6),
        ...             edge_index=torch.tensor([[0, 1, 2, 3], [1, 0, 3, 2]]))
        >>> run = train_graph_data(data, split_ratio=(0.5, 0.25, 0.25), num_splits=1,
        ...                        device="cpu", epochs=2, hidden=8)
        >>> run.dataset, len(run.splits)
        ('graph-data', 1)
    """
    from .presets import USER_DATA, preset_config
    if isinstance(data, (str, os.PathLike)):
        dataset = load_user_file(data, name, split_ratio, num_splits, split_seed,
                                 allow_pickle=allow_pickle)
    elif isinstance(data, (NodeDataset, GraphDataset)):
        dataset = data
    else:
        dataset = from_pyg(data, name, split_ratio, num_splits, split_seed)
    config = preset_config(USER_DATA, laplacian, directed=_is_directed(dataset), **overrides)
    return train(dataset, config, splits, progress=progress, device=device)


def _is_directed(dataset) -> bool:
    """Whether a graph of ``dataset`` has an edge without its reverse (what the presets'
    solver rule, :func:`dignn.presets.preset_solver`, asks)."""
    from torch_geometric.utils import is_undirected
    if isinstance(dataset, NodeDataset):
        return not is_undirected(dataset.edge_index, num_nodes=dataset.num_nodes)
    graphs = dataset.graphs  # one block-diagonal graph of them all
    sizes = torch.tensor([0] + [g.num_nodes for g in graphs])
    offsets = torch.cumsum(sizes, 0)
    edges = torch.cat([g.edge_index + offsets[k] for k, g in enumerate(graphs)], dim=1)
    return not is_undirected(edges, num_nodes=int(offsets[-1]))
