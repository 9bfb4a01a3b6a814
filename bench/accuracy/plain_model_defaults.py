"""A newcomer's first model: a plain two-layer network around `FusedImplicitDiffusion` with every
argument of the layer left at its default, trained on the paper's graphs. Records, per dataset
and split, every warning raised (category, message, where), the solver the layer ran, its last
solve's iterations and relative residual, and the test accuracy at the best validation epoch.

    OMP_NUM_THREADS=1 python bench/accuracy/plain_model_defaults.py --data-root ../shared/data \
        --out bench/results/plain_model_defaults.json

The model is what a PyG user writes first: Linear -> ReLU -> dropout -> the implicit layer ->
dropout -> Linear, Adam (lr 0.01, weight decay 5e-4), 200 full-graph epochs, dropout 0.5,
hidden width 64. Nothing of the `dignn` presets is used: the point is the layer's defaults.
"""
import argparse
import sys
import time
import warnings
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import record  # noqa: E402  (bench/record.py: commit, machine, versions; write_json)

import dignn_kernels as dk  # noqa: E402
from dignn import load_dataset  # noqa: E402

DATASETS = ("cora", "chameleon-directed", "cornell5")


class PlainModel(nn.Module):
    """Linear -> ReLU -> dropout -> FusedImplicitDiffusion(hidden) -> dropout -> Linear."""

    def __init__(self, in_features: int, hidden: int, classes: int, dropout: float):
        super().__init__()
        self.lin1 = nn.Linear(in_features, hidden)
        self.diffusion = dk.FusedImplicitDiffusion(hidden)  # every other argument: default
        self.lin2 = nn.Linear(hidden, classes)
        self.dropout = dropout

    def forward(self, x, edge_index):
        # the one-hot facebook100 features are a sparse COO matrix
        h = (torch.sparse.mm(x, self.lin1.weight.t()) + self.lin1.bias if x.is_sparse
             else self.lin1(x))
        h = nn.functional.dropout(h.relu(), self.dropout, self.training)
        h = self.diffusion(h, edge_index)
        return self.lin2(nn.functional.dropout(h, self.dropout, self.training))


def _warning_record(w: warnings.WarningMessage) -> dict:
    return dict(category=w.category.__name__, message=str(w.message)[:300],
                where=f"{Path(w.filename).name}:{w.lineno}")


def train(dataset, split_index: int, epochs: int, seed: int = 0) -> dict:
    torch.manual_seed(seed)
    split = dataset.splits[split_index]
    model = PlainModel(dataset.num_features, 64, dataset.num_classes, 0.5)
    opt = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    x, y, ei = dataset.x, dataset.y, dataset.edge_index
    best_val, test_at_best, best_epoch = -1.0, 0.0, 0
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for epoch in range(1, epochs + 1):
            model.train()
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x, ei)[split.train], y[split.train])
            loss.backward()
            opt.step()
            model.eval()
            with torch.no_grad():
                pred = model(x, ei).argmax(1)
            val = (pred[split.val] == y[split.val]).float().mean().item()
            if val > best_val:
                best_val, best_epoch = val, epoch
                test_at_best = (pred[split.test] == y[split.test]).float().mean().item()
    seconds = time.perf_counter() - start
    layer = model.diffusion
    return dict(split=split_index, epochs=epochs, best_epoch=best_epoch, val_acc=best_val,
                test_acc=test_at_best, final_train_loss=float(loss.detach()),
                solver_used=layer.solver_used, backend_used=layer.backend_used,
                last_iterations=layer.iterations,
                last_relative_residual=layer.relative_residual,
                ms_per_epoch=round(seconds / epochs * 1e3, 1),
                warnings=[_warning_record(w) for w in caught])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", default="../shared/data")
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--datasets", default=",".join(DATASETS))
    parser.add_argument("--splits", default="0", help="comma-separated split indices")
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    commit = record.git_head()  # the code that runs: read before the long run
    records = []
    for name in args.datasets.split(","):
        dataset = load_dataset(name, args.data_root, args.cache_dir)
        for s in (int(i) for i in args.splits.split(",")):
            rec = dict(dataset=name, **train(dataset, s, args.epochs))
            records.append(rec)
            print(name, s, rec["solver_used"], f"test {rec['test_acc']:.4f}",
                  f"{len(rec['warnings'])} warnings", f"{rec['ms_per_epoch']} ms/epoch",
                  flush=True)
    doc = {"schema": "plain_model_defaults/1",
           "command": ["python", "bench/accuracy/plain_model_defaults.py"] + list(
               sys.argv[1:] if argv is None else argv),
           "commit": commit,
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "machine": record.machine(torch.device("cpu"), torch.get_num_threads()),
           "versions": record.versions(),
           "model": "Linear(F, 64) -> ReLU -> dropout 0.5 -> FusedImplicitDiffusion(64) "
                    "-> dropout 0.5 -> Linear(64, C); Adam lr 0.01, weight decay 5e-4",
           "layer": repr(dk.FusedImplicitDiffusion(64)),
           "runs": records,
           "warnings_total": sum(len(r["warnings"]) for r in records)}
    if args.out:
        record.write_json(doc, args.out)
    return doc


if __name__ == "__main__":
    main()
