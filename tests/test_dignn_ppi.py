"""PPI (appendix table tab:tab4): the loader on a tiny stand-in of its raw files, the offline
error, micro-F1, and multi-label training across graphs through ``train`` and ``dignn train``."""
import json
import math
import urllib.error

import pytest
import torch

from dignn import cli
from dignn.catalog import DATASETS
from dignn.data import DatasetUnavailableError, load_dataset
from dignn.data.ppi import PPI_RAW_FILES, PPI_URL
from dignn.presets import PAPER_TABLE6_RW, PAPER_TABLE7_NEURAL, TrainConfig, preset_config
from dignn.training import micro_f1, multilabel_counts, train, train_multilabel_split
from ppi_raw_format import write_ppi_raw

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = TrainConfig(hidden=8, epochs=2, max_iter=5, batch_size=2, dropout=0.1, mu=2.0)


@pytest.fixture(scope="module")
def fixture_root(tmp_path_factory):
    return write_ppi_raw(tmp_path_factory.mktemp("ppi_root"))


@pytest.fixture(scope="module")
def ppi(fixture_root, tmp_path_factory):
    return load_dataset("ppi", fixture_root, tmp_path_factory.mktemp("ppi_cache"))


def _offline(monkeypatch):
    import torch_geometric.data

    def offline(*args, **kwargs):
        raise urllib.error.URLError("network unreachable")
    import torch_geometric.datasets.ppi
    monkeypatch.setattr(torch_geometric.data, "download_url", offline)
    monkeypatch.setattr(torch_geometric.datasets.ppi, "download_url", offline)


def test_loader_on_the_raw_format(ppi, fixture_root):
    assert DATASETS["ppi"] == "multilabel" and ppi.task == "multilabel"
    assert (len(ppi.train), len(ppi.val), len(ppi.test)) == (4, 2, 2)
    assert len(ppi.graphs) == 8 and len(ppi.splits) == 1
    assert (ppi.num_features, ppi.num_labels, ppi.num_classes) == (50, 121, 121)
    for g in ppi.graphs:
        assert g.x.shape == (g.num_nodes, 50) and g.y.shape == (g.num_nodes, 121)
        assert set(g.y.unique().tolist()) == {0.0, 1.0}
        # nodes renumbered per graph, edges both ways, no self-loops
        assert int(g.edge_index.min()) == 0 and int(g.edge_index.max()) == g.num_nodes - 1
        assert g.is_undirected() and not g.has_self_loops()
    assert ppi.splits[0].test.tolist() == [6, 7]
    assert not (fixture_root / "ppi" / "processed").exists()  # the data root is only read


def test_offline_without_files_names_them_and_the_url(tmp_path, monkeypatch):
    _offline(monkeypatch)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DatasetUnavailableError) as err:
        load_dataset("ppi", empty, tmp_path / "cache")
    message = str(err.value)
    assert PPI_URL in message and "--data-root" in message
    assert all(name in message for name in PPI_RAW_FILES)
    # one file short: the message says which
    root = write_ppi_raw(tmp_path / "partial")
    (root / "ppi" / "raw" / "valid_labels.npy").unlink()
    with pytest.raises(DatasetUnavailableError,
                       match=r"missing from the cache: ppi/raw/valid_labels\.npy"):
        load_dataset("ppi", root, tmp_path / "cache2")


def test_raw_file_names_and_url_are_pygs():
    from torch_geometric.datasets import PPI
    assert PPI.url == PPI_URL
    assert sorted(PPI.raw_file_names.fget(None)) == sorted(PPI_RAW_FILES)


