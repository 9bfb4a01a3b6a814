"""Node classification with the DIGNN layer: load a graph, build a model, train, test.

The model is the paper's three parts (eq. 16-18): an input layer, the implicit diffusion layer
``FusedImplicitDiffusion`` (Z = X - (1/mu) Delta Z, eq. 17) and a linear classifier. It trains
on one split with Adam and reports the test accuracy of the epoch with the best validation
accuracy.

    python examples/node_classification.py --data-root /path/to/data   # Cora
    python examples/node_classification.py --dataset csbm              # a generated graph
    python examples/node_classification.py --quick                     # seconds, for CI

Cora is read from ``<data root>/Cora/...`` in PyTorch Geometric's layout (downloaded into the
cache when online). Without it, the script says so and trains on the generated CSBM graph.
"""
import argparse
import copy
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

from dignn import load_dataset
from dignn.data import DatasetUnavailableError
from dignn.device import choose_threads, resolve_device
from dignn_kernels import FusedImplicitDiffusion


class DIGNN(nn.Module):
    """Input layer, implicit diffusion, classifier (paper eq. 16-18)."""

    def __init__(self, in_channels, hidden, num_classes, mu, laplacian, dropout):
        super().__init__()
        self.dropout = dropout
        self.lin_in = nn.Linear(in_channels, hidden)
        self.norm_in = nn.BatchNorm1d(hidden)
        # solver="auto" (the default): conjugate gradient on an undirected graph, Anderson
        # acceleration on a directed one; both converge for every mu > 0.
        self.diffusion = FusedImplicitDiffusion(hidden, mu=mu, laplacian=laplacian,
                                                max_iter=20)
        self.norm_out = nn.BatchNorm1d(hidden)
        self.lin_out = nn.Linear(hidden, num_classes)

    def forward(self, x, edge_index):
        x = F.dropout(x, self.dropout, self.training)
        h = self.norm_in(F.dropout(F.relu(self.lin_in(x)), self.dropout, self.training))
        z = self.diffusion(h, edge_index)  # the equilibrium of eq. 17
        z = F.dropout(self.norm_out(z), self.dropout, self.training)
        return self.lin_out(z)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="cora",
                        help="a node dataset of dignn.load_dataset: cora (default), citeseer, "
                             "chameleon, ..., or csbm (generated, no files)")
    parser.add_argument("--data-root", default=None,
                        help="folder of the raw files, <root>/Cora/... (default: $DIGNN_DATA, "
                             "else the cache)")
    parser.add_argument("--split", type=int, default=0, help="which split to train (default 0)")
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--weight-decay", type=float, default=5e-4)
    parser.add_argument("--dropout", type=float, default=0.5)
    parser.add_argument("--mu", type=float, default=2.2, help="the layer's mu (> 0)")
    parser.add_argument("--laplacian", default="neural", choices=["neural", "rw"])
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true",
                        help="a 300-node generated graph and 100 epochs (seconds; what CI runs)")
    return parser.parse_args(argv)


def load(args):
    """The dataset, or the generated CSBM graph when the named one's files are missing."""
    if args.quick:
        return load_dataset("csbm", num_nodes=300, num_splits=1, seed=args.seed)
    try:
        return load_dataset(args.dataset, data_root=args.data_root)
    except DatasetUnavailableError as err:
        print(f"{args.dataset} is not available here ({str(err).splitlines()[0][:160]}...);\n"
              f"training on the generated CSBM graph instead (--dataset csbm; give "
              f"--data-root for {args.dataset})", file=sys.stderr)
        return load_dataset("csbm")


def main(argv=None):
    args = parse_args(argv)
    if args.quick:
        args.epochs, args.hidden = min(args.epochs, 100), min(args.hidden, 16)
    torch.manual_seed(args.seed)
    data = load(args)
    if data.task != "node":
        sys.exit(f"{args.dataset} is a {data.task} dataset; see graph_classification.py")
    device = resolve_device(args.device)
    if device.type == "cpu":  # one thread is fastest on a small graph
        work = (data.num_nodes + data.edge_index.size(1)) * args.hidden
        torch.set_num_threads(choose_threads(work)[0])
    data = data.to(device)
    split = data.splits[args.split]
    print(f"{data.name}: {data.num_nodes} nodes, {data.edge_index.size(1)} edges, "
          f"{data.num_features} features, {data.num_classes} classes; split {args.split}: "
          f"{split.sizes()} train/val/test nodes; {device}")

    model = DIGNN(data.num_features, args.hidden, data.num_classes, args.mu, args.laplacian,
                  args.dropout).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)

    def accuracies():
        model.eval()
        with torch.no_grad():
            pred = model(data.x, data.edge_index).argmax(dim=1)
        return [(pred[idx] == data.y[idx]).float().mean().item()
                for idx in (split.train, split.val, split.test)]

    best_val, best_state, best_epoch, start = -1.0, None, 0, time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        model.train()
        opt.zero_grad()
        out = model(data.x, data.edge_index)
        loss = F.cross_entropy(out[split.train], data.y[split.train])
        loss.backward()  # implicit differentiation: one adjoint solve, no unrolling
        opt.step()
        train_acc, val_acc, _ = accuracies()
        if val_acc > best_val:  # model selection on the validation nodes only
            best_val, best_epoch = val_acc, epoch
            best_state = copy.deepcopy(model.state_dict())
        if epoch % 10 == 0 or epoch == args.epochs:
            layer = model.diffusion
            print(f"epoch {epoch:4d}  loss {loss.item():.4f}  train {train_acc:.4f}  "
                  f"val {val_acc:.4f}  ({layer.solver_used}: {layer.iterations} sweeps, "
                  f"relative residual {layer.relative_residual:.1e})")
    model.load_state_dict(best_state)
    test_acc = accuracies()[2]
    print(f"{args.epochs} epochs in {time.perf_counter() - start:.1f} s")
    print(f"test accuracy: {test_acc:.4f} (best validation {best_val:.4f} at epoch "
          f"{best_epoch})")
    return test_acc


if __name__ == "__main__":
    main()
