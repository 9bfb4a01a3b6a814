"""Hyperparameter search with Optuna (``dignn tune``), and the study machinery that
``dignn sweep`` shares.

A study trains one :class:`~dignn.presets.TrainConfig` per trial, the values of its search
space (:data:`DEFAULT_SPACE`, or a TOML file, :func:`load_space`) suggested by Optuna's TPE
sampler (seeded), on the splits asked for, with :func:`dignn.training.train`. The objective is
the mean validation accuracy over those splits (each split's validation accuracy at its
selected epoch); the test accuracies are recorded as the trial's user attributes
(``test_acc``, ``test_mean``) and never read by the sampler, the pruner or the choice of the
best trial.

Pruning: each epoch's validation accuracy reaches the trial (``trial.report``, the step being
the epoch counted over the splits trained so far, the value the mean over those splits of the
best validation accuracy so far) through the training loop's per-epoch log hook
(``train(..., epoch_log=...)``), which hands the epochs' rows over at the loop's existing host
reads (every ``sync_every`` epochs): no read is added. The pruner (median by default) is asked
once per host read; a pruned trial stops there.

Storage: any Optuna RDB URL (``sqlite:///tune.db``, ``postgresql+psycopg2://...``); a plain
path is a SQLite file. A study found there under the same name is resumed: ``trials`` is the
number of finished (complete or pruned) trials the study should hold, and only the missing ones
are run. ``workers`` processes on this machine (``spawn``) share the storage, each running its
share of the missing trials; each trial beats a heartbeat in the storage, so the running trial
of a killed worker is marked failed (``FAIL``) once its heartbeat is older than the grace
period, by the next worker that starts a trial or by the next resume.

Nothing here imports torch or Optuna at import time (the command line checks its input first).
"""
from __future__ import annotations

import math
import os
import time
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Union

__all__ = ["Param", "DEFAULT_SPACE", "default_space", "load_space", "space_to_json",
           "TuneJob", "run_study", "study_record", "optuna_missing", "OPTUNA_HINT",
           "open_storage", "default_storage", "shares", "DEFAULT_HEARTBEAT"]

OPTUNA_HINT = 'dignn tune and dignn sweep need Optuna: pip install "dignn-kernels[tune]"'
DEFAULT_HEARTBEAT = 10  # seconds between a running trial's heartbeats; grace: twice that
OBJECTIVE = ("the mean validation accuracy over the splits trained (each split's at its "
             "selected epoch); test accuracy is recorded per trial, never used to choose")


def optuna_missing() -> bool:
    """Whether Optuna cannot be imported here (found without importing it)."""
    import importlib.util
    return importlib.util.find_spec("optuna") is None


# ----------------------------------------------------------------- the search space --

@dataclass(frozen=True)
class Param:
    """One dimension of a search space: ``choices`` (categorical), or ``low``..``high``
    (``log``: sampled on a log scale; ``step``: a grid step) of the field's type."""

    name: str
    kind: str  # "float", "int" or "categorical"
    low: Optional[float] = None
    high: Optional[float] = None
    log: bool = False
    step: Optional[float] = None
    choices: Optional[tuple] = None

    def suggest(self, trial):
        if self.kind == "categorical":
            return trial.suggest_categorical(self.name, list(self.choices))
        if self.kind == "int":
            return trial.suggest_int(self.name, int(self.low), int(self.high),
                                     step=int(self.step or 1), log=self.log)
        return trial.suggest_float(self.name, float(self.low), float(self.high),
                                   step=self.step, log=self.log)

    def to_json(self) -> Dict:
        if self.kind == "categorical":
            return {"choices": list(self.choices)}
        out = {"low": self.low, "high": self.high, "log": self.log}
        if self.step is not None:
            out["step"] = self.step
        return out

    def describe(self) -> str:
        if self.kind == "categorical":
            return f"{self.name} in {{{', '.join(map(str, self.choices))}}}"
        scale = ", log" if self.log else (f", step {self.step}" if self.step else "")
        return f"{self.name} in [{self.low}, {self.high}{scale}]"


