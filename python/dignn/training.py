"""Training with model selection on validation accuracy.

For each split a fresh model is trained for ``config.epochs`` epochs with Adam (full batch for
node classification, mini-batches of ``config.batch_size`` graphs for graph classification);
after every epoch the model is evaluated and the test accuracy at the epoch of the best
validation accuracy is reported (ties go to the lower validation loss). ``config.patience``
optionally stops a split early. The spectral check (:mod:`dignn.spectral`) runs on the
implicit layer's input before training and after it.
"""
from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from .data import GraphDataset, NodeDataset
from .models import DIGNNGraphClassifier, DIGNNNodeClassifier
from .presets import TrainConfig
from .spectral import check_mu

__all__ = ["SplitResult", "RunResult", "build_model", "train", "train_node_split",
           "train_graph_split"]


@dataclass
class SplitResult:
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
    model: Optional[torch.nn.Module] = field(default=None, repr=False)  # keep_model=True


@dataclass
class RunResult:
    dataset: str
    laplacian: str
    config: TrainConfig
    splits: List[SplitResult] = field(default_factory=list)

    @property
    def test_acc(self) -> List[float]:
        return [s.test_acc for s in self.splits]

    @property
    def mean(self) -> float:
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

    def to_json(self) -> Dict:
        return {
            "dataset": self.dataset,
            "laplacian": self.laplacian,
            "test_acc": self.test_acc,
            "mean": self.mean,
            "std": self.std,
            "splits": [s.split for s in self.splits],
            "val_acc": [s.val_acc for s in self.splits],
            "best_epoch": [s.best_epoch for s in self.splits],
            "seconds": [round(s.seconds, 2) for s in self.splits],
            "lambda_max": [[s.lambda_max_start, s.lambda_max_end] for s in self.splits],
            "test_acc_max_over_epochs": [s.test_acc_max for s in self.splits],
            "config": self.config.as_dict(),
        }


def build_model(dataset: Union[NodeDataset, GraphDataset], config: TrainConfig):
    """The model for ``dataset`` under ``config``. With ``config.spectral_norm`` the neural
    Laplacian's Θχ and Θφ are spectrally normalized (||Θ||_2 = 1, as in the paper's mu
    study), which bounds lambda_max (Theorem "Spectral Range of Delta_Phi")."""
    common = dict(laplacian=config.laplacian, mu=config.mu, max_iter=config.max_iter,
                  tol=config.tol, dropout=config.dropout, backend=config.backend,
                  solver=config.solver)
    if dataset.task == "graph":
        model = DIGNNGraphClassifier(dataset.num_features, config.hidden,
                                     dataset.num_classes, pooling=config.pooling,
                                     node_layers=config.node_layers,
                                     graph_layers=config.graph_layers, **common)
    else:
        model = DIGNNNodeClassifier(dataset.num_features, config.hidden, dataset.num_classes,
                                    input_unit=config.input_unit,
                                    adj_norm=config.adj_norm, num_nodes=dataset.num_nodes,
                                    input_dropout=config.input_dropout,
                                    **common)
    if config.spectral_norm:
        if config.laplacian != "neural":
            raise ValueError("spectral_norm applies to the neural Laplacian's Θχ and Θφ; "
                             "use it with laplacian='neural'")
        from torch.nn.utils.parametrizations import spectral_norm
        spectral_norm(model.diffusion.theta_chi)
        spectral_norm(model.diffusion.theta_phi)
    return model


def _progress(total: int, desc: str, enabled: bool):
    if not enabled:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover - tqdm is a dependency
        return None
    return tqdm(total=total, desc=desc, leave=True, file=sys.stderr, dynamic_ncols=True)


