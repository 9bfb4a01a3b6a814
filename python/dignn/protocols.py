"""Evaluation protocols: which splits a model is trained on and which number is reported.

- ``holdout`` (the default, every dataset): each split has its own train, validation and test
  sets; per split the epoch of best validation accuracy is selected and its test accuracy
  reported (:mod:`dignn.training`), mean +- std over the splits.
- ``gin`` (graph classification only): the protocol of GIN (Xu et al., "How Powerful are Graph
  Neural Networks?", ICLR 2019), which the paper's graph classification experiments follow
  ("We follow the standard train/validation/test splits as in [GIN]", table 5). Stratified
  10-fold cross-validation: fold ``k`` is held out and the model trains on the other nine;
  the held-out fold is evaluated after every epoch, and the reported number is the mean over
  the folds of the held-out accuracy at the single epoch that maximizes that mean, with the
  standard deviation over the folds at that epoch. There is no separate test set: the epoch
  is chosen on the same folds it is scored on, so the number is comparable to the paper's
  table 5 but an optimistic estimate of accuracy on unseen graphs.

The GIN folds are built so that the held-out fold is a split's validation set and its test set
at once; :func:`dignn.training.train` then records the held-out accuracy of every epoch
(``SplitResult.test_history``) and :func:`gin_score` aggregates those histories, so no other
training loop is needed.

Only the names (:data:`PROTOCOLS`) are imported at module level: ``dignn --help`` reads them
without loading torch.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass, field
from typing import Dict, List, Sequence

__all__ = ["PROTOCOLS", "GIN_DESCRIPTION", "GIN_NUM_FOLDS", "GinScore", "gin_folds",
           "graph_labels", "apply_protocol", "check_protocol_config", "gin_score",
           "mean_std"]

PROTOCOLS = ("holdout", "gin")
GIN_NUM_FOLDS = 10
GIN_DESCRIPTION = ("GIN protocol (10-fold CV, epoch chosen on the same held-out folds; "
                   "comparable to the paper's table 5, optimistic as an estimate)")


def mean_std(values: Sequence[float]) -> tuple:
    """(mean, sample standard deviation) of ``values``; the deviation is 0 for one value, as
    :attr:`dignn.training.RunResult.std`; (nan, nan) for none."""
    values = list(values)
    if not values:
        return math.nan, math.nan
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def gin_folds(y, num_folds: int = GIN_NUM_FOLDS, seed: int = 0) -> list:
    """GIN's cross-validation folds over items with labels ``y``: the stratified folds of
    :func:`dignn.data.stratified_folds` (same ``seed``, so fold ``k`` holds the same items as
    the test fold of the ``holdout`` split ``k``), with split ``k`` training on the other
    ``num_folds - 1`` folds and holding out fold ``k`` as its validation and test set.

    Args:
        y: int Tensor [num_items], the class of each item (graph).
        num_folds: the folds, >= 3.
        seed: the shuffling seed.

    Returns:
        list: ``num_folds`` :class:`~dignn.data.Split` s whose ``val`` and ``test`` are the
        same held-out fold.

    Raises:
        ValueError: ``num_folds`` < 3.

    Example:
        >>> import torch
        >>> from dignn import gin_folds
        >>> folds = gin_folds(torch.tensor([0, 1] * 6), num_folds=3)
        >>> [f.sizes() for f in folds]
        [(8, 4, 4), (8, 4, 4), (8, 4, 4)]
        >>> bool((folds[0].val == folds[0].test).all())
        True
    """
    import torch
    from .data.core import Split, stratified_folds
    folds = []
    for s in stratified_folds(y, num_folds, seed):
        train = torch.sort(torch.cat([s.train, s.val])).values
        folds.append(Split(train, s.test, s.test))
    return folds


def graph_labels(dataset):
    """The class of each graph of a :class:`~dignn.data.GraphDataset`, as one long tensor."""
    import torch
    return torch.cat([g.y.reshape(-1) for g in dataset.graphs]).long()


def apply_protocol(dataset, protocol: str):
    """``dataset`` with the splits of ``protocol``: itself for ``holdout``; for ``gin`` a copy
    of a graph classification dataset whose splits are :func:`gin_folds` of its labels."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {PROTOCOLS}, got {protocol!r}")
    if protocol == "holdout":
        return dataset
    if dataset.task != "graph":
        raise ValueError(f"the gin protocol (10-fold cross-validation) is for graph "
                         f"classification datasets; {dataset.name} is a {dataset.task} "
                         f"classification dataset: use --protocol holdout")
    return dataclasses.replace(
        dataset, splits=gin_folds(graph_labels(dataset)),
        description=f"{dataset.description}; GIN protocol: stratified {GIN_NUM_FOLDS} folds "
                    f"(seed 0), each trained on the other {GIN_NUM_FOLDS - 1}, the held-out "
                    f"fold both validation and test set (a fold's own best epoch is "
                    f"selection on it), the result scored at one epoch common to all folds")


