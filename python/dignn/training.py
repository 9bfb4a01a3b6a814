"""Training with model selection on validation accuracy, on any device.

For each split a fresh model is trained for ``config.epochs`` epochs with Adam (full batch for
node classification, mini-batches of ``config.batch_size`` graphs for graph classification);
after every epoch the model is evaluated and the test accuracy at the epoch of the best
validation accuracy is reported (ties go to the lower validation loss). ``config.patience``
optionally stops a split early. The spectral check (:mod:`dignn.spectral`) runs on the
implicit layer's input before training and after it.

Everything of a split lives on ``device``: features, edges, labels, split indices, the model,
the optimizer (fused Adam on a GPU), the evaluation and the model selection. Nothing inside an
epoch is read back to the host: the metrics of each epoch, the best validation accuracy and
the weights of the best epoch are kept on the device (the weights by a conditional copy), and
the host reads one small vector every ``sync_every`` epochs for the progress bar and the
patience test. Selection freezes at the epoch where patience runs out, so the result is the
same as with a check after every epoch; at most ``sync_every - 1`` epochs are trained in vain.
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
from .device import describe_device, resolve_device
from .models import DIGNNGraphClassifier, DIGNNNodeClassifier
from .presets import TrainConfig
from .spectral import check_mu

__all__ = ["SplitResult", "RunResult", "build_model", "train", "train_node_split",
           "train_graph_split"]

# The per-epoch metric vector: accuracy and mean cross-entropy on each index set.
_METRICS = ("train_acc", "val_acc", "test_acc", "train_loss", "val_loss", "test_loss")


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
    ms_per_epoch: float = float("nan")  # wall time of the epoch loop / epochs trained
    backend: Optional[str] = None  # the implicit layer's backend that ran


@dataclass
class RunResult:
    dataset: str
    laplacian: str
    config: TrainConfig
    splits: List[SplitResult] = field(default_factory=list)
    environment: Dict = field(default_factory=dict)  # device, device_name, torch, cuda, ...

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

    @property
    def ms_per_epoch(self) -> float:
        """Mean wall time of an epoch (training step + evaluation) over the splits."""
        times = [s.ms_per_epoch for s in self.splits]
        return sum(times) / len(times) if times else float("nan")

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
            "ms_per_epoch": round(self.ms_per_epoch, 3),
            "ms_per_epoch_per_split": [round(s.ms_per_epoch, 3) for s in self.splits],
            "backend": sorted({s.backend for s in self.splits if s.backend}),
            **self.environment,
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
    """Model selection kept on the device: per epoch one metric vector (see ``_METRICS``) is
    appended, the best (val acc, val loss), its epoch and test accuracy are updated with
    ``torch.where``, and so are copies of the weights of the best epoch. The host reads
    nothing until :meth:`poll` (every few epochs) and :meth:`result` (once, at the end)."""

    def __init__(self, model: torch.nn.Module, device: torch.device,
                 patience: Optional[int]):
        self.model = model
        self.keys = list(model.state_dict().keys())
        self.live = list(model.state_dict().values())  # share storage with the model
        self.saved = [t.detach().clone() for t in self.live]
        f64 = dict(dtype=torch.float64, device=device)
        self.best = torch.tensor([-1.0, math.inf], **f64)  # (val acc, val loss)
        self.best_test = torch.full((), math.nan, **f64)
        self.best_epoch = torch.zeros((), dtype=torch.long, device=device)
        self.stopped_at = torch.zeros((), dtype=torch.long, device=device)  # 0: running
        self.patience = patience
        self.rows: List[Tensor] = []

    @torch.no_grad()
    def update(self, epoch: int, metrics: Tensor) -> None:
        val = metrics[1:5:3]  # (val acc, val loss)
        improved = (val[0] > self.best[0]) | ((val[0] == self.best[0]) &
                                              (val[1] < self.best[1]))
        improved &= self.stopped_at == 0
        self.best = torch.where(improved, val, self.best)
        self.best_test = torch.where(improved, metrics[2], self.best_test)
        self.best_epoch = torch.where(improved, epoch, self.best_epoch)
        for saved, live in zip(self.saved, self.live):
            torch.where(improved, live, saved, out=saved)
        if self.patience is not None:
            out_of_patience = (self.stopped_at == 0) & (epoch - self.best_epoch >=
                                                        self.patience)
            self.stopped_at = torch.where(out_of_patience, epoch, self.stopped_at)
        self.rows.append(metrics)

    def poll(self, train_loss: Tensor) -> List[float]:
        """One host read: [training loss, best val acc, its test acc, stopped-at epoch]."""
        return torch.stack([train_loss.detach().double().reshape(()), self.best[0],
                            self.best_test, self.stopped_at.double()]).tolist()

    def result(self, split: int, seconds: float, epochs_trained: int, lam_start: float,
               lam_end: float) -> SplitResult:
        history = torch.stack(self.rows).cpu() if self.rows else torch.empty(0, 6)
        best, stopped = int(self.best_epoch), int(self.stopped_at)
        epochs_run = stopped or history.size(0)
        history = history[:epochs_run]
        row = history[best - 1].tolist() if best > 0 else [math.nan] * 6
        test = history[:, 2]
        finite = test[~torch.isnan(test)]
        return SplitResult(split, row[2], row[1], best, epochs_run, seconds, lam_start,
                           lam_end, train_acc=row[0], train_loss=row[3], test_loss=row[5],
                           test_acc_max=float(finite.max()) if finite.numel() else math.nan,
                           val_history=history[:, 1].tolist(),
                           test_history=test.tolist(),
                           ms_per_epoch=1000.0 * seconds / max(epochs_trained, 1))

    def restore(self) -> None:
        """Loads the selected epoch's weights back into the model."""
        if int(self.best_epoch) > 0:
            self.model.load_state_dict(dict(zip(self.keys, self.saved)))