class _Selector:
    """Keeps the test accuracy (and the weights) of the epoch with the best validation
    accuracy."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.state = None
        self.best = (-1.0, math.inf)  # (val acc, val loss)
        self.test_acc = self.train_acc = float("nan")
        self.train_loss = self.test_loss = float("nan")
        self.epoch = 0
        self.test_acc_max = float("nan")
        self.val_history: List[float] = []
        self.test_history: List[float] = []

    def update(self, epoch, val_acc, val_loss, test_acc, train_acc, train_loss,
               test_loss) -> bool:
        if not test_acc <= self.test_acc_max:  # also replaces the initial NaN
            self.test_acc_max = test_acc
        self.val_history.append(val_acc)
        self.test_history.append(test_acc)
        if val_acc > self.best[0] or (val_acc == self.best[0] and val_loss < self.best[1]):
            self.best = (val_acc, val_loss)
            self.test_acc, self.train_acc, self.epoch = test_acc, train_acc, epoch
            self.train_loss, self.test_loss = train_loss, test_loss
            self.state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
            return True
        return False

    def restore(self) -> None:
        """Loads the selected epoch's weights back into the model."""
        if self.state is not None:
            self.model.load_state_dict(self.state)

    def result(self, split, epochs_run, seconds, lam_start, lam_end) -> "SplitResult":
        return SplitResult(split, self.test_acc, self.best[0], self.epoch, epochs_run,
                           seconds, lam_start, lam_end, self.train_acc, self.train_loss,
                           self.test_loss, self.test_acc_max, self.val_history,
                           self.test_history)


def _accuracy(logits: Tensor, y: Tensor) -> float:
    return float((logits.argmax(dim=1) == y).double().mean()) if y.numel() else float("nan")


def _split_setup(dataset, config: TrainConfig, split: int):
    """Split ``split``'s index sets, a fresh model seeded with ``config.seed + split``, and
    its Adam optimizer."""
    torch.manual_seed(config.seed + split)
    model = build_model(dataset, config)
    opt = torch.optim.Adam(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    return dataset.splits[split], model, opt


def train_node_split(dataset: NodeDataset, config: TrainConfig, split: int,
                     progress: bool = True, keep_model: bool = False) -> SplitResult:
    s, model, opt = _split_setup(dataset, config, split)
    x, y, ei = dataset.x, dataset.y, dataset.edge_index
    lam_start = _spectral(model, x, ei, f"{dataset.name} split {split}, at initialization")
    sel = _Selector(model)
    bar = _progress(config.epochs, f"{dataset.name} split {split}", progress)
    start = time.perf_counter()
    epoch = 0
    for epoch in range(1, config.epochs + 1):
        model.train()
        opt.zero_grad()
        loss = F.cross_entropy(model(x, ei)[s.train], y[s.train])
        loss.backward()
        opt.step()
        model.eval()
        with torch.no_grad():
            logits = model(x, ei)
        losses = [float(F.cross_entropy(logits[idx], y[idx])) for idx in
                  (s.train, s.val, s.test)]
        accs = [_accuracy(logits[idx], y[idx]) for idx in (s.train, s.val, s.test)]
        sel.update(epoch, accs[1], losses[1], accs[2], accs[0], losses[0], losses[2])
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{float(loss.detach()):.3f}", val=f"{sel.best[0]:.3f}",
                            test=f"{sel.test_acc:.3f}", refresh=False)
        if config.patience is not None and epoch - sel.epoch >= config.patience:
            break
    seconds = time.perf_counter() - start
    if bar is not None:
        bar.close()
    sel.restore()
    lam_end = _spectral(model, x, ei, f"{dataset.name} split {split}, after training")
    result = sel.result(split, epoch, seconds, lam_start, lam_end)
    result.model = model if keep_model else None
    return result


def _spectral(model, x, edge_index, where: str) -> float:
    model.eval()
    with torch.no_grad():
        h = model.diffusion_input(x, edge_index)
    return check_mu(model.diffusion, h, edge_index, where=where).lambda_max