def check_protocol_config(protocol: str, config) -> None:
    """The GIN score compares folds epoch by epoch, so every fold must train the same number
    of epochs: ``patience`` (which stops each fold on its own) is refused."""
    if protocol == "gin" and config.patience is not None:
        raise ValueError(f"patience={config.patience} stops each fold at its own epoch, but "
                         f"the gin protocol scores every fold at one common epoch: drop "
                         f"--patience (or use --protocol holdout)")


@dataclass
class GinScore:
    """The GIN number of a run: ``mean`` +- ``std`` (over folds) of the held-out accuracy at
    ``epoch`` (1-based), the epoch maximizing the mean (ties: the earliest)."""

    epoch: int
    mean: float
    std: float
    per_fold: List[float]  # held-out accuracy of each fold at ``epoch``
    folds: List[int]
    mean_by_epoch: List[float] = field(default_factory=list, repr=False)

    def to_json(self) -> Dict:
        return {"protocol": "gin", "protocol_description": GIN_DESCRIPTION,
                "epoch": self.epoch, "mean": self.mean, "std": self.std,
                "test_acc": self.per_fold, "splits": self.folds,
                "cv_mean_by_epoch": self.mean_by_epoch}


def gin_score(split_results: Sequence) -> GinScore:
    """Aggregates the per-epoch held-out accuracies (``test_history``) of the folds of a run
    under the gin protocol into :class:`GinScore`. Every fold must have run the same number
    of epochs.

    Args:
        split_results: the folds' :class:`~dignn.training.SplitResult` s (anything with
            ``test_history`` and ``split``).

    Returns:
        GinScore: the epoch (1-based) of the best mean held-out accuracy over the folds
        (ties: the earliest), its mean and sample standard deviation, and the per-fold
        accuracies there.

    Raises:
        ValueError: no results, or folds of different (or no) epochs.

    Example:
        >>> from types import SimpleNamespace
        >>> from dignn import gin_score
        >>> folds = [SimpleNamespace(split=0, test_history=[0.5, 0.75, 0.5]),
        ...          SimpleNamespace(split=1, test_history=[0.5, 0.5, 0.75])]
        >>> score = gin_score(folds)
        >>> score.epoch, score.mean, score.per_fold
        (2, 0.625, [0.75, 0.5])
    """
    results = list(split_results)
    if not results:
        raise ValueError("gin_score needs the results of at least one fold")
    lengths = {len(r.test_history) for r in results}
    if len(lengths) != 1 or 0 in lengths:
        raise ValueError(f"every fold must record the same, non-zero number of epochs for the "
                         f"gin protocol; got {sorted(len(r.test_history) for r in results)} "
                         f"(was patience set?)")
    epochs = lengths.pop()
    mean_by_epoch = [mean_std([r.test_history[e] for r in results])[0] for e in range(epochs)]
    best = max(range(epochs), key=lambda e: (not math.isnan(mean_by_epoch[e]),
                                             mean_by_epoch[e], -e))
    per_fold = [r.test_history[best] for r in results]
    mean, std = mean_std(per_fold)
    return GinScore(best + 1, mean, std, per_fold, [r.split for r in results], mean_by_epoch)
