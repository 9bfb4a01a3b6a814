"""Training a node model full-graph across processes: ``torchrun --nproc-per-node N -m dignn
train --distributed ...`` (issue 15).

Every rank loads the dataset and the same partition of its nodes
(:func:`dignn_kernels.distributed.partition`, ``contiguous`` or ``metis``, computed once on
rank 0 and shared, or read from a file written once), keeps the features, labels and split
nodes of the nodes it owns, and runs the model on them: the implicit layer on its piece of the
graph (:class:`~dignn_kernels.distributed.DistributedGraph`, halo rows exchanged in every
sweep), the input unit's A X or A from its owned rows of A (computed once from the whole
graph, which every rank loaded), batch norm over the global node set
(:class:`SyncedBatchNorm`), and every dropout with the owned rows of the mask a single process
draws for the whole graph (:class:`~dignn.models.NodeShard`), so that each rank's generator
stays in step with the single-process run. The loss is the sum of the ranks' losses over
their training nodes divided by the global number of training nodes; after the backward the
parameter gradients are summed over the ranks in one all-reduce in a fixed order
(:func:`~dignn_kernels.distributed.all_reduce_gradients`, not DDP: its buckets would
interleave with the layer's own collectives); every rank then takes the same Adam step. The
evaluation sums correct predictions and losses over the ranks (one all-reduce per epoch,
together with the training loss) and divides by the global set sizes, so that the model
selection, run on every rank, sees the single-process numbers. On the CPU (gloo), per-epoch
losses equal the single-process run's to rounding (tested for 1 to 4 ranks: 1e-10 relative
with ``--dtype float64``).

Rank 0 alone prints, writes ``--json`` and the checkpoint (the state is the same on every
rank: the weights, the optimizer and the generators); every rank reads it to resume. A rank
that dies or a collective that takes longer than ``--timeout`` makes the others stop with a
:class:`~dignn_kernels.distributed.CollectiveError` instead of hanging. The spectral check is
not run (it would need the whole graph on one process): ``lambda_max`` is NaN.
"""
from __future__ import annotations

import datetime
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Union

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from .data import NodeDataset
from .data.core import Split
from .files import write_atomically
from .models import NodeShard, adjacency_matrix
from .presets import TrainConfig

__all__ = ["SyncedBatchNorm", "sync_batch_norms", "DistributedRun", "init_distributed",
           "load_partition", "shard_node_dataset", "check_node_task", "PARTITION_METHODS"]

PARTITION_METHODS = ("contiguous", "metis")


# -------------------------------------------------------------------- batch norm --