def _graph_loader(graphs, index: Tensor, batch_size: int, shuffle: bool, seed: int):
    from torch_geometric.loader import DataLoader
    subset = graphs[index]
    gen = torch.Generator().manual_seed(seed) if shuffle else None
    return DataLoader(subset, batch_size=batch_size, shuffle=shuffle, generator=gen)


@torch.no_grad()
def _evaluate_graphs(model, loader):
    model.eval()
    correct, total, loss_sum = 0, 0, 0.0
    for batch in loader:
        logits = model(batch.x, batch.edge_index, batch.batch, batch.num_graphs)
        loss_sum += float(F.cross_entropy(logits, batch.y, reduction="sum"))
        correct += int((logits.argmax(1) == batch.y).sum())
        total += batch.num_graphs
    return correct / max(total, 1), loss_sum / max(total, 1)


def train_graph_split(dataset: GraphDataset, config: TrainConfig, split: int,
                      progress: bool = True, keep_model: bool = False) -> SplitResult:
    s, model, opt = _split_setup(dataset, config, split)
    train_loader = _graph_loader(dataset.graphs, s.train, config.batch_size, True,
                                 config.seed + split)
    eval_loaders = [_graph_loader(dataset.graphs, idx, 1024, False, 0)
                    for idx in (s.train, s.val, s.test)]
    first = next(iter(eval_loaders[0]))
    lam_start = _spectral(model, first.x, first.edge_index,
                          f"{dataset.name} fold {split}, at initialization")
    sel = _Selector(model)
    bar = _progress(config.epochs, f"{dataset.name} fold {split}", progress)
    start = time.perf_counter()
    epoch = 0
    for epoch in range(1, config.epochs + 1):
        model.train()
        total_loss, count = 0.0, 0
        for batch in train_loader:
            if batch.num_graphs < 2:  # batch norm needs more than one graph's nodes
                continue
            opt.zero_grad()
            logits = model(batch.x, batch.edge_index, batch.batch, batch.num_graphs)
            loss = F.cross_entropy(logits, batch.y)
            loss.backward()
            opt.step()
            total_loss += float(loss.detach()) * batch.num_graphs
            count += batch.num_graphs
        (train_acc, train_loss), (val_acc, val_loss), (test_acc, test_loss) = [
            _evaluate_graphs(model, loader) for loader in eval_loaders]
        sel.update(epoch, val_acc, val_loss, test_acc, train_acc, train_loss, test_loss)
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{total_loss / max(count, 1):.3f}",
                            val=f"{sel.best[0]:.3f}", test=f"{sel.test_acc:.3f}",
                            refresh=False)
        if config.patience is not None and epoch - sel.epoch >= config.patience:
            break
    seconds = time.perf_counter() - start
    if bar is not None:
        bar.close()
    sel.restore()
    lam_end = _spectral(model, first.x, first.edge_index,
                        f"{dataset.name} fold {split}, after training")
    result = sel.result(split, epoch, seconds, lam_start, lam_end)
    result.model = model if keep_model else None
    return result


def train(dataset: Union[NodeDataset, GraphDataset], config: TrainConfig,
          splits: Optional[Sequence[int]] = None, progress: bool = True,
          on_split: Optional[Callable[[SplitResult], None]] = None) -> RunResult:
    """Trains one model per split in ``splits`` (default: all) and collects the results;
    ``on_split`` is called after each split (the CLI prints there)."""
    n = len(dataset.splits)
    splits = list(range(n)) if splits is None else list(splits)
    bad = [k for k in splits if not (isinstance(k, int) and 0 <= k < n)]
    if bad or not splits:
        raise ValueError(f"splits must be indices in 0..{n - 1} for {dataset.name} (it has {n} "
                         f"splits), got {splits}")
    run = RunResult(dataset.name, config.laplacian, config)
    fit = train_graph_split if dataset.task == "graph" else train_node_split
    for k in splits:
        result = fit(dataset, config, k, progress)
        run.splits.append(result)
        if on_split is not None:
            on_split(result)
    return run