# The paper's search (appendix "Hyperparameters": hidden {16, 32, 64, 128}, mu {1, ..., 10},
# lr {0.001, 0.005, 0.01}, dropout {0, ..., 0.75}, weight decay {0, 1e-5, 1e-4}) with mu, lr
# and dropout as continuous ranges; they hold every row of tables 6/7 and of the tuned preset.
# input_unit (appendix "Model architectures") is searched for node datasets only.
DEFAULT_SPACE: Dict[str, Param] = {
    "mu": Param("mu", "float", 1.0, 10.0, log=True),
    "lr": Param("lr", "float", 1e-3, 1e-2, log=True),
    "dropout": Param("dropout", "float", 0.0, 0.75),
    "weight_decay": Param("weight_decay", "categorical", choices=(0.0, 1e-5, 1e-4)),
    "hidden": Param("hidden", "categorical", choices=(16, 32, 64, 128)),
    "input_unit": Param("input_unit", "categorical", choices=("mlp", "adj", "linkx")),
}


def default_space(task: Optional[str] = "node") -> Dict[str, Param]:
    """:data:`DEFAULT_SPACE`, without ``input_unit`` unless ``task`` is ``"node"``."""
    return {k: p for k, p in DEFAULT_SPACE.items() if k != "input_unit" or task == "node"}


def _field_types() -> Dict[str, object]:
    from .presets import TrainConfig
    return typing.get_type_hints(TrainConfig)


def _base_type(kind):
    args = typing.get_args(kind)
    if typing.get_origin(kind) is Union and type(None) in args:
        return next(a for a in args if a is not type(None))
    return kind


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and \
        math.isfinite(value)


def parse_param(name: str, spec, allowed: Optional[Sequence[str]] = None,
                where: str = "") -> Param:
    """The :class:`Param` of the table ``spec`` of field ``name``, checked; ValueError
    naming ``where`` and the key otherwise."""
    key = name.strip().replace("-", "_")
    types = _field_types()
    known = sorted(allowed if allowed is not None else set(types) - {"laplacian"})
    if key not in known:
        import difflib
        close = difflib.get_close_matches(key, known, n=1)
        raise ValueError(f"{where}unknown setting {name!r}"
                         f"{f' (did you mean {close[0]}?)' if close else ''}; the settings "
                         f"that can be tuned: {', '.join(known)}")
    at = f"{where}[{name}]"
    if not isinstance(spec, dict):
        raise ValueError(f"{at}: give a table such as low = 1.0, high = 10.0 (log = true) or "
                         f"choices = [16, 32]")
    kind = _base_type(types[key])
    extra = set(spec) - {"low", "high", "log", "step", "choices"}
    if extra:
        raise ValueError(f"{at}: unknown key(s) {', '.join(sorted(extra))}; the keys are "
                         f"low, high, log, step or choices")
    if "choices" in spec:
        if set(spec) - {"choices"}:
            raise ValueError(f"{at}: choices goes alone, without low/high/log/step")
        choices = spec["choices"]
        if not isinstance(choices, list) or not choices:
            raise ValueError(f"{at}: choices must be a non-empty list")
        checked = []
        for value in choices:
            ok = {bool: isinstance(value, bool),
                  int: isinstance(value, int) and not isinstance(value, bool),
                  float: _is_number(value),
                  str: isinstance(value, str) and bool(value)}.get(kind, False)
            if not ok:
                raise ValueError(f"{at}: choice {value!r} is not a {kind.__name__}")
            checked.append(float(value) if kind is float else value)
        if len(set(checked)) != len(checked):
            raise ValueError(f"{at}: a choice is listed twice")
        return Param(key, "categorical", choices=tuple(checked))
    if kind not in (int, float):
        raise ValueError(f"{at}: {key} is not a number: give choices = [...]")
    if "low" not in spec or "high" not in spec:
        raise ValueError(f"{at}: give low and high (or choices)")
    low, high, log, step = spec["low"], spec["high"], spec.get("log", False), spec.get("step")
    for what, value in (("low", low), ("high", high)) + ((("step", step),) if step is not None
                                                         else ()):
        if not _is_number(value) or (kind is int and isinstance(value, float)):
            raise ValueError(f"{at}: {what} must be {'an integer' if kind is int else 'a number'}"
                             f", got {value!r}")
    if not isinstance(log, bool):
        raise ValueError(f"{at}: log must be true or false")
    if not low <= high:
        raise ValueError(f"{at}: low {low} is above high {high}")
    if log and low <= 0:
        raise ValueError(f"{at}: a log scale needs low > 0")
    if step is not None and (step <= 0 or log):
        raise ValueError(f"{at}: step must be > 0 and goes without log")
    kind_name = "int" if kind is int else "float"
    return Param(key, kind_name, float(low) if kind is float else low,
                 float(high) if kind is float else high, log,
                 None if step is None else (float(step) if kind is float else step))


