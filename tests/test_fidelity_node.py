"""bench/peers/fidelity_node.py and bench/peers/fidelity_common.py, the side-by-side training of the
authors' node classification code and dignn: their printed log read back (best epochs,
accuracies, times), their data layout staged from the shared files (Chameleon's feature file
written from the npz release, value for value), their modules imported from a checkout and
removed again, the paired statistics, and the docs' table rendered from a record. The
authors' real code runs only in the harness itself (bench/results/fidelity_*.json)."""
import json
import math
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import DATA_ROOT, load_module

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench" / "peers"))

import fidelity_common as fc  # noqa: E402
import fidelity_node as fn  # noqa: E402


LOG = """cora Neural
Epoch: 001, Train: 0.2000, Val: 0.3000, Test: 0.2500
Epoch: 002, Train: 0.5000, Val: 0.3000, Test: 0.2500
Epoch: 003, Train: 0.7000, Val: 0.6500, Test: 0.6000
Epoch: 004, Train: 0.8000, Val: 0.6500, Test: 0.6000
Neural, cora, Accuacy: 0.6000, Time: 2.0000
Epoch: 001, Train: 0.1000, Val: 0.4000, Test: 0.3500
Epoch: 002, Train: 0.2000, Val: 0.5000, Test: 0.5500
Epoch: 003, Train: 0.3000, Val: 0.5000, Test: 0.5500
Epoch: 004, Train: 0.4000, Val: 0.5000, Test: 0.5500
Neural, cora, Accuacy: 0.5500, Time: 1.0000
tensor([60., 55.])
"""


def test_their_log_is_read_back():
    runs = fn.parse_log(LOG, epochs=4)
    assert [r["acc"] for r in runs] == pytest.approx([60.0, 55.0])
    # the best epoch is the last one whose validation accuracy beat every earlier one
    assert [r["best_epoch"] for r in runs] == [3, 2]
    assert [r["ms_per_epoch"] for r in runs] == pytest.approx([500.0, 250.0])
    assert runs[1]["history"][1] == pytest.approx([0.2, 0.5, 0.55])
    assert len(runs[0]["history"]) == 4
    with pytest.raises(ValueError, match="no finished run"):
        fn.parse_log(LOG.split("Neural, cora, Acc")[0], epochs=4)


def test_paired_statistics():
    out = fc.paired([80.0, 82.0, 84.0], [79.0, 80.0, 84.0])
    assert out["mean_diff"] == pytest.approx(1.0)
    assert out["se"] == pytest.approx(1.0 / math.sqrt(3))  # differences 1, 2, 0: sd 1
    assert out["within"] and out["n"] == 3
    lower = fc.paired([70.0, 71.0, 72.0], [80.0, 80.5, 81.0])
    assert lower["mean_diff"] == pytest.approx(-9.5) and not lower["within"]
    with pytest.raises(ValueError, match="equally long"):
        fc.paired([1.0], [1.0, 2.0])


@pytest.mark.skipif(not (DATA_ROOT / "chameleon" / "raw" / "chameleon.npz").is_file(),
                    reason="the shared data folder is not here")
def test_chameleon_is_staged_as_their_loader_reads_it(tmp_path):
    fn.stage_their_data("chameleon-directed", DATA_ROOT, tmp_path)
    raw = tmp_path / "data" / "chameleon" / "raw"
    npz = np.load(DATA_ROOT / "chameleon" / "raw" / "chameleon.npz")
    lines = (raw / "out1_node_feature_label.txt").read_text().split("\n")
    assert lines[0].split("\t")[0] == "node_id" and lines[-1] == ""
    rows = [line.split("\t") for line in lines[1:-1]]
    assert len(rows) == npz["node_features"].shape[0]
    x = np.array([[float(v) for v in r[1].split(",")] for r in rows])
    assert np.array_equal(x, npz["node_features"])  # value for value, float64 repr
    assert [int(r[2]) for r in rows] == npz["node_labels"].tolist()
    for k in (0, 9):
        split = np.load(raw / f"chameleon_split_0.6_0.2_{k}.npz")
        assert np.array_equal(split["val_mask"], npz["val_masks"][k])
    assert (raw / "out1_graph_edges.txt").is_symlink()
    with pytest.raises(ValueError, match="no authors' layout"):
        fn.stage_their_data("mutag", DATA_ROOT, tmp_path / "other")


# A stand-in for the authors' checkout: the same module names (main with main/build_model,
# data with get_data, models, a src package), minimal code of our own.
FAKE_MAIN = '''
import torch
from data import get_data
from models import Tiny


def build_model(args, *shape):
    return Tiny()


def main(args):
    get_data("data", args.input, None)
    for run in range(args.runs):
        model = build_model(args)
        for epoch in range(1, args.epochs + 1):
            val = min(0.9, 0.1 * epoch + 0.05 * run)
            print(f"Epoch: {epoch:03d}, Train: 0.5000, Val: {val:.4f}, Test: {val:.4f}")
        print(f"Neural, {args.input}, Accuacy: {val:.4f}, Time: 0.5000")
'''
FAKE_DATA = '''
import os


def get_data(root, name, device):
    assert os.path.isdir(root), "their code reads data/ relative to its folder"
    return name
'''
FAKE_MODELS = '''
import torch
from src.layers import marker


class Tiny(torch.nn.Module):
    pass
'''


