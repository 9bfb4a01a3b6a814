"""Hyperparameter selection that never looks at the test set (``dignn sweep``).

A sweep trains every setting (a dict of :class:`~dignn.presets.TrainConfig` overrides, from a
grid of values or a list) on every split, with :func:`dignn.training.train`, and chooses one:

- ``holdout`` protocol: the setting of the highest mean validation accuracy over the splits
  (each split's validation accuracy at its selected epoch); ties go to the setting listed
  first. Only the chosen setting's test accuracies are kept and reported: those of the other
  settings are dropped as soon as the choice is made, so that nobody can select on them later.
- ``gin`` protocol (graph classification, :mod:`dignn.protocols`): settings are ranked by the
  same cross-validation number that is reported (the mean held-out fold accuracy at the best
  common epoch), which is what GIN does; there is no separate test set, so the chosen
  number is optimistic twice over (epoch and setting both chosen on the held-out folds).

The settings are run as an Optuna study (:mod:`dignn.tune`) whose one parameter, the
setting's position, is drawn by Optuna's ``GridSampler`` (in the order listed, in a fresh
study): in memory by default, or in a ``storage`` (any Optuna RDB URL) that ``workers``
processes share and that a later run under the same study name resumes, training only the
settings not yet finished (a setting whose trial failed, e.g. in a killed worker, is trained
again). Each trial keeps its setting's validation numbers and, as a user attribute of the
trial in the storage, its test accuracies: the choice reads the validation numbers only, and
only the chosen setting's test accuracies leave the study.
"""
from __future__ import annotations

import functools
import itertools
import json
import math
import os
import shutil
import tempfile
import time
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Union

from . import training
from .training import validate_config
from .presets import TrainConfig
from .protocols import (GIN_DESCRIPTION, GinScore, apply_protocol, check_protocol_config,
                        gin_score, mean_std)

__all__ = ["SettingResult", "SweepResult", "parse_grid", "expand_grid", "load_settings",
           "check_settings", "validate_config", "select_setting", "run_sweep",
           "DEFAULT_MAX_SETTINGS", "SELECTION_RULE", "setting_line"]

DEFAULT_MAX_SETTINGS = 64
SELECTION_RULE = {
    "holdout": "the highest mean validation accuracy over the splits (ties: the setting "
               "listed first); test accuracy is read for the chosen setting only",
    "gin": "the highest GIN cross-validation accuracy (mean held-out fold accuracy at the "
           "best common epoch, as GIN ranks settings; ties: the setting listed first); the "
           "held-out folds choose both the epoch and the setting",
}
# Keys a setting may not change: the preset itself depends on the Laplacian.
_NOT_SWEPT = {"laplacian": "the preset depends on it: run one sweep per --laplacian"}
_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def _field_types() -> Dict[str, object]:
    return typing.get_type_hints(TrainConfig)


def _unwrap(kind) -> tuple:
    """(base type, whether None is allowed) of a TrainConfig field annotation."""
    args = typing.get_args(kind)
    if typing.get_origin(kind) is Union and type(None) in args:
        return next(a for a in args if a is not type(None)), True
    return kind, False


def _field(key: str) -> str:
    """The TrainConfig field named ``key`` (dashes allowed for underscores), or ValueError."""
    name = key.strip().replace("-", "_")
    types = _field_types()
    if name not in types:
        raise ValueError(f"unknown setting {key!r}: not a TrainConfig field; known: "
                         f"{', '.join(sorted(set(types) - set(_NOT_SWEPT)))}")
    if name in _NOT_SWEPT:
        raise ValueError(f"{name} cannot be swept: {_NOT_SWEPT[name]}")
    return name


def _parse_value(name: str, text: str):
    """``text`` as a value of field ``name`` (int, float, str, bool, or ``none`` where the
    field allows None)."""
    kind, optional = _unwrap(_field_types()[name])
    word = text.strip()
    if optional and word.lower() in ("none", "null"):
        return None
    try:
        if kind is bool:
            if word.lower() in _TRUE + _FALSE:
                return word.lower() in _TRUE
            raise ValueError
        if kind is int:
            return int(word)
        if kind is float:
            value = float(word)
            if not math.isfinite(value):
                raise ValueError
            return value
        if kind is str and word:
            return word
        raise ValueError
    except ValueError:
        expected = {bool: "true or false", int: "an integer", float: "a finite number",
                    str: "a non-empty word"}[kind]
        raise ValueError(f"bad value {text!r} for {name}: expected {expected}"
                         f"{' or none' if optional else ''}") from None