def load_space(path, allowed: Optional[Sequence[str]] = None) -> Dict[str, Param]:
    """The search space of a TOML file: one table per TrainConfig field, e.g. ::

        [mu]
        low = 1.0
        high = 10.0
        log = true

        [hidden]
        choices = [16, 32, 64]

    ``allowed``: the fields that may be tuned (default: every TrainConfig field but the
    Laplacian). Raises ValueError (one line, naming the file and the table)."""
    from .config import read_toml
    data = read_toml(path, "--space")
    shown = os.fspath(path)
    if not data:
        raise ValueError(f"--space {shown!r} is empty: give one table per setting, such as "
                         f"[mu] low = 1.0 high = 10.0")
    return {p.name: p for p in (parse_param(k, v, allowed, f"--space {shown}: ")
                                for k, v in data.items())}


def space_to_json(space: Dict[str, Param]) -> Dict:
    return {name: p.to_json() for name, p in space.items()}


# ----------------------------------------------------------------------- storages --

def default_storage(dataset_name: str, json_path=None) -> str:
    """The SQLite file of a study: beside ``json_path`` (its name with ``.db``), else
    ``dignn_tune_<dataset>.db`` in the working directory."""
    if json_path is not None:
        path = Path(json_path).expanduser().with_suffix(".db")
    else:
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in Path(dataset_name).stem)
        path = Path(f"dignn_tune_{safe}.db")
    return "sqlite:///" + str(path.resolve())


def storage_url(text: str) -> str:
    """An Optuna storage URL; a plain path is a SQLite file."""
    if "://" in text:
        return text
    return "sqlite:///" + str(Path(text).expanduser().resolve())


def shown_url(url: Optional[str]) -> Optional[str]:
    """``url`` with its password hidden (for output and JSON)."""
    if url is None:
        return None
    try:
        from sqlalchemy.engine import make_url
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - not a URL SQLAlchemy reads: shown as given
        return url


def open_storage(url: Optional[str], heartbeat: Optional[int] = DEFAULT_HEARTBEAT):
    """Optuna's storage of ``url``: in memory for None, else an RDB storage (SQLite waits up to
    a minute for a lock held by another worker) with a heartbeat every ``heartbeat`` seconds
    and a grace period of twice that."""
    import optuna
    _quiet_optuna()
    if url is None:
        return optuna.storages.InMemoryStorage()
    engine = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
    beat = {} if not heartbeat else dict(heartbeat_interval=int(heartbeat),
                                         grace_period=2 * int(heartbeat))
    for attempt in range(3):
        try:
            return optuna.storages.RDBStorage(url, engine_kwargs=engine, **beat)
        except ImportError as err:
            raise ImportError(f"storage {shown_url(url)}: {err} (PostgreSQL: pip install "
                              f"\"dignn-kernels[tune]\", which brings psycopg2-binary)"
                              ) from None
        except Exception as err:  # noqa: BLE001 - SQLAlchemy's errors: said in one line
            if not type(err).__module__.startswith(("sqlalchemy", "psycopg")):
                raise
            if attempt < 2:
                # another process may be making the new storage's tables at this moment (two
                # commands starting one study: "table ... already exists", a duplicate schema
                # version); they are there on the next try
                time.sleep(0.5)
                continue
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise ValueError(f"storage {shown_url(url)} cannot be opened: {first}") from None