def test_micro_f1_by_hand():
    logits = torch.tensor([[2.0, -1.0, 0.5],
                           [-0.3, 0.1, -2.0],
                           [1.0, 1.0, -1.0],
                           [0.0, -5.0, 3.0]])  # 0 is not > 0: predicted negative
    target = torch.tensor([[1, 0, 0],
                           [1, 1, 0],
                           [0, 1, 0],
                           [1, 0, 1]])
    # predicted positives: (0,0) (0,2) (1,1) (2,0) (2,1) (3,2); true: (0,0) (1,0) (1,1)
    # (2,1) (3,0) (3,2) -> TP 4: (0,0) (1,1) (2,1) (3,2); FP 2: (0,2) (2,0); FN 2: (1,0) (3,0)
    counts = multilabel_counts(logits, target)
    assert counts.dtype == torch.float64 and counts.tolist() == [4, 2, 2, 4]
    assert float(micro_f1(counts)) == pytest.approx(2 * 4 / (2 * 4 + 2 + 2))
    # counts of batches add up to the counts of the whole
    halves = multilabel_counts(logits[:2], target[:2]) + multilabel_counts(logits[2:],
                                                                           target[2:])
    assert halves.tolist() == counts.tolist()
    assert float(micro_f1(multilabel_counts(-torch.ones(2, 3), torch.zeros(2, 3)))) == 0.0
    assert math.isnan(float(micro_f1(torch.zeros(4, dtype=torch.float64))))
    assert float(micro_f1(multilabel_counts(target * 2.0 - 1, target))) == 1.0


def test_ppi_presets_are_tables_6_and_7():
    row = dict(mu=2.0, hidden=256, lr=0.01, weight_decay=0, max_iter=50, tol=1e-6,
               dropout=0.1)
    assert PAPER_TABLE7_NEURAL["ppi"] == row and PAPER_TABLE6_RW["ppi"] == row
    for laplacian in ("neural", "rw"):
        c = preset_config("ppi", laplacian, "paper")
        assert (c.input_unit, c.batch_size, c.hidden, c.max_iter) == ("mlp", 2, 256, 50)
        assert preset_config("ppi", laplacian, "tuned") == c


def test_two_epochs_through_train(ppi):
    run = train(ppi, TINY, progress=False, device="cpu")
    assert run.metric == "micro_f1" and len(run.splits) == 1
    s = run.splits[0]
    assert s.metric == "micro_f1" and s.epochs_run == 2 and 1 <= s.best_epoch <= 2
    assert 0.0 <= s.test_acc <= 1.0 and 0.0 <= s.val_acc <= 1.0 and 0.0 <= s.train_acc <= 1.0
    assert len(s.val_history) == 2 and s.val_acc == max(s.val_history)
    record = run.to_json()
    assert record["metric"] == "micro_f1" and "test_acc" not in record
    assert record["test_micro_f1"] == [s.test_acc] and record["val_micro_f1"] == [s.val_acc]


def test_selected_model_scores_the_reported_micro_f1(ppi):
    """The kept model is the selected epoch's: its test-graph predictions give the reported
    test micro-F1, counted over all nodes of both test graphs."""
    config = TINY.replace(epochs=6, lr=0.05)
    result = train_multilabel_split(ppi, config, 0, progress=False, keep_model=True)
    model = result.model.eval()
    with torch.no_grad():
        logits = torch.cat([model(g.x, g.edge_index) for g in ppi.test])
    target = torch.cat([g.y for g in ppi.test])
    assert float(micro_f1(multilabel_counts(logits, target))) == pytest.approx(result.test_acc)
    assert result.train_acc > 0.6  # learns the training labels (after 1 epoch: ~0.55)


def test_only_the_mlp_input_unit(ppi):
    with pytest.raises(ValueError, match="input_unit='mlp'"):
        train(ppi, TINY.replace(input_unit="adj"), progress=False, device="cpu")


def test_cli_train_ppi_json(fixture_root, tmp_path, capsys):
    out = tmp_path / "ppi.json"
    code = cli.main(["train", "--dataset", "ppi", "--data-root", str(fixture_root),
                     "--cache-dir", str(tmp_path / "cache"), "--epochs", "2", "--hidden", "8",
                     "--max-iter", "5", "--no-progress", "--device", "cpu", "--json",
                     str(out)])
    assert code == 0
    record = json.loads(out.read_text())
    assert record["dataset"] == "ppi" and record["metric"] == "micro_f1"
    assert len(record["test_micro_f1"]) == 1 and 0.0 <= record["test_micro_f1"][0] <= 1.0
    assert 0.0 <= record["val_micro_f1"][0] <= 1.0
    assert record["mean"] == pytest.approx(record["test_micro_f1"][0])
    assert record["config"]["batch_size"] == 2 and record["config"]["input_unit"] == "mlp"
    printed = capsys.readouterr().out
    assert "split 0: test micro-F1" in printed and "ppi (neural): test micro-F1" in printed
    assert "test acc" not in printed
