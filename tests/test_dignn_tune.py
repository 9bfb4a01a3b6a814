"""``dignn tune``: Optuna studies over the training (records, pruning, resume, workers sharing
a SQLite or PostgreSQL storage, a killed worker's trial failed on resume, --export)."""
import functools
import json
import multiprocessing
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

optuna = pytest.importorskip("optuna")

from dignn import cli, tune  # noqa: E402
from dignn.data import csbm  # noqa: E402
from dignn.presets import TrainConfig, preset_config  # noqa: E402
from dignn.tune import Param, TuneJob, run_study  # noqa: E402
from optuna.trial import TrialState  # noqa: E402

SMALL_CSBM = dict(num_nodes=300, num_classes=3, num_features=16, avg_degree=8,
                  homophily=0.8, signal=1.0, num_splits=2)
SPACE = {"lr": Param("lr", "float", 1e-3, 5e-2, log=True),
         "dropout": Param("dropout", "categorical", choices=(0.0, 0.5))}

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def small_csbm(monkeypatch):
    import dignn.data
    monkeypatch.setattr(dignn.data, "csbm", lambda **kw: csbm(**SMALL_CSBM))


def _job(storage, name="t", epochs=3, space=SPACE, **kw):
    base = preset_config("csbm", epochs=epochs, hidden=8, max_iter=3)
    how = dict(splits=[0], device="cpu", threads=1, heartbeat=1, verbose=False,
               dataset_name="csbm")
    how.update(kw)
    return TuneJob(functools.partial(csbm, **SMALL_CSBM), base, dict(space), name, storage,
                   **how)


def _states(study):
    return [t.state for t in study.get_trials(deepcopy=False)]


def _tune_cli(tmp_path, *extra):
    space = tmp_path / "space.toml"
    space.write_text("[lr]\nlow = 0.001\nhigh = 0.05\nlog = true\n\n"
                     "[dropout]\nchoices = [0.0, 0.5]\n")
    return ["tune", "--epochs", "3", "--hidden", "8", "--max-iter", "3", "--splits", "0,1",
            "--space", str(space), "--no-progress", *extra]


# ------------------------------------------------------------------ the command --

def test_tune_records_every_trial_and_chooses_on_validation(small_csbm, tmp_path, capsys):
    out, best = tmp_path / "study.json", tmp_path / "best.toml"
    assert cli.main(_tune_cli(tmp_path, "--trials", "3", "--json", str(out), "--export",
                              str(best))) == 0
    record = json.loads(out.read_text())
    assert (tmp_path / "study.db").is_file()  # the default storage: beside --json
    assert record["storage"].endswith("study.db") and record["counts"] == {"COMPLETE": 3}
    trials = record["trials"]
    assert [t["number"] for t in trials] == [0, 1, 2]
    for t in trials:
        assert set(t["params"]) == {"lr", "dropout"} and t["splits"] == [0, 1]
        assert len(t["val_acc"]) == 2 and len(t["test_acc"]) == 2
        assert t["value"] == pytest.approx(sum(t["val_acc"]) / 2)
        assert t["test_mean"] == pytest.approx(sum(t["test_acc"]) / 2)
        assert 0.001 <= t["params"]["lr"] <= 0.05
    chosen = max(trials, key=lambda t: (t["value"], -t["number"]))
    assert record["best"]["number"] == chosen["number"]
    assert record["best"]["config"]["lr"] == chosen["params"]["lr"]
    assert record["best"]["config"]["hidden"] == 8
    printed = capsys.readouterr().out
    assert f"best: trial {chosen['number']}" in printed and "[trial 2]" in printed
    # --export: a config file dignn train runs, with the best trial's settings
    run = tmp_path / "run.json"
    assert cli.main(["train", "--config", str(best), "--json", str(run)]) == 0
    trained = json.loads(run.read_text())
    assert trained["config"]["lr"] == chosen["params"]["lr"]
    assert trained["config"]["dropout"] == chosen["params"]["dropout"]
    assert trained["config"]["epochs"] == 3 and trained["splits"] == [0, 1]