def shares(total: int, workers: int) -> List[int]:
    """``total`` trials split over ``workers`` as evenly as can be (the first get the rest)."""
    return [total // workers + (1 if i < total % workers else 0) for i in range(workers)]


class WorkerFailed(RuntimeError):
    """A worker process of a study ended with an error or a signal; the study's storage
    keeps every trial the workers finished."""


def _spawn(target, jobs: Sequence[tuple]) -> None:
    """Runs ``target(*job)`` for each job in a process of its own (``spawn``) and waits for
    all; RuntimeError when one did not end well."""
    import multiprocessing
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=target, args=job, daemon=False) for job in jobs]
    for p in procs:
        p.start()
    try:
        for p in procs:
            p.join()
    except KeyboardInterrupt:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join()
        raise
    bad = [(k, p.exitcode) for k, p in enumerate(procs) if p.exitcode != 0]
    if bad:
        raise WorkerFailed("worker(s) " + ", ".join(f"{k} (exit status {code})"
                                                    for k, code in bad) +
                           " failed; the study keeps the trials they finished")


def _quiet_optuna() -> None:
    """Optuna's log off but for errors (each trial prints its own line; a trial cut short by
    Ctrl-C or an error is said once, by the command, not again with Optuna's traceback) and
    its notes on experimental features (heartbeats) unsaid."""
    import warnings
    import optuna
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


# ------------------------------------------------------------------------ tuning --

def _given(dataset):
    return dataset


@dataclass
class TuneJob:
    """What every worker of a study needs (picklable: workers are spawned).

    Args:
        load: makes the dataset (e.g. ``functools.partial(dignn.load_dataset, "cora")``).
        base: the :class:`~dignn.presets.TrainConfig` the trials change.
        space: {field: :class:`Param`}.
        study_name, storage: the study and its storage URL (None: in memory, one worker).
        splits: the splits each trial trains (None: all).
        protocol: ``"holdout"`` or ``"gin"``.
        device, sync_every, compile_model, threads: how each trial trains.
        seed: the TPE sampler's seed (worker k: seed + k).
        pruner: ``"median"`` or ``"none"``; startup_trials, warmup_epochs: the pruner's
            ``n_startup_trials`` and ``n_warmup_steps``.
        heartbeat: seconds between a running trial's heartbeats (None or 0: none).
        startup_random: the TPE sampler's random trials before it models.
        dataset_name: recorded with the study.
        enqueue_base: a new study's first trial trains ``base``'s own values of the space
            (where they lie in it), so the study measures the starting settings beside what
            it finds and chooses them when nothing beats them on validation.
    """

    load: Callable
    base: object
    space: Dict[str, Param]
    study_name: str
    storage: Optional[str]
    splits: Optional[List[int]] = None
    protocol: str = "holdout"
    device: str = "cpu"
    sync_every: int = 10
    compile_model: bool = False
    threads: Optional[int] = None
    seed: int = 0
    pruner: str = "median"
    startup_trials: int = 5
    warmup_epochs: int = 10
    heartbeat: Optional[int] = DEFAULT_HEARTBEAT
    startup_random: int = 10
    dataset_name: str = ""
    verbose: bool = True
    enqueue_base: bool = True


def protocol_error(protocol: str) -> Optional[str]:
    """Why a study cannot tune under ``protocol`` (None: it can): GIN's protocol has no
    validation set to choose on."""
    if protocol != "gin":
        return None
    return ("the gin protocol has no validation set (it scores each fold on the epoch chosen "
            "on that same fold), so a study cannot choose on it: tune with --protocol holdout "
            "(protocol='holdout'; a validation fold per split), then report the chosen "
            "settings with dignn train --config best.toml --protocol gin")


def _pruner(job: TuneJob):
    import optuna
    if job.pruner == "none":
        return optuna.pruners.NopPruner()
    return optuna.pruners.MedianPruner(n_startup_trials=job.startup_trials,
                                       n_warmup_steps=job.warmup_epochs)


def sampler_seed(seed: int, worker: int, held: int) -> int:
    """The TPE sampler's seed of ``worker`` joining a study that holds ``held`` trials:
    ``seed + worker`` for a new study (so that a study is reproducible from its seed), and a
    seed of its own for each later start, since a resumed sampler seeded as the first one
    would suggest the first run's random trials over again."""
    if held == 0:
        return seed + worker
    import numpy
    return int(numpy.random.SeedSequence([seed, worker, held]).generate_state(1)[0])