def _check_json_value(name: str, value):
    """A value read from a settings file, held to the type of field ``name``."""
    kind, optional = _unwrap(_field_types()[name])
    if value is None and optional:
        return None
    ok = {bool: isinstance(value, bool),
          int: isinstance(value, int) and not isinstance(value, bool),
          float: isinstance(value, (int, float)) and not isinstance(value, bool) and
          math.isfinite(value),
          str: isinstance(value, str) and bool(value)}[kind]
    if not ok:
        raise ValueError(f"bad value {value!r} for {name}: expected a JSON "
                         f"{kind.__name__}{' or null' if optional else ''}")
    return float(value) if kind is float else value


def parse_grid(items: Sequence[str]) -> Dict[str, List]:
    """``["mu=1.25,2.2", "dropout=0.1,0.5"]`` -> ``{"mu": [1.25, 2.2], "dropout": [0.1, 0.5]}``,
    each value parsed to its TrainConfig field's type.

    Args:
        items: ``KEY=V1,V2,...`` strings (the command line's ``--grid``), KEY a
            :class:`~dignn.presets.TrainConfig` field (``-`` and ``_`` alike).

    Returns:
        Dict[str, List]: each field's values, in the order given.

    Raises:
        ValueError: an entry without ``=`` or with an empty value, an unknown field, a field
            given twice, a value that does not parse as the field's type, or no entries.

    Example:
        >>> from dignn import parse_grid
        >>> parse_grid(["mu=1.25,2.2", "hidden=32,64", "solver=cg"])
        {'mu': [1.25, 2.2], 'hidden': [32, 64], 'solver': ['cg']}
    """
    grid: Dict[str, List] = {}
    for item in items:
        key, sep, values = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"bad grid entry {item!r}: expected KEY=V1,V2,... such as "
                             f"mu=1.25,2.2")
        name = _field(key)
        if name in grid:
            raise ValueError(f"{name} is given twice in the grid: list all its values in one "
                             f"entry, {name}=V1,V2")
        parts = values.split(",")
        if not values.strip() or any(not p.strip() for p in parts):
            raise ValueError(f"bad grid entry {item!r}: empty value; expected KEY=V1,V2,...")
        grid[name] = [_parse_value(name, p) for p in parts]
    if not grid:
        raise ValueError("the grid is empty: give KEY=V1,V2,... entries")
    return grid


def _check_count(count: int, max_settings: int) -> None:
    if count > max_settings:
        raise ValueError(f"{count} settings exceed --max-settings {max_settings}: each is "
                         f"trained on every split; shrink the grid or raise --max-settings")


def expand_grid(grid: Dict[str, List], max_settings: int = DEFAULT_MAX_SETTINGS
                ) -> List[Dict]:
    """Every combination of the grid's values, the last key varying fastest; refused (before
    it is built) when there are more than ``max_settings``."""
    _check_count(math.prod(len(v) for v in grid.values()), max_settings)
    keys = list(grid)
    return [dict(zip(keys, combo)) for combo in itertools.product(*grid.values())]


def load_settings(path: Union[str, Path]) -> List[Dict]:
    """A settings file: a JSON list of objects of TrainConfig overrides, e.g.
    ``[{"mu": 1.25, "dropout": 0.1}, {"mu": 2.2}]``."""
    try:
        raw = json.loads(Path(path).expanduser().read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"settings file {path}: not valid JSON ({err})") from None
    except UnicodeDecodeError:
        raise ValueError(f"settings file {path} (--settings) is not UTF-8 text: give a JSON "
                         f"list of settings such as [{{\"mu\": 1.25}}]") from None
    except OSError as err:
        what = "is a folder" if Path(path).expanduser().is_dir() else \
            f"cannot be read ({err.strerror or err})"
        raise ValueError(f"settings file {path} (--settings) {what}; give the path of a "
                         f"JSON file such as [{{\"mu\": 1.25}}, {{\"mu\": 2.2}}]") from None
    if not isinstance(raw, list) or not raw or not all(isinstance(s, dict) for s in raw):
        raise ValueError(f"settings file {path}: expected a non-empty JSON list of objects "
                         f"such as [{{\"mu\": 1.25}}, {{\"mu\": 2.2}}]")
    settings = []
    for k, setting in enumerate(raw):
        try:
            names = [_field(key) for key in setting]
            settings.append({name: _check_json_value(name, value)
                             for name, value in zip(names, setting.values())})
        except ValueError as err:
            raise ValueError(f"settings file {path}, setting {k}: {err}") from None
    return settings


