"""Partitioned training: one graph's nodes split over processes, the whole graph in every solve.

Each process (rank) owns a block of the nodes: their features, labels and rows of the graph.
The implicit layer (Z = X - (1/mu) Delta Z, paper eq. 17) still solves on the whole graph:
every sweep exchanges the rows the ranks' edges read from each other. Each rank computes the
loss of its own training nodes; ``all_reduce_gradients`` sums the gradients over the ranks,
so every rank takes the same optimizer step.

    torchrun --nproc-per-node 2 examples/partitioned_training.py --quick   # 2 ranks, CPU
    torchrun --nproc-per-node 4 examples/partitioned_training.py --dataset cora --data-root DATA
    python examples/partitioned_training.py --quick                       # 1 rank

On GPUs the ranks talk through NCCL, one GPU each (with fewer GPUs than ranks, or none, through
gloo on the CPU). ``dignn train --distributed`` trains the package's models this way (docs:
"Partitioned graphs").
"""
import argparse
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from dignn import load_dataset
from dignn.data import DatasetUnavailableError
from dignn.device import choose_threads
from dignn_kernels import FusedImplicitDiffusion
from dignn_kernels.distributed import DistributedGraph, all_reduce_gradients, partition


class Net(nn.Module):
    """Input layer, implicit diffusion, classifier (paper eq. 16-18). No batch norm: its
    statistics would need every rank's rows (``dignn.distributed.SyncedBatchNorm`` has
    them)."""

    def __init__(self, in_channels, hidden, num_classes, mu, dropout):
        super().__init__()
        self.dropout = dropout
        self.lin_in = nn.Linear(in_channels, hidden)
        self.diffusion = FusedImplicitDiffusion(hidden, mu=mu, max_iter=20)
        self.lin_out = nn.Linear(hidden, num_classes)

    def forward(self, x, graph):
        """``x``: this rank's rows; ``graph``: a DistributedGraph (or a whole edge_index)."""
        h = F.dropout(F.relu(self.lin_in(x)), self.dropout, self.training)
        z = self.diffusion(h, graph)  # the owned rows of the whole graph's equilibrium
        return self.lin_out(F.dropout(z, self.dropout, self.training))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="csbm",
                        help="a node dataset of dignn.load_dataset (default csbm, generated)")
    parser.add_argument("--data-root", default=None, help="folder of the raw files")
    parser.add_argument("--split", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--mu", type=float, default=2.2)
    parser.add_argument("--dropout", type=float, default=0.5)
    parser.add_argument("--quick", action="store_true",
                        help="a 300-node generated graph and 30 epochs (seconds; what CI runs)")
    return parser.parse_args(argv)


def init():
    """The process group: torchrun's environment, or a world of one process without it. NCCL
    with one GPU per rank where there are enough GPUs on this machine, else gloo on CPUs."""
    ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    backend = "nccl" if torch.cuda.device_count() >= ranks_here > 0 else "gloo"
    if "RANK" in os.environ:  # started by torchrun
        dist.init_process_group(backend)
    else:
        store = os.path.join(tempfile.mkdtemp(), "store")
        dist.init_process_group(backend, init_method=f"file://{store}", rank=0, world_size=1)
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def main(argv=None):
    args = parse_args(argv)
    if args.quick:
        args.epochs, args.hidden = min(args.epochs, 30), min(args.hidden, 16)
    device = init()
    rank, world = dist.get_rank(), dist.get_world_size()
    say = print if rank == 0 else (lambda *a, **k: None)  # rank 0 prints
    torch.manual_seed(0)  # the same initial weights on every rank

    # Every rank loads the dataset (node ids, features, labels and splits are the same) ...
    if args.quick:
        data = load_dataset("csbm", num_nodes=300, num_splits=1)
    else:
        try:
            data = load_dataset(args.dataset, data_root=args.data_root)
        except DatasetUnavailableError as err:
            say(f"{args.dataset} is not available here ({str(err).splitlines()[0][:120]}...); "
                f"training on the generated CSBM graph instead", file=sys.stderr)
            data = load_dataset("csbm")
    if data.task != "node":
        sys.exit(f"{data.name} is a {data.task} dataset; partitioned training is for node "
                 f"classification")

    # ... and computes the same partition: contiguous blocks are cheap and the same on every
    # rank. (METIS, method="metis", cuts fewer edges; compute it once, part.save(path), and
    # let every rank GraphPartition.load(path).)
    part = partition(data.edge_index, data.num_nodes, parts=world, method="contiguous")
    graph = DistributedGraph(part, device=device)  # this rank's rows, its halo, the plans
    if device.type == "cpu":  # one thread is fastest on a small graph (torchrun sets 1 too)
        torch.set_num_threads(choose_threads((graph.num_owned + graph.col.numel()) *
                                             args.hidden)[0])
    mine = graph.owned.cpu()  # the global ids of the nodes this rank owns
    x, y = data.x[mine].to(device), data.y[mine].to(device)

    # The split's nodes, as positions among the owned rows, and the global set sizes.
    split = data.splits[args.split]
    where = torch.full((data.num_nodes,), -1, dtype=torch.long)
    where[mine] = torch.arange(mine.numel())
    sets = {name: where[idx][where[idx] >= 0].to(device)
            for name, idx in (("train", split.train), ("val", split.val),
                              ("test", split.test))}
    sizes = dict(zip(sets, split.sizes()))
    say(f"{data.name}: {data.num_nodes} nodes over {world} rank(s), {mine.numel()} on rank 0 "
        f"(+{graph.num_halo} halo rows read from others); {device}")

    model = Net(data.num_features, args.hidden, data.num_classes, args.mu,
                args.dropout).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr, weight_decay=5e-4)

    def accuracies():
        """Train, validation and test accuracy over all ranks' nodes."""
        model.eval()
        with torch.no_grad():
            pred = model(x, graph).argmax(dim=1)
        correct = torch.stack([(pred[i] == y[i]).sum() for i in sets.values()]).double()
        dist.all_reduce(correct)  # summed over the ranks
        return [c / sizes[name] for c, name in zip(correct.tolist(), sets)]

    best_val, best_test, best_epoch, start = -1.0, 0.0, 0, time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        model.train()
        opt.zero_grad()
        out = model(x, graph)
        # this rank's share of the mean over all training nodes: the ranks' losses add up
        loss = F.cross_entropy(out[sets["train"]], y[sets["train"]], reduction="sum")
        (loss / sizes["train"]).backward()  # every rank runs the backward: its solve too
        all_reduce_gradients(model)  # the gradient of the global loss, on every rank
        opt.step()
        train_acc, val_acc, test_acc = accuracies()
        if val_acc > best_val:  # the same choice on every rank
            best_val, best_test, best_epoch = val_acc, test_acc, epoch
        if epoch % 10 == 0 or epoch == args.epochs:
            say(f"epoch {epoch:4d}  train {train_acc:.4f}  val {val_acc:.4f}  "
                f"({model.diffusion.solver_used}: {model.diffusion.iterations} sweeps)")
    say(f"{args.epochs} epochs in {time.perf_counter() - start:.1f} s on {world} rank(s)")
    say(f"test accuracy: {best_test:.4f} (best validation {best_val:.4f} at epoch "
        f"{best_epoch})")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