def _fake_checkout(root: Path) -> Path:
    node = root / "nodeclassification"
    (node / "src").mkdir(parents=True)
    (node / "main.py").write_text(textwrap.dedent(FAKE_MAIN))
    (node / "data.py").write_text(textwrap.dedent(FAKE_DATA))
    (node / "models.py").write_text(textwrap.dedent(FAKE_MODELS))
    (node / "src" / "__init__.py").write_text("")
    (node / "src" / "layers.py").write_text("import torch\nmarker = 1\n")
    (root / "graphclassification").mkdir()
    return root


def test_their_main_runs_from_a_checkout_and_leaves_nothing_behind(tmp_path):
    root = _fake_checkout(tmp_path / "DIGNN")
    before = {k for k in sys.modules if k.split(".")[0] in ("src", "main", "data", "models")}
    authors = fc.import_authors(root, "nodeclassification", ("models", "main", "data"))
    after = {k for k in sys.modules if k.split(".")[0] in ("src", "main", "data", "models")}
    assert after == before  # their top-level names are removed again
    assert authors.info["part"] == "nodeclassification"
    cwd = tmp_path / "run"
    (cwd / "data").mkdir(parents=True)
    args = fn.their_args("cora", {"lr": 0.01, "weight_decay": 0, "hidden": 8, "dropout": 0.5,
                                  "max_iter": 3, "tol": 1e-6, "mu": 2.0}, epochs=6, runs=2)
    runs = fn.run_authors(authors, "cora", cwd, args, "theirs")
    assert [r["best_epoch"] for r in runs] == [6, 6]
    assert [r["acc"] for r in runs] == pytest.approx([60.0, 65.0])
    assert runs[0]["ms_per_epoch"] == pytest.approx(500 / 6)
    with pytest.raises(FileNotFoundError, match="not found"):
        fc.import_authors(root, "nodeclassification", ("baselines",))
    with pytest.raises(ValueError, match="part must be"):
        fc.import_authors(root, "ppi", ("main",))
    with pytest.raises(FileNotFoundError, match="nodeclassification"):
        fc.import_authors(tmp_path, "nodeclassification", ("main",))


def test_the_docs_render_a_record(tmp_path, monkeypatch):
    render = load_module("dignn_docs_render_fidelity", REPO / "docs" / "render_results.py")
    splits = [{"split": k, "ours_acc": 80.0 + k, "theirs_acc": 79.0 + 2 * k,
               "ours_best_epoch": 10 + k, "theirs_best_epoch": 100,
               "ours_ms_per_epoch": 50.0, "theirs_ms_per_epoch": 400.0} for k in range(3)]
    record = {"schema": fn.SCHEMA, "command": ["python", "bench/peers/fidelity_node.py"],
              "commit": "abcdef0123", "date": "2026-11-28T01:00:00Z", "variant": "swapped",
              "machine": {"cpu": "Test CPU", "threads": 1, "device": "cpu"},
              "datasets": {"cora": {"paper": 86.68, "protocol": "best validation epoch",
                                    "splits": splits,
                                    "paired": fc.paired([s["ours_acc"] for s in splits],
                                                        [s["theirs_acc"] for s in splits])}}}
    (tmp_path / "fidelity_cora.json").write_text(json.dumps(record))
    monkeypatch.setattr(render, "RESULTS", tmp_path)
    text = render.fidelity()
    row = next(line for line in text.splitlines() if line.startswith("| cora"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "3" and cells[3] == "tuned"
    assert cells[4] == "81.00 +- 2.00" and cells[5] == "81.00 +- 1.00"
    assert cells[6] == "+0.00 +- 0.58" and cells[7] == "86.68"
    assert cells[8] == "100 / 11" and cells[9] == "400 / 50"
    assert "their code, this layer swapped in" in text and "abcdef0" in text


def test_every_preset_says_what_it_reproduces_with_committed_records():
    from dignn.presets import REPRODUCES, preset_config
    assert {"cora", "chameleon-directed", "amherst41", "cornell5", "mutag", "nci1"} <= \
        set(REPRODUCES)
    for name, entry in REPRODUCES.items():
        preset_config(name)  # a dataset with a preset
        assert entry["tuned"] and entry["paper"] and entry["command"].startswith("dignn train")
        assert f"--dataset {name} " in entry["command"] + " "
        for record in entry["records"]:
            path = REPO / "bench" / "results" / record
            assert path.is_file(), f"{name}: {record} is not committed"
            if record.startswith("fidelity_"):
                assert name in json.loads(path.read_text())["datasets"], (name, record)
