"""bench/gpu/gpu_session.sh and the benchmarks' summaries under a time budget, on the CPU.

A GPU is lent to few sessions, for 15 minutes of device time and 10 minutes a command, so the
GPU session is one call that must bring back what it measured however it ends: phases in a
fixed order inside a budget, skipped and recorded when the budget is spent, stopped with
SIGINT at their limit, and a benchmark stopped that way still writes its JSON and the summary
of what it measured (bench/conftest.py). These tests run that machinery here; the phases'
GPU work itself is measured only on a GPU.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SESSION = REPO / "bench" / "gpu" / "gpu_session.sh"


def _child_env(**extra):
    """This environment without pytest-xdist's worker variables: the pytest runs below are
    not xdist workers, and pytest-benchmark disables itself in any process that has
    PYTEST_XDIST_WORKER set (no benchmark JSON)."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")},
            **extra}


def _default_sigint():
    """Run in the child before exec: SIGINT back to its default. An ignored signal stays
    ignored across exec, and pytest-xdist's workers ignore SIGINT, so without this the SIGINT
    these tests send would be lost under `pytest -n`."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _session(tmp_path, *args, **env):
    out = tmp_path / "out"
    proc = subprocess.run(
        ["bash", str(SESSION), *args], capture_output=True, text=True, timeout=300,
        env=_child_env(OUT=str(out), PYTHON=sys.executable, **env), preexec_fn=_default_sigint)
    return proc, out


@pytest.mark.slow  # a subprocess or a compile: seconds; `-m "not slow"` leaves it out
def test_session_records_every_phase_skipped_when_the_budget_is_spent(tmp_path):
    proc, out = _session(tmp_path, "bench,tests,kernels", SESSION_BUDGET="25", RESERVE="20")
    runs = list(out.glob("gpu_*_bench-tests-kernels_run.json"))
    assert len(runs) == 1, (proc.stdout[-3000:], sorted(p.name for p in out.iterdir()))
    run = json.loads(runs[0].read_text())
    assert run["budget_s"] == 25 and run["phases_asked"] == ["bench", "tests", "kernels"]
    names = [p["name"] for p in run["phases"]]
    # a machine without a CUDA build tries to build first (and has no time for it either)
    assert names in (["bench", "tests", "kernels"], ["build", "bench", "tests", "kernels"])
    for phase in run["phases"]:
        assert phase["rc"] is None and phase["status"].startswith("skipped"), phase
        assert run[f"{phase['name']}_rc"] is None
    assert any(p["status"].startswith("skipped: out of time") for p in run["phases"])
    assert "tests" not in run  # no test ran, so no counts
    assert run["versions"] and run["versions"][0].startswith("python ")
    # what comes back from a device call: at most 8 files, no scratch left in OUT
    assert len(list(out.iterdir())) <= 8
    assert not list(out.glob("*.xml")) and not list(out.glob("versions*"))
    assert (out / "session.log").read_text().count("skipped") >= 3


@pytest.mark.slow  # a subprocess: seconds
def test_session_stops_a_phase_at_its_limit_with_sigint(tmp_path):
    # pytest needs more than 3 s to collect the suite, so the tests phase is stopped at its cap
    proc, out = _session(tmp_path, "tests", SESSION_BUDGET="400", TESTS_TIMEOUT="3")
    run = json.loads(next(out.glob("gpu_*_tests_run.json")).read_text())
    tests = [p for p in run["phases"] if p["name"] == "tests"]
    assert len(tests) == 1, run["phases"]
    assert tests[0]["timeout_s"] == 3 and tests[0]["rc"] == 124, tests[0]
    assert tests[0]["status"] == "stopped at its 3 s limit"
    assert tests[0]["seconds"] < 3 + 20  # SIGINT, then SIGKILL 20 s later at the latest
    # SIGINT, not SIGTERM: pytest saw a KeyboardInterrupt and ended its session (writing its
    # JSON and summaries; the toy benchmark below checks those)
    assert "KeyboardInterrupt" in (out / "session.log").read_text()


@pytest.mark.slow  # a subprocess: seconds
@pytest.mark.parametrize("entry", [SESSION, REPO / "bench" / "gpu_session.sh"])
def test_session_refuses_an_unknown_phase(tmp_path, entry):
    """Also through bench/gpu_session.sh, where the developers' guide names the session."""
    out = tmp_path / "out"
    proc = subprocess.run(["bash", str(entry), "tests,benchmarks"], capture_output=True,
                          text=True, timeout=300, env=_child_env(OUT=str(out),
                                                                 PYTHON=sys.executable))
    assert proc.returncode == 2
    assert "unknown phase 'benchmarks'" in proc.stderr
    assert "tests,peers,bench,locality,epochs,kernels" in proc.stderr


def test_the_guide_names_the_staging_script_too():
    text = (REPO / "bench" / "stage_gpu_data.sh").read_text()
    assert 'exec bash "$(dirname "$0")/gpu/stage_gpu_data.sh" "$@"' in text