def _sampler(job: TuneJob, worker: int, held: int = 0):
    import optuna
    return optuna.samplers.TPESampler(seed=sampler_seed(job.seed, worker, held),
                                      n_startup_trials=job.startup_random)


def _study(job: TuneJob, storage, worker: int = 0, create: bool = False):
    """The study of ``job`` in ``storage``, its sampler seeded for ``worker`` and for the
    trials the study already holds, queued ones aside (:func:`sampler_seed`)."""
    import optuna
    from optuna.trial import TrialState
    if create:
        study = optuna.create_study(study_name=job.study_name, storage=storage,
                                    pruner=_pruner(job), direction="maximize",
                                    load_if_exists=True)
    else:
        study = optuna.load_study(study_name=job.study_name, storage=storage,
                                  pruner=_pruner(job))
    held = sum(1 for t in study.get_trials(deepcopy=False) if t.state != TrialState.WAITING)
    study.sampler = _sampler(job, worker, held)
    return study


class _TrialReporter:
    """The per-epoch hook of one trial (:func:`dignn.training.train`'s ``epoch_log``): each
    epoch's validation accuracy goes to ``trial.report`` as the rows arrive (at the training
    loop's host reads), the pruner is asked once per read."""

    def __init__(self, trial, epochs: int, prune: bool):
        self.trial, self.epochs, self.prune = trial, epochs, prune
        self.finished: List[float] = []  # the best val accuracy of each finished split

    def split(self, dataset: str, split: int) -> "_SplitReporter":
        return _SplitReporter(self, len(self.finished))


class _SplitReporter:
    def __init__(self, owner: _TrialReporter, position: int):
        self.owner, self.position, self.best = owner, position, -math.inf

    def write(self, rows) -> None:
        owner = self.owner
        for row in rows:
            value = row.get("val_acc")
            if value is not None and not math.isnan(value):
                self.best = max(self.best, value)
            if self.best == -math.inf:
                continue
            mean = (sum(owner.finished) + self.best) / (len(owner.finished) + 1)
            owner.trial.report(mean, self.position * owner.epochs + int(row["epoch"]))
        if rows and owner.prune and owner.trial.should_prune():
            import optuna
            epoch = int(rows[-1]["epoch"])
            raise optuna.TrialPruned(f"pruned at epoch {epoch} of split position "
                                     f"{self.position}")

    def finish(self, lambda_max=None, epoch=None) -> None:
        self.owner.finished.append(self.best if self.best != -math.inf else 0.0)

    def close(self) -> None:
        pass


def _objective(trial, dataset, job: TuneJob, worker: int = 0) -> float:
    import optuna
    from . import training
    from .protocols import check_protocol_config
    params = {name: p.suggest(trial) for name, p in job.space.items()}
    config = job.base.replace(**params)
    try:
        check_protocol_config(job.protocol, config)
        training.validate_config(dataset, config)
    except (TypeError, ValueError) as err:
        trial.set_user_attr("error", str(err))
        raise optuna.TrialPruned(f"cannot train: {err}") from None
    start = time.perf_counter()
    reporter = _TrialReporter(trial, config.epochs, job.pruner != "none")
    run = training.train(dataset, config, job.splits, False, device=job.device,
                         compile_model=job.compile_model, sync_every=job.sync_every,
                         epoch_log=reporter)
    # the holdout protocol (run_study refuses gin): each split's selected epoch
    val, test = [s.val_acc for s in run.splits], list(run.test_acc)
    epochs = [s.best_epoch for s in run.splits]
    mean = sum(val) / len(val)
    trial.set_user_attr("splits", [s.split for s in run.splits])
    trial.set_user_attr("val_acc", val)
    trial.set_user_attr("best_epoch", epochs)
    trial.set_user_attr("test_acc", test)
    trial.set_user_attr("test_mean", sum(test) / len(test))
    trial.set_user_attr("seconds", round(time.perf_counter() - start, 3))
    trial.set_user_attr("worker", worker)
    trial.set_user_attr("pid", os.getpid())
    return mean if math.isfinite(mean) else float("nan")