class _SyncedBatchNormFunction(torch.autograd.Function):
    """Batch norm in training mode over the rows of every rank: the mean and the (biased)
    variance of the global batch from all-reduced sums (two passes: the mean, then the
    squared deviations, accumulated in float64), and the backward's two global means.
    Returns (output, [mean; biased variance; global row count] in float64)."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], eps: float,
                group):
        xd = x.double()
        first = torch.cat([xd.sum(0), xd.new_full((1,), float(x.size(0)))])
        _all_reduce(first, group)
        count = first[-1:]
        mean = first[:-1] / count
        centered = xd - mean
        second = (centered * centered).sum(0)
        _all_reduce(second, group)
        var = second / count
        invstd = torch.rsqrt(var + eps)
        xhat = (centered * invstd).to(x.dtype)
        out = xhat if weight is None else xhat * weight + bias
        ctx.save_for_backward(xhat, invstd.to(x.dtype), weight, count)
        ctx.group = group
        stats = torch.cat([mean, var, count])
        ctx.mark_non_differentiable(stats)
        return out, stats

    @staticmethod
    def backward(ctx, grad_out: Tensor, _stats):
        xhat, invstd, weight, count = ctx.saved_tensors
        channels = xhat.size(1)
        sums = torch.cat([grad_out.sum(0), (grad_out * xhat).sum(0)]).double()
        grad_weight = grad_bias = None
        if weight is not None:  # this rank's share, summed over the ranks with every gradient
            grad_bias = sums[:channels].to(grad_out.dtype, copy=True)  # sums is reduced next
            grad_weight = sums[channels:].to(grad_out.dtype, copy=True)
        _all_reduce(sums, ctx.group)
        mean_g, mean_gx = (sums / count).to(grad_out.dtype).split(channels)
        scale = invstd if weight is None else invstd * weight
        grad_x = (grad_out - mean_g - xhat * mean_gx) * scale
        return grad_x, grad_weight, grad_bias, None, None


def _all_reduce(tensor: Tensor, group) -> None:
    from dignn_kernels.distributed.exchange import run_collective
    run_collective("batch norm all-reduce", group, lambda: dist.all_reduce(tensor, group=group))


class SyncedBatchNorm(nn.BatchNorm1d):
    """``BatchNorm1d`` whose training-mode statistics are those of the rows of every rank of
    ``group`` (torch's ``SyncBatchNorm`` takes GPU tensors only). The same parameters and
    buffers as ``BatchNorm1d`` (state dicts are interchangeable); the running mean and the
    unbiased running variance are updated as ``BatchNorm1d`` updates them, from the global
    statistics, so that they are the same on every rank. In evaluation mode (running
    statistics) it is ``BatchNorm1d``."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: Optional[float] = 0.1,
                 affine: bool = True, track_running_stats: bool = True, group=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.group = group

    def forward(self, x: Tensor) -> Tensor:
        if not self.training and self.running_mean is not None:
            return super().forward(x)
        out, stats = _SyncedBatchNormFunction.apply(x, self.weight, self.bias, self.eps,
                                                    self.group)
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
            momentum = (1.0 / float(self.num_batches_tracked) if self.momentum is None
                        else self.momentum)
            with torch.no_grad():
                channels = self.num_features
                mean, var, count = stats[:channels], stats[channels:-1], stats[-1]
                unbiased = var * count / (count - 1).clamp_min(1)
                self.running_mean.mul_(1 - momentum).add_(mean.to(x.dtype), alpha=momentum)
                self.running_var.mul_(1 - momentum).add_(unbiased.to(x.dtype),
                                                         alpha=momentum)
        return out

    @classmethod
    def convert(cls, norm: nn.BatchNorm1d, group=None) -> "SyncedBatchNorm":
        """A :class:`SyncedBatchNorm` with ``norm``'s settings and state, on its device and
        of its dtype."""
        synced = cls(norm.num_features, norm.eps, norm.momentum, norm.affine,
                     norm.track_running_stats, group)
        like = norm.weight if norm.weight is not None else norm.running_mean
        if like is not None:
            synced = synced.to(device=like.device, dtype=like.dtype)
        synced.load_state_dict(norm.state_dict())
        return synced


def sync_batch_norms(model: nn.Module, group=None) -> nn.Module:
    """Replaces every ``BatchNorm1d`` of ``model`` by a :class:`SyncedBatchNorm` with its
    state (in place; returns ``model``)."""
    for name, child in list(model.named_children()):
        if isinstance(child, nn.BatchNorm1d) and not isinstance(child, SyncedBatchNorm):
            setattr(model, name, SyncedBatchNorm.convert(child, group))
        else:
            sync_batch_norms(child, group)
    return model


# ------------------------------------------------------------------ process group --

def init_distributed(device: Union[str, torch.device, None] = "auto",
                     timeout: float = 300.0):
    """Joins the process group torchrun describes in the environment (``RANK``,
    ``WORLD_SIZE``, ``MASTER_ADDR``, ...): NCCL on GPUs, gloo on the CPU, every collective
    bounded by ``timeout`` seconds. ``device``: ``"auto"`` (GPU ``LOCAL_RANK`` when torch
    sees one, else the CPU), ``"cpu"`` or ``"cuda"``. Returns (rank, world size, device)."""
    from .device import resolve_device
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
               if k not in os.environ]
    if missing and not dist.is_initialized():
        raise ValueError(f"--distributed runs under torchrun (torchrun --nproc-per-node N -m "
                         f"dignn train --distributed ...), which sets {', '.join(missing)}")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or \
            not math.isfinite(timeout) or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    device = resolve_device(device)
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                timeout=datetime.timedelta(seconds=timeout))
    return dist.get_rank(), dist.get_world_size(), device