def test_resume_adds_trials_to_the_same_study(small_csbm, tmp_path):
    db = tmp_path / "s.db"
    args = _tune_cli(tmp_path, "--storage", str(db), "--study-name", "mine")
    assert cli.main(args + ["--trials", "2"]) == 0
    first = optuna.load_study(study_name="mine", storage=f"sqlite:///{db}")
    before = [t.params for t in first.trials]
    assert len(before) == 2
    assert cli.main(args + ["--trials", "4"]) == 0
    again = optuna.load_study(study_name="mine", storage=f"sqlite:///{db}")
    assert [t.number for t in again.trials] == [0, 1, 2, 3]
    assert [t.params for t in again.trials[:2]] == before  # the same trials, kept
    assert _states(again) == [TrialState.COMPLETE] * 4
    assert cli.main(args + ["--trials", "4"]) == 0  # complete: nothing more runs
    assert len(optuna.load_study(study_name="mine", storage=f"sqlite:///{db}").trials) == 4


def test_a_new_study_first_trains_the_presets_own_values(small_csbm, tmp_path, capsys):
    db = tmp_path / "s.db"
    args = _tune_cli(tmp_path, "--storage", str(db), "--study-name", "p", "--dropout", "0.5")
    space = tmp_path / "space.toml"  # the csbm preset: lr 0.01; dropout fixed on the line
    space.write_text("[lr]\nlow = 0.001\nhigh = 0.05\nlog = true\n\n"
                     "[weight_decay]\nchoices = [0.0, 0.0005]\n")
    assert cli.main(args + ["--trials", "2"]) == 0
    assert "(the starting settings)" in capsys.readouterr().out
    study = optuna.load_study(study_name="p", storage=f"sqlite:///{db}")
    first = study.trials[0]
    assert first.params == {"lr": 0.01, "weight_decay": 0.0005}
    assert first.user_attrs["start"] == "base" and "start" not in study.trials[1].user_attrs
    assert cli.main(args + ["--trials", "3"]) == 0  # resumed: not queued again
    study = optuna.load_study(study_name="p", storage=f"sqlite:///{db}")
    assert [t.user_attrs.get("start") for t in study.trials] == ["base", None, None]
    assert cli.main(args + ["--trials", "1", "--study-name", "q", "--no-try-preset"]) == 0
    alone = optuna.load_study(study_name="q", storage=f"sqlite:///{db}").trials
    assert "start" not in alone[0].user_attrs


def test_a_resumed_study_does_not_suggest_its_first_trials_again(tmp_path):
    """The sampler's random start is seeded per start of the study: a resume draws new
    settings instead of the first run's over again (a fresh study stays reproducible)."""
    space = {"lr": Param("lr", "float", 1e-3, 5e-2, log=True),
             "dropout": Param("dropout", "float", 0.0, 0.75)}
    params = []
    for name in ("a", "b"):
        job = _job(f"sqlite:///{tmp_path / (name + '.db')}", epochs=1, space=space,
                   pruner="none", enqueue_base=False)
        study = run_study(job, trials=2)
        params.append([t.params for t in study.trials])
    assert params[0] == params[1]  # the same seed, the same study
    study = run_study(job, trials=4)  # resumed
    later = [t.params for t in study.trials[2:]]
    assert [t.params for t in study.trials[:2]] == params[1]
    assert not any(p in params[1] for p in later), later
    assert tune.sampler_seed(0, 1, 0) == 1 and tune.sampler_seed(0, 0, 2) not in (0, 1)