class _NodeSets:
    """The train, validation and test nodes of a split as one index vector, so that an
    epoch's six metrics take a handful of kernels and no host read."""

    def __init__(self, split):
        parts = (split.train, split.val, split.test)
        self.index = torch.cat(parts)
        self.sizes = [t.numel() for t in parts]

    def metrics(self, logits: Tensor, y: Tensor) -> Tensor:
        logits, y = logits[self.index], y[self.index]
        loss = F.cross_entropy(logits, y, reduction="none").double()
        correct = (logits.argmax(dim=1) == y).double()
        per_set = [part.sum(0) / part.size(0) for part in  # 0/0 = NaN for an empty set
                   torch.stack([correct, loss], dim=1).split(self.sizes)]
        return torch.stack(per_set).t().reshape(6)


def _split_setup(dataset, config: TrainConfig, split: int, device: torch.device,
                 compile_model: bool):
    """A fresh model seeded with ``config.seed + split`` on ``device`` and its Adam optimizer
    (fused on a GPU); the model's forward compiled when asked."""
    torch.manual_seed(config.seed + split)
    model = build_model(dataset, config).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=config.lr, weight_decay=config.weight_decay,
                           fused=device.type == "cuda" or None)
    if compile_model:
        model.compile()
    return model, opt


def _check_sync_every(sync_every: int) -> None:
    if isinstance(sync_every, bool) or not isinstance(sync_every, int) or sync_every < 1:
        raise ValueError(f"sync_every must be a positive integer, got {sync_every!r}")