def load_partition(dataset: NodeDataset, parts: int, method: str = "contiguous",
                   path: Union[str, os.PathLike, None] = None, group=None):
    """The partition of ``dataset``'s nodes over ``parts`` ranks, the same on every rank of
    ``group``. With ``path``: read from there when the file exists (it must be of this graph
    and have ``parts`` parts), else computed by rank 0 and written there (a temporary file
    renamed, so that a big graph is partitioned once); without: computed by rank 0 and its
    node -> rank assignment broadcast."""
    from dignn_kernels.distributed import GraphPartition, partition
    if method not in PARTITION_METHODS:
        raise ValueError(f"partition method must be one of {PARTITION_METHODS}, got "
                         f"{method!r}")
    rank = dist.get_rank(group)
    edge_index, num_nodes = dataset.edge_index.cpu(), dataset.num_nodes
    if path is not None:
        path = Path(path)
        failure = [None]
        if rank == 0 and not path.exists():
            try:
                part = partition(edge_index, num_nodes, parts, method)
                write_atomically(path, part.save)
            except (OSError, ValueError, ImportError) as err:  # the others must not wait
                failure = [err]
        dist.broadcast_object_list(failure, 0, group)  # (also the barrier before reading)
        if failure[0] is not None:
            raise failure[0]
        part = GraphPartition.load(path)
        if part.num_nodes != num_nodes or part.parts != parts:
            raise ValueError(f"the partition in {path} has {part.parts} parts of "
                             f"{part.num_nodes} nodes, but this run needs {parts} parts "
                             f"(one per rank) of {dataset.name}'s {num_nodes} nodes: "
                             f"give another --partition-file, or remove this one")
        return part
    if rank == 0:
        part = partition(edge_index, num_nodes, parts, method)
        assignment = part.assignment.to(torch.int64)
    else:
        assignment = torch.empty(num_nodes, dtype=torch.int64)
    if dist.get_backend(group) == "nccl":
        moved = assignment.cuda()
        dist.broadcast(moved, 0, group)
        assignment = moved.cpu()
    else:
        dist.broadcast(assignment, 0, group)
    if rank == 0:
        return part
    return GraphPartition.from_assignment(edge_index, num_nodes, assignment, parts,
                                          method=method)


# ----------------------------------------------------------------------- the data --

def check_node_task(dataset) -> None:
    """Only node classification on one graph is trained across processes."""
    if dataset.task != "node":
        raise ValueError(f"--distributed trains node classification (one graph split over "
                         f"the processes); {dataset.name} is a {dataset.task} dataset: train "
                         f"it without --distributed")


@dataclass
class ShardedNodes:
    """One rank's rows of a node dataset: ``x`` and ``y`` of the owned nodes, the ``shard``
    the model takes, each split's owned nodes as local positions (``local_splits``) and the
    global set sizes (``global_sizes``: train, val, test per split)."""

    x: Tensor
    y: Tensor
    shard: NodeShard
    local_splits: List[Split]
    global_sizes: List[List[int]]


def shard_node_dataset(dataset: NodeDataset, graph, config: TrainConfig,
                       device: torch.device) -> ShardedNodes:
    """Rank ``graph.rank``'s rows of ``dataset`` on ``device``, for a model built with
    ``config`` (its input unit's A X or A: the owned rows, from the whole graph)."""
    owned = graph.owned.cpu()
    n = dataset.num_nodes
    position = torch.full((n,), -1, dtype=torch.long)
    position[owned] = torch.arange(owned.numel())
    x = dataset.x.cpu()
    x_entries, x_nnz = None, 0
    if x.layout != torch.strided:
        x = x.coalesce()
        rows = position[x.indices()[0]]
        x_entries = torch.nonzero(rows >= 0).flatten()
        x_nnz = x.values().numel()
        x_owned = torch.sparse_coo_tensor(
            torch.stack([rows[x_entries], x.indices()[1][x_entries]]),
            x.values()[x_entries], (owned.numel(), x.size(1)), is_coalesced=True,
            check_invariants=False)
    else:
        x_owned = x[owned]
    features = None
    if config.input_unit in ("adj", "linkx"):
        dtype = getattr(torch, config.dtype)
        adj = adjacency_matrix(dataset.edge_index.cpu(), n, config.adj_norm, dtype)
        keep = torch.nonzero(position[adj.indices()[0]] >= 0).flatten()
        rows = position[adj.indices()[0][keep]]
        owned_adj = torch.sparse_coo_tensor(torch.stack([rows, adj.indices()[1][keep]]),
                                            adj.values()[keep], (owned.numel(), n),
                                            is_coalesced=True, check_invariants=False)
        if config.input_unit == "adj":
            dense_x = dataset.x.to_dense() if dataset.x.layout != torch.strided else dataset.x
            features = torch.sparse.mm(owned_adj, dense_x.cpu().to(dtype))
        else:
            features = owned_adj
        features = features.to(device)
    local_splits, global_sizes = [], []
    for split in dataset.splits:
        parts = []
        for nodes in (split.train, split.val, split.test):
            local = position[nodes.cpu()]
            parts.append(local[local >= 0].to(device))
        local_splits.append(Split(*parts))
        global_sizes.append(list(split.sizes()))
    shard = NodeShard(graph, owned.to(device), n, features,
                      None if x_entries is None else x_entries.to(device), x_nnz)
    x_owned = x_owned.to(getattr(torch, config.dtype))
    return ShardedNodes(x_owned.to(device), dataset.y.cpu()[owned].to(device), shard,
                        local_splits, global_sizes)