def check_settings(settings: Sequence[Dict], max_settings: int = DEFAULT_MAX_SETTINGS,
                   fixed: Sequence[str] = ()) -> None:
    """Refuses an empty list, more than ``max_settings`` settings, a setting listed twice, and
    a key that is also ``fixed`` by a command-line override."""
    if not settings:
        raise ValueError("no settings to try")
    _check_count(len(settings), max_settings)
    seen = set()
    for setting in settings:
        key = json.dumps(setting, sort_keys=True)
        if key in seen:
            raise ValueError(f"setting {_describe(setting)} is listed twice")
        seen.add(key)
        both = sorted(set(setting) & set(fixed))
        if both:
            raise ValueError(f"{', '.join(both)} is both fixed by an option and swept; give "
                             f"it in one place only")


def _summary(values: str, which: int, doc: str) -> property:
    """A read-only property: the mean (``which`` 0) or the sample standard deviation (1) of
    the list field ``values`` (:func:`~dignn.protocols.mean_std`)."""
    return property(lambda self: mean_std(getattr(self, values))[which], doc=doc)


def _describe(overrides: Dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in overrides.items()) or "(the preset)"


@dataclass
class SettingResult:
    """One setting's validation numbers; its test accuracies are not kept."""

    index: int
    overrides: Dict
    splits: List[int]
    val_acc: List[float]  # per split at its selected epoch (gin: per fold at the CV epoch)
    best_epoch: List[int]  # gin: the CV epoch, for every fold
    seconds: float
    gin: Optional[GinScore] = None  # gin protocol: the cross-validation number

    val_mean = _summary("val_acc", 0, "The mean validation accuracy over the splits.")
    val_std = _summary("val_acc", 1, "Its sample standard deviation (0 for one split).")

    @property
    def score(self) -> float:
        """What settings are ranked by: the mean validation accuracy (holdout; under gin the
        validation sets are the held-out folds at the CV epoch, so this is the GIN number)."""
        return self.val_mean

    def describe(self) -> str:
        return _describe(self.overrides)

    def to_json(self) -> Dict:
        record = {"index": self.index, "overrides": self.overrides, "splits": self.splits,
                  "seconds": round(self.seconds, 2)}
        if self.gin is None:
            record.update(val_acc=self.val_acc, val_mean=self.val_mean, val_std=self.val_std,
                          best_epoch=self.best_epoch)
        else:  # the held-out folds are the validation sets: no other number exists
            record.update(cv_epoch=self.gin.epoch, cv_mean=self.gin.mean,
                          cv_std=self.gin.std, cv_acc=self.gin.per_fold)
        return record


def select_setting(results: Sequence[SettingResult]) -> int:
    """Position of the setting of the highest score (NaN ranks last; ties: the first)."""
    def key(i):
        s = results[i].score
        return (-math.inf if math.isnan(s) else s, -i)
    return max(range(len(results)), key=key)


@dataclass
class SweepResult:
    """What :func:`run_sweep` returns: every setting's validation numbers and the chosen
    setting's test accuracies (the others' are never kept).

    Args:
        dataset: the dataset's name.
        laplacian: the base config's Laplacian.
        protocol: ``"holdout"`` or ``"gin"``.
        base_config: the :class:`~dignn.presets.TrainConfig` the settings change.
        settings: one :class:`SettingResult` per setting, in the order given.
        chosen: the chosen setting's position in ``settings``.
        chosen_config: its full config.
        test_acc: its test accuracy per split (gin: per fold at the CV epoch).
        environment: device, versions and threads of the runs.

    Example:
        >>> from dignn import load_dataset, preset_config, run_sweep
        >>> data = load_dataset("csbm", num_nodes=40, num_splits=2)
        >>> base = preset_config("csbm", epochs=2, hidden=8)
        >>> result = run_sweep(data, base, [{"mu": 2.0}, {"mu": 3.0}], device="cpu")
        >>> result.best is result.settings[result.chosen], len(result.test_acc)
        (True, 2)
        >>> sorted(result.to_json()["chosen"])[:3]
        ['config', 'index', 'overrides']
    """

    dataset: str
    laplacian: str
    protocol: str
    base_config: TrainConfig
    settings: List[SettingResult]
    chosen: int  # position in ``settings``
    chosen_config: TrainConfig
    test_acc: List[float]  # the chosen setting's, per split (gin: per fold at the CV epoch)
    environment: Dict = field(default_factory=dict)

    @property
    def best(self) -> SettingResult:
        """The chosen setting's :class:`SettingResult`."""
        return self.settings[self.chosen]

    test_mean = _summary("test_acc", 0, "The chosen setting's mean test accuracy.")
    test_std = _summary("test_acc", 1, "Its sample standard deviation (0 for one split).")

    def to_json(self) -> Dict:
        """The record ``dignn sweep --json`` writes: the protocol, the selection rule, every
        setting's validation numbers and the chosen setting with its test accuracies."""
        chosen = {"index": self.best.index, "overrides": self.best.overrides,
                  "config": self.chosen_config.as_dict(), "splits": self.best.splits,
                  "test_acc": self.test_acc, "test_mean": self.test_mean,
                  "test_std": self.test_std}
        if self.protocol == "gin":
            chosen.update(epoch=self.best.gin.epoch,
                          cv_mean_by_epoch=self.best.gin.mean_by_epoch)
        return {"dataset": self.dataset, "laplacian": self.laplacian,
                "protocol": self.protocol,
                **({"protocol_description": GIN_DESCRIPTION} if self.protocol == "gin"
                   else {}),
                "selection": SELECTION_RULE[self.protocol],
                "base_config": self.base_config.as_dict(),
                "settings": [s.to_json() for s in self.settings],
                "chosen": chosen, **self.environment}