def _run_epochs(config: TrainConfig, model, sel: _Selector, bar, sync_every: int,
                epoch_fn: Callable[[], Tensor], device: torch.device):
    """The epoch loop shared by node and graph tasks: ``epoch_fn`` trains one epoch and
    returns (training loss, metric vector), both on the device. Returns (seconds, epochs)."""
    start = time.perf_counter()
    epoch = 0
    for epoch in range(1, config.epochs + 1):
        loss, metrics = epoch_fn()
        sel.update(epoch, metrics)
        if epoch % sync_every == 0 or epoch == config.epochs:
            loss_value, best_val, best_test, stopped = sel.poll(loss)
            if bar is not None:
                bar.update(epoch - bar.n)
                bar.set_postfix(loss=f"{loss_value:.3f}", val=f"{best_val:.3f}",
                                test=f"{best_test:.3f}", refresh=False)
            if stopped:
                break
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start, epoch


def train_node_split(dataset: NodeDataset, config: TrainConfig, split: int,
                     progress: bool = True, keep_model: bool = False, *,
                     device: Union[str, torch.device, None] = None,
                     compile_model: bool = False, sync_every: int = 10) -> SplitResult:
    """Trains and selects one model on split ``split``. ``device``: where (default: where
    ``dataset`` is); ``compile_model``: ``torch.compile`` the model's forward;
    ``sync_every``: epochs between host reads (progress bar, patience)."""
    _check_sync_every(sync_every)
    device = dataset.device if device is None else resolve_device(device)
    dataset = dataset.to(device)
    model, opt = _split_setup(dataset, config, split, device, compile_model)
    s = dataset.splits[split]
    x, y, ei = dataset.x, dataset.y, dataset.edge_index
    sets = _NodeSets(s)
    lam_start = _spectral(model, x, ei, f"{dataset.name} split {split}, at initialization")
    sel = _Selector(model, device, config.patience)
    bar = _progress(config.epochs, f"{dataset.name} split {split}", progress)

    def epoch_fn():
        model.train()
        opt.zero_grad()
        loss = F.cross_entropy(model(x, ei)[s.train], y[s.train])
        loss.backward()
        opt.step()
        model.eval()
        with torch.no_grad():
            return loss.detach(), sets.metrics(model(x, ei), y)

    seconds, trained = _run_epochs(config, model, sel, bar, sync_every, epoch_fn, device)
    if bar is not None:
        bar.close()
    sel.restore()
    lam_end = _spectral(model, x, ei, f"{dataset.name} split {split}, after training")
    result = sel.result(split, seconds, trained, lam_start, lam_end)
    result.backend = model.diffusion.backend_used
    result.model = model if keep_model else None
    return result


def _spectral(model, x, edge_index, where: str) -> float:
    model.eval()
    with torch.no_grad():
        h = model.diffusion_input(x, edge_index)
    return check_mu(model.diffusion, h, edge_index, where=where).lambda_max


def _graph_loader(graphs, index: Tensor, batch_size: int, shuffle: bool, seed: int,
                  device: torch.device):
    from torch_geometric.loader import DataLoader
    subset = graphs[index.cpu()]
    gen = torch.Generator().manual_seed(seed) if shuffle else None
    return DataLoader(subset, batch_size=batch_size, shuffle=shuffle, generator=gen,
                      pin_memory=device.type == "cuda")


def _batches(loader, device: torch.device):
    for batch in loader:
        yield batch.to(device, non_blocking=True)


@torch.no_grad()
def _evaluate_graphs(model, loader, device: torch.device) -> Tensor:
    """(accuracy, mean loss) over ``loader``'s graphs, as a float64 pair on the device."""
    model.eval()
    sums = torch.zeros(3, dtype=torch.float64, device=device)  # correct, loss, graphs
    for batch in _batches(loader, device):
        logits = model(batch.x, batch.edge_index, batch.batch, batch.num_graphs)
        sums += torch.stack([(logits.argmax(1) == batch.y).sum().double(),
                             F.cross_entropy(logits, batch.y, reduction="sum").double(),
                             torch.tensor(float(batch.num_graphs), dtype=torch.float64,
                                          device=device)])
    return sums[:2] / sums[2]


