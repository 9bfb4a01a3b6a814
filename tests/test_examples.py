"""The scripts of examples/ run as a user runs them: each in its own process with ``--quick``
(a small generated graph, a few epochs), the partitioned one under torchrun with 2 CPU ranks
(gloo). Each must exit with status 0 and print a final ``test accuracy: X`` above chance."""
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SCRIPTS = ["node_classification.py", "graph_classification.py", "your_own_graph.py",
           "partitioned_training.py"]
# The child imports the same dignn and dignn_kernels as this process.
CHILD_PATH = os.pathsep.join(
    [str(Path(__import__(m).__file__).resolve().parents[1]) for m in ("dignn", "dignn_kernels")]
    + [os.environ.get("PYTHONPATH", "")])
TIMEOUT = 240  # seconds; each run takes 5-15 s on 2 free cores


def _run(command, cwd):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": CHILD_PATH}
    return subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT, cwd=cwd,
                          env=env)


def _final_accuracy(proc) -> float:
    """The accuracy of the last line, after checking that the run succeeded."""
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    found = re.findall(r"^test accuracy: ([0-9.]+) ", proc.stdout, re.MULTILINE)
    assert found, proc.stdout[-2000:]
    assert proc.stdout.rstrip().splitlines()[-1].startswith("test accuracy: ")
    return float(found[-1])


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_runs_without_training(script, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", [script, "--help"])
    with pytest.raises(SystemExit) as stop:
        runpy.run_path(str(EXAMPLES / script), run_name="__main__")
    assert stop.value.code == 0
    assert "--quick" in capsys.readouterr().out


def test_node_classification_quick(tmp_path):
    proc = _run([sys.executable, str(EXAMPLES / "node_classification.py"), "--quick"], tmp_path)
    assert 0.4 < _final_accuracy(proc) <= 1.0  # 4 classes: chance is 0.25
    assert "cg:" in proc.stdout  # solver="auto" on an undirected graph


def test_graph_classification_quick(tmp_path):
    proc = _run([sys.executable, str(EXAMPLES / "graph_classification.py"), "--quick"],
                tmp_path)
    assert 0.7 < _final_accuracy(proc) <= 1.0  # rings against stars: chance is 0.5
    assert proc.stdout.startswith("rings-stars: 60 graphs")


def test_your_own_graph_quick_writes_predictions(tmp_path):
    out = tmp_path / "predictions.csv"
    proc = _run([sys.executable, str(EXAMPLES / "your_own_graph.py"), "--quick",
                 "--demo-dir", str(tmp_path / "demo"), "--out", str(out)], tmp_path)
    assert 0.4 < _final_accuracy(proc) <= 1.0  # 4 classes
    assert (tmp_path / "demo" / "nodes.csv").is_file()
    lines = out.read_text().splitlines()
    assert lines[0] == "id,predicted,probability" and len(lines) == 1 + 300
    node, predicted, probability = lines[1].split(",")
    assert node == "person0" and 0 <= int(predicted) < 4 and 0.25 <= float(probability) <= 1


def test_your_own_graph_refuses_half_the_files(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["your_own_graph.py", "--nodes", "nodes.csv"])
    with pytest.raises(SystemExit, match="give both --nodes and --edges"):
        runpy.run_path(str(EXAMPLES / "your_own_graph.py"), run_name="__main__")


@pytest.mark.xdist_group("rendezvous")  # a localhost port (tests/conftest.py)
def test_partitioned_training_quick_on_two_ranks(tmp_path):
    proc = _run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                 "--nproc-per-node", "2", str(EXAMPLES / "partitioned_training.py"),
                 "--quick"], tmp_path)
    assert 0.4 < _final_accuracy(proc) <= 1.0  # 4 classes
    assert "over 2 rank(s)" in proc.stdout
    assert proc.stdout.count("test accuracy:") == 1  # rank 0 alone prints