def test_a_storage_whose_tables_another_process_made_at_once_opens(tmp_path, monkeypatch):
    """Two commands starting one new SQLite study together: the one that loses the race to
    create the tables gets "table ... already exists" from SQLAlchemy, and opens the storage
    on a second try instead of failing; an error that stays is still one line."""
    import sqlalchemy.exc
    real = optuna.storages.RDBStorage
    calls = []

    def racing(url, **kw):
        calls.append(url)
        if len(calls) == 1:
            real(url, **kw)  # the other process's tables
            raise sqlalchemy.exc.OperationalError("CREATE TABLE studies", {},
                                                  Exception("table studies already exists"))
        return real(url, **kw)
    monkeypatch.setattr(optuna.storages, "RDBStorage", racing)
    url = f"sqlite:///{tmp_path / 'race.db'}"
    assert tune.open_storage(url, heartbeat=None) is not None and len(calls) == 2

    def broken(url, **kw):
        raise sqlalchemy.exc.OperationalError("SELECT", {}, Exception("disk I/O error"))
    monkeypatch.setattr(optuna.storages, "RDBStorage", broken)
    with pytest.raises(ValueError, match="cannot be opened: .*disk I/O error"):
        tune.open_storage(url, heartbeat=None)


def test_a_worker_stops_once_the_study_holds_its_trials(tmp_path):
    """Two commands on one study each count the trials missing as they start; a worker stops
    once the study holds the asked number, so together they do not run each other's share."""
    job = _job(f"sqlite:///{tmp_path / 'm.db'}", epochs=1, pruner="none", enqueue_base=False)
    run_study(job, trials=1)
    storage = tune.open_storage(job.storage, heartbeat=None)
    tune._tune_worker(job, 5, None, 0, csbm(**SMALL_CSBM), storage, total=3)
    assert len(optuna.load_study(study_name="t", storage=job.storage).trials) == 3


def test_the_starting_values_are_tried_only_inside_the_space():
    from dignn.tune import base_params
    base = TrainConfig(lr=0.01, hidden=64, mu=2.5)
    space = {"lr": Param("lr", "float", 1e-3, 5e-2, log=True),
             "hidden": Param("hidden", "categorical", choices=(32, 64))}
    assert base_params(base, space) == {"lr": 0.01, "hidden": 64}
    assert base_params(base.replace(hidden=128), space) == {}  # not a choice
    assert base_params(base.replace(lr=0.1), space) == {}  # above high
    stepped = {"mu": Param("mu", "float", 1.0, 3.0, step=1.0)}
    assert base_params(base, stepped) == {}  # 2.5 is off the step
    assert base_params(base.replace(mu=2.0), stepped) == {"mu": 2.0}