def setting_line(result: SettingResult, total: int) -> str:
    """The line said after a setting is trained: its position, values and score."""
    what = (f"CV acc {100 * result.val_mean:.2f} +- {100 * result.val_std:.2f} % at epoch "
            f"{result.gin.epoch}") if result.gin is not None else \
        f"val acc {100 * result.val_mean:.2f} +- {100 * result.val_std:.2f} %"
    return f"[{result.index + 1}/{total}] {result.describe()}: {what} ({result.seconds:.1f} s)"


def _setting_result(k: int, overrides: Dict, run, protocol: str, seconds: float
                    ) -> SettingResult:
    folds = [s.split for s in run.splits]
    if protocol == "gin":  # the held-out folds are the validation sets, at one epoch
        gin = gin_score(run.splits)
        return SettingResult(k, dict(overrides), folds, list(gin.per_fold),
                             [gin.epoch] * len(folds), seconds, gin)
    return SettingResult(k, dict(overrides), folds, [s.val_acc for s in run.splits],
                         [s.best_epoch for s in run.splits], seconds)


def _plain(value):
    """``value`` as JSON holds it (what a trial's user attribute may be)."""
    return json.loads(json.dumps(value, default=str))


def _result_attr(result: SettingResult) -> Dict:
    record = {"index": result.index, "overrides": result.overrides, "splits": result.splits,
              "val_acc": result.val_acc, "best_epoch": result.best_epoch,
              "seconds": result.seconds}
    if result.gin is not None:
        g = result.gin
        record["gin"] = {"epoch": g.epoch, "mean": g.mean, "std": g.std,
                         "per_fold": g.per_fold, "folds": g.folds,
                         "mean_by_epoch": g.mean_by_epoch}
    return _plain(record)


def _result_of(attr: Dict, overrides: Dict) -> SettingResult:
    from .protocols import GinScore
    gin = None if "gin" not in attr else GinScore(**attr["gin"])
    return SettingResult(attr["index"], dict(overrides), list(attr["splits"]),
                         [math.nan if v is None else v for v in attr["val_acc"]],
                         list(attr["best_epoch"]), attr["seconds"], gin)


@dataclass
class _SweepJob:
    """What every worker of a sweep needs (picklable: workers are spawned)."""

    load: Callable
    settings: List[Dict]
    configs: List[TrainConfig]
    splits: Optional[List[int]]
    protocol: str
    device: str
    compile_model: bool
    sync_every: int
    progress: bool
    study_name: str
    storage: Optional[str]
    heartbeat: Optional[int]
    threads: Optional[int] = None


def _sweep_objective(trial, dataset, job: _SweepJob, on_setting) -> float:
    total = len(job.configs)
    k = trial.suggest_categorical("setting", list(range(total)))
    start = time.perf_counter()
    run = training.train(dataset, job.configs[k], job.splits, job.progress, device=job.device,
                         compile_model=job.compile_model, sync_every=job.sync_every)
    result = _setting_result(k, job.settings[k], run, job.protocol,
                             time.perf_counter() - start)
    test = result.val_acc if job.protocol == "gin" else run.test_acc
    trial.set_user_attr("result", _result_attr(result))
    trial.set_user_attr("test_acc", _plain(list(test)))
    trial.set_user_attr("environment", _plain(dict(run.environment)))
    if on_setting is not None:
        on_setting(result, total)
    return result.score if math.isfinite(result.score) else -1.0  # NaN: ranked last