def _print_trial(study, trial) -> None:
    from optuna.trial import TrialState
    if trial.state == TrialState.COMPLETE:
        what = f"val acc {100 * trial.value:.2f} %"
    elif trial.state == TrialState.PRUNED:
        last = trial.last_step
        what = f"pruned at step {last}" if last is not None else "pruned"
        if "error" in trial.user_attrs:
            what = f"not trained: {trial.user_attrs['error']}"
    else:
        what = trial.state.name.lower()
    params = ", ".join(f"{k}={_short(v)}" for k, v in trial.params.items())
    if trial.user_attrs.get("start") == "base":
        params += " (the starting settings)"
    print(f"[trial {trial.number}] {params}: {what}", flush=True)


def _short(value):
    return f"{value:.4g}" if isinstance(value, float) else value


def _tune_worker(job: TuneJob, n_trials: int, timeout: Optional[float], worker: int,
                 dataset=None, storage=None, total: Optional[int] = None) -> None:
    """One worker: ``n_trials`` trials of the study (fewer after ``timeout`` seconds, or
    once the study holds ``total`` finished trials, which another command on the same study
    may have run)."""
    _quiet_optuna()
    if job.threads is not None:
        import torch
        torch.set_num_threads(job.threads)
    import warnings
    warnings.filterwarnings("ignore", message=r".*torch\.jit\.script.*is deprecated")
    from .protocols import apply_protocol
    if dataset is None:
        dataset = apply_protocol(job.load(), job.protocol)
    if storage is None:
        storage = open_storage(job.storage, job.heartbeat)
    study = _study(job, storage, worker)
    if n_trials <= 0:
        return
    import optuna
    from optuna.trial import TrialState
    callbacks = [_print_trial] if job.verbose else []
    if total is not None:
        callbacks.append(optuna.study.MaxTrialsCallback(
            total, states=(TrialState.COMPLETE, TrialState.PRUNED)))
    study.optimize(lambda t: _objective(t, dataset, job, worker), n_trials=n_trials,
                   timeout=timeout, callbacks=callbacks, catch=())


def _check_study(study, job: TuneJob) -> None:
    """Refuses to resume a study made for another dataset or search space."""
    claim_study(study, {"dignn": "tune", "dataset": job.dataset_name,
                        "space": space_to_json(job.space), "protocol": job.protocol},
                job.study_name, job.storage, "tuning")


def claim_study(study, mine: Dict, name: str, storage, what: str) -> None:
    """Marks a new study with what it is for (``mine``, its user attributes), or refuses to
    resume one made for something else, naming the attribute that differs (``what``: the
    job, as the message names it)."""
    attrs = study.user_attrs
    if not attrs:
        for key, value in mine.items():
            study.set_user_attr(key, value)
        return
    for key, value in mine.items():
        if attrs.get(key) != value:
            raise ValueError(f"study {name!r} in {shown_url(storage)} holds another {what} "
                             f"(another {key}: {attrs.get(key)!r}); give another "
                             f"--study-name or --storage")


def finished_count(study) -> int:
    from optuna.trial import TrialState
    return len(study.get_trials(deepcopy=False,
                                states=(TrialState.COMPLETE, TrialState.PRUNED)))