def train_graph_split(dataset: GraphDataset, config: TrainConfig, split: int,
                      progress: bool = True, keep_model: bool = False, *,
                      device: Union[str, torch.device, None] = None,
                      compile_model: bool = False, sync_every: int = 10) -> SplitResult:
    """As :func:`train_node_split` for graph classification: batches of graphs are copied to
    ``device`` (default: the CPU) from pinned memory, without blocking."""
    _check_sync_every(sync_every)
    device = torch.device("cpu") if device is None else resolve_device(device)
    model, opt = _split_setup(dataset, config, split, device, compile_model)
    s = dataset.splits[split]
    train_loader = _graph_loader(dataset.graphs, s.train, config.batch_size, True,
                                 config.seed + split, device)
    eval_loaders = [_graph_loader(dataset.graphs, idx, 1024, False, 0, device)
                    for idx in (s.train, s.val, s.test)]
    first = next(iter(eval_loaders[0])).to(device)
    lam_start = _spectral(model, first.x, first.edge_index,
                          f"{dataset.name} fold {split}, at initialization")
    sel = _Selector(model, device, config.patience)
    bar = _progress(config.epochs, f"{dataset.name} fold {split}", progress)

    def epoch_fn():
        model.train()
        total = torch.zeros(2, dtype=torch.float64, device=device)  # loss sum, graphs
        for batch in _batches(train_loader, device):
            if batch.num_graphs < 2:  # batch norm needs more than one graph's nodes
                continue
            opt.zero_grad()
            logits = model(batch.x, batch.edge_index, batch.batch, batch.num_graphs)
            loss = F.cross_entropy(logits, batch.y)
            loss.backward()
            opt.step()
            total += torch.stack([loss.detach().double() * batch.num_graphs,
                                  torch.tensor(float(batch.num_graphs), dtype=torch.float64,
                                               device=device)])
        acc_loss = torch.stack([_evaluate_graphs(model, loader, device)
                                for loader in eval_loaders])  # rows: train, val, test
        return total[0] / total[1].clamp_min(1), acc_loss.t().reshape(6)

    seconds, trained = _run_epochs(config, model, sel, bar, sync_every, epoch_fn, device)
    if bar is not None:
        bar.close()
    sel.restore()
    lam_end = _spectral(model, first.x, first.edge_index,
                        f"{dataset.name} fold {split}, after training")
    result = sel.result(split, seconds, trained, lam_start, lam_end)
    result.backend = model.diffusion.backend_used
    result.model = model if keep_model else None
    return result


def train(dataset: Union[NodeDataset, GraphDataset], config: TrainConfig,
          splits: Optional[Sequence[int]] = None, progress: bool = True,
          on_split: Optional[Callable[[SplitResult], None]] = None, *,
          device: Union[str, torch.device, None] = "auto", compile_model: bool = False,
          sync_every: int = 10) -> RunResult:
    """Trains one model per split in ``splits`` (default: all) on ``device`` (``"auto"``: the
    GPU when one is visible) and collects the results; ``on_split`` is called after each
    split (the CLI prints there). ``compile_model`` compiles each model's forward with
    ``torch.compile``; ``sync_every`` is the number of epochs between host reads."""
    n = len(dataset.splits)
    splits = list(range(n)) if splits is None else list(splits)
    bad = [k for k in splits if not (isinstance(k, int) and 0 <= k < n)]
    if bad or not splits:
        raise ValueError(f"splits must be indices in 0..{n - 1} for {dataset.name} (it has {n} "
                         f"splits), got {splits}")
    _check_sync_every(sync_every)
    device = resolve_device(device)
    if dataset.task == "node":
        dataset = dataset.to(device)
    run = RunResult(dataset.name, config.laplacian, config,
                    environment={**describe_device(device), "threads": torch.get_num_threads(),
                                 "compiled": bool(compile_model)})
    fit = train_graph_split if dataset.task == "graph" else train_node_split
    for k in splits:
        result = fit(dataset, config, k, progress, device=device, compile_model=compile_model,
                     sync_every=sync_every)
        run.splits.append(result)
        if on_split is not None:
            on_split(result)
    return run