def _print_setting(result: SettingResult, total: int) -> None:
    print(setting_line(result, total), flush=True)


def _sweep_worker(job: _SweepJob, n_trials: int, worker: int, dataset=None, storage=None,
                  on_setting=None) -> None:
    """One worker of a sweep: up to ``n_trials`` settings the grid sampler hands it."""
    import optuna
    from . import tune
    tune._quiet_optuna()
    if job.threads is not None:
        import torch
        torch.set_num_threads(job.threads)
    if dataset is None:
        dataset = apply_protocol(job.load(), job.protocol)
        on_setting = _print_setting
    if storage is None:
        storage = tune.open_storage(job.storage, job.heartbeat)
    study = optuna.load_study(study_name=job.study_name, storage=storage,
                              sampler=_grid_sampler(len(job.configs)))
    if n_trials > 0:
        study.optimize(lambda t: _sweep_objective(t, dataset, job, on_setting),
                       n_trials=n_trials, catch=())


def _grid_sampler(count: int):
    """Optuna's GridSampler over the settings' positions, drawing them in the order listed
    in a fresh study (trial k: setting k; Optuna's own order is a seeded shuffle)."""
    import optuna
    sampler = optuna.samplers.GridSampler({"setting": list(range(count))}, seed=0)
    grids = getattr(sampler, "_all_grids", None)
    if isinstance(grids, list) and sorted(grids) == [(k,) for k in range(count)]:
        grids.sort()
    return sampler


def _finished(study, count: int) -> Dict[int, object]:
    """{setting: its first complete trial}."""
    from optuna.trial import TrialState
    done: Dict[int, object] = {}
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        k = t.params.get("setting")
        if isinstance(k, int) and 0 <= k < count and "result" in t.user_attrs:
            done.setdefault(k, t)
    return done


def _check_sweep_study(study, name: str, storage, settings, protocol: str, dataset) -> None:
    from . import tune
    tune.claim_study(study, {"dignn": "sweep", "dataset": dataset, "protocol": protocol,
                             "settings": _plain(list(settings))}, name, storage, "sweep")