def test_gin_protocol_is_refused_it_has_no_validation_set(monkeypatch, tmp_path, capsys):
    def read(*_, **__):
        raise AssertionError("data was read before the arguments were checked")
    monkeypatch.setattr(cli, "_load", read)
    assert cli.main(["tune", "--dataset", "mutag", "--protocol", "gin", "--trials", "1"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "--protocol holdout" in err
    assert "dignn train --config best.toml --protocol gin" in err
    with pytest.raises(ValueError, match="no validation set"):
        run_study(_job(None, protocol="gin"), trials=1)


def test_bad_inputs_are_one_line_before_any_data(monkeypatch, tmp_path, capsys):
    def read(*_, **__):
        raise AssertionError("data was read before the arguments were checked")
    monkeypatch.setattr(cli, "_load", read)
    space = tmp_path / "space.toml"
    space.write_text("[lrr]\nlow = 0.001\nhigh = 0.01\n")
    assert cli.main(["tune", "--trials", "1", "--space", str(space)]) == 2
    err = capsys.readouterr().err
    assert "unknown setting 'lrr' (did you mean lr?)" in err and len(err.splitlines()) == 1
    space.write_text("[mu]\nlow = 2.0\nhigh = 1.0\n")
    assert cli.main(["tune", "--trials", "1", "--space", str(space)]) == 2
    assert "low 2.0 is above high 1.0" in capsys.readouterr().err
    monkeypatch.setattr(tune, "optuna_missing", lambda: True)
    for argv in (["tune", "--trials", "1"], ["sweep", "--grid", "mu=2,3"]):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert err.strip() == f"dignn {argv[0]}: error: {tune.OPTUNA_HINT}"
        assert 'pip install "dignn-kernels[tune]"' in err


def test_fixed_and_tuned_at_once_is_refused(small_csbm, tmp_path, capsys):
    assert cli.main(_tune_cli(tmp_path, "--trials", "1", "--lr", "0.01")) == 2
    assert "lr is both fixed by an option and tuned" in capsys.readouterr().err


# ------------------------------------------------------------------------ pruning --

def test_a_hopeless_trial_is_pruned(tmp_path):
    storage = f"sqlite:///{tmp_path / 'p.db'}"
    space = {"lr": Param("lr", "categorical", choices=(0.05, 1e-7))}
    job = _job(storage, epochs=20, space=space, sync_every=1, startup_trials=1,
               warmup_epochs=2)
    study = optuna.create_study(study_name="t", storage=storage, direction="maximize")
    study.enqueue_trial({"lr": 0.05})
    study.enqueue_trial({"lr": 1e-7})  # learns nothing: below the median once it may be pruned
    study = run_study(job, trials=2)
    states = _states(study)
    assert states == [TrialState.COMPLETE, TrialState.PRUNED], states
    pruned = study.trials[1]
    assert 2 <= pruned.last_step < 20 and "test_acc" not in pruned.user_attrs
    assert len(pruned.intermediate_values) == pruned.last_step  # one report per epoch
    # without a pruner the same trial runs to its end
    job = _job(f"sqlite:///{tmp_path / 'n.db'}", epochs=20, space=space, pruner="none")
    study = optuna.create_study(study_name="t", storage=job.storage, direction="maximize")
    study.enqueue_trial({"lr": 0.05})
    study.enqueue_trial({"lr": 1e-7})
    assert _states(run_study(job, trials=2)) == [TrialState.COMPLETE] * 2


# ------------------------------------------------------------------------ workers --

def _check_workers(study, count):
    trials = study.get_trials(deepcopy=False)
    assert sorted(t.number for t in trials) == list(range(count))
    assert [t.state for t in trials] == [TrialState.COMPLETE] * count
    assert {t.user_attrs["worker"] for t in trials} == {0, 1}
    # the preset's own values first, once, in the command's process; the rest in two workers
    first = [t for t in trials if t.user_attrs.get("start") == "base"]
    assert [t.number for t in first] == [0] and first[0].user_attrs["pid"] == os.getpid()
    assert len({t.user_attrs["pid"] for t in trials[1:]} - {os.getpid()}) == 2
    assert all(len(t.user_attrs["test_acc"]) == 1 for t in trials)


def test_two_workers_share_a_sqlite_study(tmp_path):
    job = _job(f"sqlite:///{tmp_path / 'w.db'}")
    study = run_study(job, trials=4, workers=2)
    _check_workers(study, 4)


def _running(storage, name):
    try:
        study = optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        return []
    return [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.RUNNING]


def test_a_killed_workers_trial_is_failed_on_resume(tmp_path):
    storage = f"sqlite:///{tmp_path / 'k.db'}"
    run_study(_job(storage), trials=0)  # the study, empty
    slow = _job(storage, epochs=1_000_000)
    proc = multiprocessing.get_context("spawn").Process(target=tune._tune_worker,
                                                        args=(slow, 1, None, 0))
    proc.start()
    deadline = time.monotonic() + 120
    while not _running(storage, "t"):
        assert proc.is_alive() and time.monotonic() < deadline
        time.sleep(0.2)
    time.sleep(1.5)  # its heartbeat is in the storage
    proc.kill()
    proc.join()
    assert len(_running(storage, "t")) == 1
    time.sleep(2.5)  # older than the grace period (2 heartbeats)
    study = run_study(_job(storage), trials=2)
    states = _states(study)
    assert states[0] == TrialState.FAIL
    assert states[1:] == [TrialState.COMPLETE] * 2 and len(states) == 3


# --------------------------------------------------------------------- PostgreSQL --

def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def postgres():
    """A PostgreSQL server of our own, run as the postgres user (initdb refuses root), on a
    Unix socket in a temporary folder; the URL of a fresh database on it."""
    pytest.importorskip("psycopg2", reason="psycopg2 is not installed (pip install "
                                           "psycopg2-binary)")
    bindir = next((d for d in ("/usr/local/bin", "/usr/lib/postgresql/15/bin")
                   if os.path.exists(f"{d}/initdb")), None)
    if bindir is None or shutil.which("runuser") is None:
        pytest.skip("PostgreSQL's initdb/pg_ctl (or runuser) are not installed")
    import pwd
    try:
        user = pwd.getpwnam("postgres")
    except KeyError:
        pytest.skip("no postgres user to run the server as (initdb refuses root)")
    if os.geteuid() != 0 and os.geteuid() != user.pw_uid:
        pytest.skip("cannot run the server as the postgres user")
    root = tempfile.mkdtemp(prefix="pg", dir="/tmp")
    os.chmod(root, 0o755)
    os.chown(root, user.pw_uid, user.pw_gid)
    data, port = f"{root}/data", _free_port()
    as_pg = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    try:
        made = subprocess.run(as_pg + [f"{bindir}/initdb", "-D", data, "-A", "trust", "-U",
                                       "postgres"], capture_output=True, text=True)
        if made.returncode != 0:
            pytest.skip(f"initdb failed: {made.stderr.strip()[-300:]}")
        started = subprocess.run(as_pg + [f"{bindir}/pg_ctl", "-D", data, "-l",
                                          f"{root}/log", "-w", "-t", "60", "-o",
                                          f"-k {root} -p {port} -c listen_addresses=''",
                                          "start"], capture_output=True, text=True)
        if started.returncode != 0:
            log = Path(f"{root}/log").read_text() if os.path.exists(f"{root}/log") else ""
            pytest.skip(f"the PostgreSQL server did not start: {log.strip()[-300:]}")
        import psycopg2
        conn = psycopg2.connect(dbname="postgres", user="postgres", host=root, port=port)
        conn.autocommit = True
        conn.cursor().execute("CREATE DATABASE dignn_tune")
        conn.close()
        yield f"postgresql+psycopg2://postgres@/dignn_tune?host={root}&port={port}"
        subprocess.run(as_pg + [f"{bindir}/pg_ctl", "-D", data, "-m", "immediate", "stop"],
                       capture_output=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_two_workers_share_a_postgresql_study(postgres):
    study = run_study(_job(postgres), trials=4, workers=2)
    _check_workers(study, 4)
    assert tune.shown_url(postgres).startswith("postgresql+psycopg2://postgres@/dignn_tune")


# ----------------------------------------------------- dignn sweep as a grid study --

@pytest.mark.parametrize("command", ["tune", "sweep"])
def test_a_failed_worker_is_one_line_that_says_how_to_go_on(small_csbm, tmp_path, monkeypatch,
                                                            capsys, command):
    """A worker killed under the command (exit status -9): one line, exit status 1, naming the
    worker and how to resume (a sweep without --storage: how to make it resumable)."""
    from dignn import sweep

    def killed(*_, **__):
        raise tune.WorkerFailed("worker(s) 1 (exit status -9) failed; the study keeps the "
                                "trials they finished")
    monkeypatch.setattr(tune, "run_study", killed)
    monkeypatch.setattr(sweep, "run_sweep", killed)
    if command == "tune":
        argv = _tune_cli(tmp_path, "--trials", "2", "--workers", "2")
        want = "run the same command again to resume the study"
    else:
        argv = ["sweep", "--grid", "mu=2.5,3", "--splits", "0", "--epochs", "2", "--hidden",
                "8", "--max-iter", "3", "--no-progress", "--workers", "2"]
        want = "give --storage to make a sweep resumable"
    capsys.readouterr()
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"dignn {command}: error: worker(s) 1 (exit status -9) failed")
    assert want in err


def test_sweep_resumes_from_its_storage(small_csbm, tmp_path, monkeypatch, capsys):
    import dignn.training
    db, out = tmp_path / "sweep.db", tmp_path / "sweep.json"
    argv = ["sweep", "--grid", "mu=2.5,3", "--splits", "0", "--epochs", "2", "--hidden", "8",
            "--max-iter", "3", "--no-progress", "--storage", str(db), "--json", str(out)]
    assert cli.main(argv) == 0
    first = json.loads(out.read_text())
    study = optuna.load_study(study_name="dignn-sweep-csbm", storage=f"sqlite:///{db}")
    assert [t.params["setting"] for t in study.trials] == [0, 1]  # in the order listed
    assert _states(study) == [TrialState.COMPLETE] * 2

    def no_training(*_, **__):
        raise AssertionError("a finished setting was trained again")
    monkeypatch.setattr(dignn.training, "train", no_training)
    assert cli.main(argv) == 0  # resumed: both settings are in the study
    again = json.loads(out.read_text())
    assert again["settings"] == first["settings"] and again["chosen"] == first["chosen"]
    capsys.readouterr()
    other = argv[:2] + ["mu=2,3"] + argv[3:]
    assert cli.main(other) == 2
    assert "holds another sweep" in capsys.readouterr().err


def test_sweep_workers_match_one_process(tmp_path):
    from dignn.sweep import run_sweep
    data = csbm(**SMALL_CSBM)
    base = TrainConfig(epochs=2, hidden=8, max_iter=3, mu=3.0, solver="cg")
    settings = [{"mu": 2.5}, {"mu": 3.0}, {"mu": 4.0}]
    alone = run_sweep(data, base, settings, splits=[0], device="cpu")
    shared = run_sweep(data, base, settings, splits=[0], device="cpu", workers=2,
                       storage=f"sqlite:///{tmp_path / 'w.db'}", threads=1,
                       load=functools.partial(csbm, **SMALL_CSBM))
    assert [s.overrides for s in shared.settings] == settings
    assert [s.index for s in shared.settings] == [0, 1, 2]
    for a, b in zip(alone.settings, shared.settings):
        assert b.val_acc == pytest.approx(a.val_acc) and b.best_epoch == a.best_epoch
    assert shared.chosen == alone.chosen and shared.test_acc == pytest.approx(alone.test_acc)
    study = optuna.load_study(study_name="dignn-sweep-csbm",
                              storage=f"sqlite:///{tmp_path / 'w.db'}")
    complete = [t for t in study.trials if t.state == TrialState.COMPLETE]
    assert sorted(t.params["setting"] for t in complete) == [0, 1, 2]


def test_a_killed_sweep_workers_setting_is_trained_on_resume(tmp_path):
    from dignn import sweep
    storage = f"sqlite:///{tmp_path / 'k.db'}"
    settings = [{"mu": 2.5}, {"mu": 3.0}]
    base = TrainConfig(epochs=2, hidden=8, max_iter=3, solver="cg")
    optuna.create_study(study_name="s", storage=storage, direction="maximize")
    slow = sweep._SweepJob(functools.partial(csbm, **SMALL_CSBM), settings,
                           [base.replace(epochs=1_000_000, **s) for s in settings], [0],
                           "holdout", "cpu", False, 10, False, "s", storage, 1, 1)
    proc = multiprocessing.get_context("spawn").Process(target=sweep._sweep_worker,
                                                        args=(slow, 1, 0))
    proc.start()
    deadline = time.monotonic() + 120
    while not _running(storage, "s"):
        assert proc.is_alive() and time.monotonic() < deadline
        time.sleep(0.2)
    time.sleep(1.5)
    proc.kill()
    proc.join()
    time.sleep(2.5)
    result = sweep.run_sweep(csbm(**SMALL_CSBM), base, settings, splits=[0], device="cpu",
                             storage=storage, study_name="s", heartbeat=1)
    assert [s.overrides for s in result.settings] == settings
    trials = optuna.load_study(study_name="s", storage=storage).trials
    assert trials[0].state == TrialState.FAIL and trials[0].params == {"setting": 0}
    complete = [t.params["setting"] for t in trials if t.state == TrialState.COMPLETE]
    assert sorted(complete) == [0, 1]  # the killed setting trained again, once