BENCH_MODULE = '''
import os, signal
import pytest
from conftest import state_goals, summary

MEASURED = {}


def test_first(benchmark):
    benchmark.pedantic(lambda: None, rounds=3, iterations=1)
    MEASURED["first"] = 2.0


def test_second(benchmark):
    if os.environ.get("STOP_IN_SECOND"):
        os.kill(os.getpid(), signal.SIGINT)  # what gpu_session.sh sends when time is up
    benchmark.pedantic(lambda: None, rounds=3, iterations=1)
    MEASURED["second"] = 5.0


def test_summary():
    state_goals(*_summary(), "TOY_SUMMARY")


@summary("TOY_SUMMARY")
def _summary():
    if not MEASURED:
        return None
    lines = [f"{name}: {value} ms" for name, value in MEASURED.items()]
    checks = [(value <= 3.0, f"{name} <= 3 ms: {'met' if value <= 3.0 else 'MISSED'}")
              for name, value in MEASURED.items()]
    return lines, checks
'''


def _toy_bench(tmp_path, **env):
    shutil.copy(REPO / "bench" / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_toy.py").write_text(BENCH_MODULE)
    summary = tmp_path / "summary.txt"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "test_toy.py",
         "--benchmark-json", str(tmp_path / "bench.json")],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env=_child_env(TOY_SUMMARY=str(summary), **env), preexec_fn=_default_sigint)
    names = [b["name"] for b in json.loads((tmp_path / "bench.json").read_text())["benchmarks"]]
    return proc, summary.read_text(), names


@pytest.mark.slow  # a subprocess: seconds
def test_an_interrupted_benchmark_still_states_what_it_measured(tmp_path):
    proc, text, names = _toy_bench(tmp_path, STOP_IN_SECOND="1")
    assert proc.returncode == 2, proc.stdout[-2000:]  # pytest's "interrupted"
    assert names == ["test_first"]
    assert text.startswith("INTERRUPTED")
    assert "first: 2.0 ms" in text and "first <= 3 ms: met" in text
    assert "second" not in text


@pytest.mark.slow  # a subprocess: seconds
def test_a_whole_benchmark_run_states_and_checks_its_goals(tmp_path):
    proc, text, names = _toy_bench(tmp_path)
    assert names == ["test_first", "test_second"]
    assert not text.startswith("INTERRUPTED")
    assert "second <= 3 ms: MISSED" in text
    assert proc.returncode == 1 and "goals missed" in proc.stdout  # the summary test fails


PEER_LINES = r'''
import json, sys
sys.path[:0] = [sys.argv[1] + '/layer', sys.argv[1]]
import test_gpu_speed as speed
record = {"schema": "dignn-peers/1", "results": [
    {"graph": "cornell5", "peer": "dignn-cuda", "status": "ok", "time": {"median_ms": 2.0}},
    {"graph": "cornell5", "peer": "dignn-triton", "status": "ok", "time": {"median_ms": 2.5}},
    {"graph": "cornell5", "peer": "authors", "status": "ok", "time": {"median_ms": 300.0}},
    {"graph": "cornell5", "peer": "torchdeq-fixed_point", "status": "ok",
     "time": {"median_ms": 30.0}},
    {"graph": "cornell5", "peer": "torchdeq-anderson", "status": "ok",
     "time": {"median_ms": 16.0}},
    {"graph": "penn94_like", "peer": "dignn-cuda", "status": "ok", "time": {"median_ms": 3.0}},
    {"graph": "penn94_like", "peer": "authors", "status": "absent: no checkout given"},
    {"graph": "penn94_like", "peer": "torchdeq-anderson", "status": "ok",
     "time": {"median_ms": 60.0}}]}
with open(sys.argv[2], "w") as f:
    json.dump(record, f)
import os
os.environ["DIGNN_PEERS_JSON"] = sys.argv[2]
lines = []
checks = speed._peer_lines(lines)
print(json.dumps({"lines": lines, "checks": checks}))
os.environ["DIGNN_PEERS_JSON"] = sys.argv[2] + ".missing"
lines = []
print(json.dumps({"lines": lines, "checks": speed._peer_lines(lines)}))
'''


def test_the_gpu_summary_takes_peer_ratios_from_one_peers_run(tmp_path):
    """bench/layer/test_gpu_speed.py states its goals against the authors' layer and torchdeq from
    the peers phase's record of the same session (ratios within that one run, the faster
    torchdeq solver), says which peer was absent and why, and states no ratio without it."""
    proc = subprocess.run([sys.executable, "-c", PEER_LINES, str(REPO / "bench"),
                           str(tmp_path / "peers.json")], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path, env=_child_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    present, missing = (json.loads(line) for line in proc.stdout.strip().splitlines()[-2:])
    checks = [text for _, text in present["checks"]]
    assert [ok for ok, _ in present["checks"]] == [True, False, True], checks
    assert checks[0].startswith("cornell5 dignn-cuda (2.00 ms) vs authors (300.0 ms)")
    assert "150.00x (goal >= 120x)" in checks[0]
    # the faster torchdeq solver, 16 ms: 8x, short of the 10x goal
    assert "vs torchdeq-anderson (16.0 ms)" in checks[1] and "8.00x" in checks[1]
    assert "MISSED" in checks[1]
    assert "penn94_like dignn-cuda (3.00 ms) vs torchdeq-anderson" in checks[2]
    assert any("authors not timed (absent: no checkout given)" in line
               for line in present["lines"])
    assert missing["checks"] == []
    assert "no ratio to them is stated" in missing["lines"][0]