def run_study(job: TuneJob, trials: int, workers: int = 1, timeout: Optional[float] = None,
              dataset=None):
    """Creates (or resumes) the study of ``job`` and runs trials until it holds ``trials``
    finished (complete or pruned) ones, over ``workers`` processes (1: this one, with
    ``dataset`` when given); returns the study.

    Example:
        >>> import functools
        >>> from dignn import load_dataset, preset_config
        >>> from dignn.tune import Param, TuneJob, run_study
        >>> job = TuneJob(functools.partial(load_dataset, "csbm", num_nodes=40, num_splits=1),
        ...               preset_config("csbm", epochs=2, hidden=8),
        ...               {"lr": Param("lr", "float", 1e-3, 1e-2, log=True)},
        ...               "doc", None, verbose=False)
        >>> study = run_study(job, trials=2)
        >>> len(study.trials), study.trials[0].params == {"lr": 0.01}  # the preset's first
        (2, True)
    """
    import optuna
    _quiet_optuna()
    if workers > 1 and job.storage is None:
        raise ValueError("workers share the study through a storage: give one (--storage)")
    refused = protocol_error(job.protocol)
    if refused is not None:
        raise ValueError(refused)
    storage = open_storage(job.storage, job.heartbeat)
    study = _study(job, storage, create=True)
    _check_study(study, job)
    first = 0
    if job.enqueue_base and not study.get_trials(deepcopy=False):
        start = base_params(job.base, job.space)
        if start:
            study.enqueue_trial(start, user_attrs={"start": "base"}, skip_if_exists=True)
            first = 1
    if job.storage is not None and job.heartbeat:
        optuna.storages.fail_stale_trials(study)
    todo = max(trials - finished_count(study), 0)
    if workers > 1 and first and todo > 1:
        # The enqueued trial first, here: concurrent workers on SQLite (no row locks) could
        # both take it.
        began = time.monotonic()
        _tune_worker(job, 1, timeout, 0, dataset, storage, trials)
        todo -= 1
        if timeout is not None:
            timeout = max(timeout - (time.monotonic() - began), 0.0)
            if timeout == 0.0:
                todo = 0
    if workers <= 1:
        _tune_worker(job, todo, timeout, 0, dataset, storage, trials)
    elif todo:
        counts = [n for n in shares(todo, workers)]
        _spawn(_tune_worker, [(job, n, timeout, k, None, None, trials)
                              for k, n in enumerate(counts) if n > 0])
    return _study(job, storage)


def base_params(base, space: Dict[str, Param]) -> Dict:
    """The values of ``base`` (a TrainConfig) for the dimensions of ``space`` when each lies in
    it (a choice, or within low..high on the step); {} when one does not."""
    values = {}
    for name, p in space.items():
        value = getattr(base, name)
        if p.kind == "categorical":
            if value not in p.choices:
                return {}
        elif not _is_number(value) or not p.low <= value <= p.high or (
                p.step is not None and abs(round((value - p.low) / p.step) * p.step
                                           + p.low - value) > 1e-9 * max(1.0, abs(value))):
            return {}
        values[name] = value
    return values


def study_record(study, job: TuneJob) -> Dict:
    """The study as JSON: every trial (state, value, params, validation and test accuracies
    per split) and the best trial, chosen on the objective only."""
    from optuna.trial import TrialState
    trials = []
    for t in study.get_trials(deepcopy=False):
        row = {"number": t.number, "state": t.state.name, "value": t.value,
               "params": dict(t.params)}
        for key in ("start", "splits", "val_acc", "best_epoch", "test_acc", "test_mean",
                    "seconds", "worker", "error"):
            if key in t.user_attrs:
                row[key] = t.user_attrs[key]
        if t.state == TrialState.PRUNED and t.last_step is not None:
            row["pruned_at_step"] = t.last_step
        trials.append(row)
    counts = {s.name: sum(1 for t in trials if t["state"] == s.name) for s in TrialState}
    record = {"study_name": job.study_name, "storage": shown_url(job.storage),
              "dataset": job.dataset_name, "protocol": job.protocol, "objective": OBJECTIVE,
              "space": space_to_json(job.space), "base_config": job.base.as_dict(),
              "counts": {k: v for k, v in counts.items() if v}, "trials": trials}
    best = best_trial(study)
    if best is not None:
        record["best"] = {"number": best.number, "value": best.value,
                          "params": dict(best.params),
                          "config": job.base.replace(**best.params).as_dict(),
                          **{k: best.user_attrs[k] for k in ("val_acc", "test_acc",
                                                             "test_mean", "best_epoch")
                             if k in best.user_attrs}}
    return record


def best_trial(study):
    """The complete trial of the highest objective (ties: the first), or None."""
    from optuna.trial import TrialState
    complete = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                if t.value is not None and not math.isnan(t.value)]
    return max(complete, key=lambda t: (t.value, -t.number)) if complete else None