def run_sweep(dataset, base_config: TrainConfig, settings: Sequence[Dict], *,
              splits: Optional[Sequence[int]] = None, protocol: str = "holdout",
              progress: bool = False,
              on_setting: Optional[Callable[[SettingResult, int], None]] = None,
              device="auto", compile_model: bool = False, sync_every: int = 10,
              storage: Optional[str] = None, study_name: Optional[str] = None,
              workers: int = 1, heartbeat: Optional[int] = 10,
              load: Optional[Callable] = None, threads: Optional[int] = None
              ) -> SweepResult:
    """Trains ``base_config.replace(**s)`` for each setting ``s`` on ``splits`` (default: all)
    of ``dataset`` under ``protocol`` and chooses one (module docstring). Every config is
    checked before the first is trained. ``on_setting(result, total)`` is called after each
    setting with its validation numbers (in this process; workers print
    :func:`setting_line`).

    Args:
        dataset: a NodeDataset, GraphDataset or InductiveDataset.
        base_config: the :class:`~dignn.presets.TrainConfig` the settings change.
        settings: dicts of TrainConfig overrides (e.g. from :func:`parse_grid` and
            :func:`expand_grid`).
        splits: the split indices to train (default: all).
        protocol: ``"holdout"`` or ``"gin"`` (graph classification only).
        progress: show progress bars.
        on_setting: called as ``on_setting(result, total)`` after each setting.
        device: ``"auto"``, ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
        compile_model: compile each model's forward with ``torch.compile``.
        sync_every: epochs between host reads.
        storage: an Optuna storage URL for the study (None: in memory; with ``workers`` > 1
            a temporary SQLite file).
        study_name: the study's name (default ``dignn-sweep-<dataset>``); the same name in the
            same storage resumes the sweep.
        workers: processes sharing the study (spawned; each loads the data with ``load``).
        heartbeat: seconds between a running trial's heartbeats in a storage.
        load: makes the dataset in a worker (picklable; default: ``dataset`` itself, pickled).
        threads: torch CPU threads of each worker.

    Returns:
        SweepResult: every setting's validation numbers and the chosen setting's test ones.

    Raises:
        ValueError: a setting whose config cannot train (naming the setting), an unknown
            protocol, bad splits, or a study of another sweep under that name.

    Example:
        >>> from dignn import load_dataset, preset_config, run_sweep
        >>> data = load_dataset("csbm", num_nodes=40, num_splits=2)
        >>> base = preset_config("csbm", epochs=2, hidden=8)
        >>> result = run_sweep(data, base, [{"mu": 2.0}, {"mu": 3.0}], splits=[0],
        ...                    device="cpu")
        >>> [s.overrides for s in result.settings], result.chosen in (0, 1)
        ([{'mu': 2.0}, {'mu': 3.0}], True)
    """
    trained = apply_protocol(dataset, protocol)
    settings = [dict(s) for s in settings]
    configs = []
    for k, overrides in enumerate(settings):
        try:
            config = base_config.replace(**overrides)
            check_protocol_config(protocol, config)
            validate_config(trained, config)
        except (TypeError, ValueError) as err:
            raise ValueError(f"setting {k} ({_describe(overrides)}): {err}") from None
        configs.append(config)
    if not configs:
        raise ValueError("no settings to try")
    scratch = None
    if storage is None and workers > 1:  # workers share a file, removed at the end
        scratch = tempfile.mkdtemp(prefix="dignn-sweep-")
        storage = "sqlite:///" + os.path.join(scratch, "sweep.db")
    try:
        return _run_study(dataset, trained, base_config, settings, configs, splits, protocol,
                          progress, on_setting, device, compile_model, sync_every, storage,
                          study_name or f"dignn-sweep-{dataset.name}", workers, heartbeat,
                          load, threads)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def _run_study(dataset, trained, base_config, settings, configs, splits, protocol, progress,
               on_setting, device, compile_model, sync_every, storage, name, workers,
               heartbeat, load, threads) -> SweepResult:
    import optuna
    from optuna.trial import TrialState
    from . import tune
    store = tune.open_storage(storage, heartbeat if storage else None)
    count = len(configs)
    study = optuna.create_study(study_name=name, storage=store,
                                sampler=_grid_sampler(count), direction="maximize",
                                load_if_exists=True)
    _check_sweep_study(study, name, storage, settings, protocol, dataset.name)
    job = _SweepJob(load or functools.partial(tune._given, dataset), settings, configs,
                    None if splits is None else list(splits), protocol,
                    str(device), compile_model, sync_every, progress and workers <= 1, name,
                    storage, heartbeat, threads)
    before = None
    while True:
        if storage is not None and heartbeat:
            optuna.storages.fail_stale_trials(study)
        done = _finished(study, count)
        missing = [k for k in range(count) if k not in done]
        if not missing:
            break
        if before is not None and len(missing) >= before:
            raise RuntimeError(f"settings {', '.join(map(str, missing))} did not finish; the "
                               f"study keeps the others: run the same command to resume it")
        before = len(missing)
        trials = study.get_trials(deepcopy=False)
        pending = {t.params.get("setting") for t in trials
                   if t.state in (TrialState.WAITING, TrialState.RUNNING)}
        failed = {t.params.get("setting"): t for t in trials if t.state == TrialState.FAIL}
        retry = getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None) or \
            optuna.storages.RetryFailedTrialCallback  # (its name before Optuna 4.9)
        retry = retry()
        for k in missing:  # the grid does not draw a failed setting again: queued anew
            if k in failed and k not in pending:
                retry(study, failed[k])
        if workers <= 1:
            _sweep_worker(job, len(missing), 0, trained, store, on_setting)
        else:
            tune._spawn(_sweep_worker, [(job, n, w) for w, n in
                                        enumerate(tune.shares(len(missing), workers)) if n])
    results: List[SettingResult] = []
    test_of_setting: List[List[float]] = []  # dropped once the choice is made
    environment: Dict = {}
    for k in range(count):
        trial = done[k]
        results.append(_result_of(trial.user_attrs["result"], settings[k]))
        test_of_setting.append(list(trial.user_attrs["test_acc"]))
        environment = environment or dict(trial.user_attrs.get("environment", {}))
    chosen = select_setting(results)
    test_acc = [math.nan if v is None else v for v in test_of_setting[chosen]]
    del test_of_setting
    return SweepResult(dataset.name, base_config.laplacian, protocol, base_config, results,
                       chosen, configs[chosen], test_acc, environment)