# ---------------------------------------------------------------------- training --

class DistributedRun:
    """Trains node-classification splits on this rank's share of a partitioned graph: the
    ``fit`` of :func:`dignn.training.train` (``train(dataset, config, fit=DistributedRun(
    dataset, config, partition, device))``). Every rank of ``group`` must make the same
    calls."""

    def __init__(self, dataset: NodeDataset, config: TrainConfig, partition,
                 device: torch.device, group=None):
        from dignn_kernels.distributed import DistributedGraph
        check_node_task(dataset)
        self.group, self.device = group, device
        self.rank = dist.get_rank(group)
        self.graph = DistributedGraph(partition, group=group, device=device)
        self.data = shard_node_dataset(dataset, self.graph, config, device)

    def _all_reduce(self, tensor: Tensor) -> Tensor:
        _all_reduce(tensor, self.group)
        return tensor

    def __call__(self, dataset: NodeDataset, config: TrainConfig, split: int,
                 progress: bool = True, keep_model: bool = False, *, device=None,
                 compile_model: bool = False, sync_every: int = 10,
                 checkpoint=None):
        from dignn_kernels.distributed import all_reduce_gradients
        from .training import (TASK_METRICS, _check_sync_every, _finish_split, _NodeSets,
                               _progress, _run_epochs, _Selector, _split_setup, _SplitSaver)
        _check_sync_every(sync_every)
        device, group, data = self.device, self.group, self.data
        model, opt = _split_setup(dataset, config, split, device, compile_model,
                                  prepare=lambda m: sync_batch_norms(m, group))
        local = data.local_splits[split]
        sizes = data.global_sizes[split]
        sets = _NodeSets(local, sizes)
        x, y, shard = data.x, data.y, data.shard
        num_train = float(sizes[0])
        sel = _Selector(model, device, config.patience, TASK_METRICS["node"])
        saver = None if checkpoint is None else _SplitSaver(checkpoint, split, model, opt,
                                                            sel, device)
        bar = _progress(config.epochs, f"{dataset.name} split {split}",
                        progress and self.rank == 0)

        def epoch_fn():
            model.train()
            opt.zero_grad()
            logits = model(x, shard)[local.train]
            loss_sum = F.cross_entropy(logits, y[local.train], reduction="sum")
            (loss_sum / num_train).backward()
            all_reduce_gradients(model, group)
            opt.step()
            model.eval()
            with torch.no_grad():
                sums = torch.cat([sets.sums(model(x, shard), y).reshape(6),
                                  loss_sum.detach().double().reshape(1)])
                self._all_reduce(sums)  # the three sets' sums and the training loss
                return sums[6] / num_train, sets.means(sums[:6].reshape(3, 2))

        seconds, trained = _run_epochs(config, model, sel, bar, sync_every, epoch_fn,
                                       device, saver)
        return _finish_split(model, sel, bar, split, seconds, trained, math.nan,
                             lambda: math.nan, keep_model)
