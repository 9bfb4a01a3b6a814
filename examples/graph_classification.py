"""Graph classification with the DIGNN layer: one label per graph, mini-batches of graphs.

The model is ``dignn.DIGNNGraphClassifier``: a linear layer, the implicit diffusion layer on
the batch's block-diagonal graph (Z = X - (1/mu) Delta Z, paper eq. 17), layers per node, a
sum over each graph's nodes, layers per graph and a classifier. It trains on one fold of a 10-fold
cross-validation (test fold k, validation fold k + 1, the other eight train) and reports the
test accuracy of the epoch with the best validation accuracy.

    python examples/graph_classification.py --data-root /path/to/data   # MUTAG
    python examples/graph_classification.py --dataset rings-stars       # generated graphs
    python examples/graph_classification.py --quick                     # seconds, for CI

MUTAG is read from ``<data root>/MUTAG/raw`` in PyTorch Geometric's layout (downloaded into
the cache when online). Without it, the script says so and trains on generated graphs: rings
and stars of 5 to 12 nodes, told apart by their shape.
"""
import argparse
import copy
import sys
import time

import torch
import torch.nn.functional as F
from torch_geometric.data import Data
from torch_geometric.loader import DataLoader

from dignn import DIGNNGraphClassifier, from_pyg, load_dataset
from dignn.data import DatasetUnavailableError
from dignn.device import choose_threads, resolve_device


def ring_or_star(num_nodes, star):
    """A ring (every node linked to the next) or a star (node 0 linked to all others), both
    directions of every edge stored; node features: the one-hot degree, capped at 3."""
    if star:
        pairs = [(0, k) for k in range(1, num_nodes)]
    else:
        pairs = [(k, (k + 1) % num_nodes) for k in range(num_nodes)]
    edge_index = torch.tensor(pairs).t()
    edge_index = torch.cat([edge_index, edge_index.flip(0)], dim=1)
    degree = torch.bincount(edge_index[1], minlength=num_nodes).clamp(max=3)
    x = F.one_hot(degree, num_classes=4).float()
    return Data(x=x, edge_index=edge_index, y=torch.tensor([int(star)]))


def rings_and_stars(num_graphs=200, seed=0):
    """``num_graphs`` generated graphs, half rings (class 0), half stars (class 1), as a
    ``dignn.GraphDataset`` with stratified 10-fold cross-validation."""
    gen = torch.Generator().manual_seed(seed)
    sizes = torch.randint(5, 13, (num_graphs,), generator=gen).tolist()
    graphs = [ring_or_star(n, star=k % 2 == 1) for k, n in enumerate(sizes)]
    return from_pyg(graphs, name="rings-stars", num_splits=10, seed=seed)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="mutag",
                        help="a graph dataset of dignn.load_dataset: mutag (default), "
                             "ptc-mr, proteins, nci1, ..., or rings-stars (generated)")
    parser.add_argument("--data-root", default=None,
                        help="folder of the raw files, <root>/MUTAG/raw/... (default: "
                             "$DIGNN_DATA, else the cache)")
    parser.add_argument("--fold", type=int, default=0, help="the test fold (default 0)")
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=0.005)
    parser.add_argument("--mu", type=float, default=1.25, help="the layer's mu (> 0)")
    parser.add_argument("--layers", type=int, default=3,
                        help="Linear + ReLU layers before and after the pooling (default 3)")
    parser.add_argument("--laplacian", default="neural", choices=["neural", "rw"])
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true",
                        help="60 generated graphs and 20 epochs (seconds; what CI runs)")
    return parser.parse_args(argv)


def load(args):
    """The dataset, or the generated rings and stars when the named one's files are
    missing."""
    if args.quick:
        return rings_and_stars(60, args.seed)
    if args.dataset == "rings-stars":
        return rings_and_stars(seed=args.seed)
    try:
        return load_dataset(args.dataset, data_root=args.data_root)
    except DatasetUnavailableError as err:
        print(f"{args.dataset} is not available here ({str(err).splitlines()[0][:160]}...);\n"
              f"training on generated rings and stars instead (--dataset rings-stars; give "
              f"--data-root for {args.dataset})", file=sys.stderr)
        return rings_and_stars(seed=args.seed)


def main(argv=None):
    args = parse_args(argv)
    if args.quick:
        args.epochs, args.hidden, args.layers = min(args.epochs, 20), min(args.hidden, 16), 1
    torch.manual_seed(args.seed)
    data = load(args)
    if data.task != "graph":
        sys.exit(f"{args.dataset} is a {data.task} dataset; see node_classification.py")
    device = resolve_device(args.device)
    if device.type == "cpu":  # one thread is fastest on small graphs
        nodes = sum(g.num_nodes + g.edge_index.size(1) for g in data.graphs[:args.batch_size])
        torch.set_num_threads(choose_threads(nodes * args.hidden)[0])
    split = data.splits[args.fold]
    subset = {name: [data.graphs[i] for i in idx.tolist()]
              for name, idx in zip(("train", "val", "test"), (split.train, split.val, split.test))}
    print(f"{data.name}: {len(data.graphs)} graphs, {data.num_features} node features, "
          f"{data.num_classes} classes; fold {args.fold}: {split.sizes()} train/val/test "
          f"graphs; {device}")
    train_loader = DataLoader(subset["train"], batch_size=args.batch_size, shuffle=True)
    loaders = {name: DataLoader(graphs, batch_size=args.batch_size)
               for name, graphs in subset.items()}

    # solver="auto": conjugate gradient on these undirected graphs, for every mu > 0.
    model = DIGNNGraphClassifier(data.num_features, args.hidden, data.num_classes,
                                 laplacian=args.laplacian, mu=args.mu, max_iter=20,
                                 node_layers=args.layers, graph_layers=args.layers,
                                 solver="auto").to(device)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr, weight_decay=1e-5)

    def accuracy(loader):
        model.eval()
        correct = total = 0
        with torch.no_grad():
            for batch in loader:
                batch = batch.to(device)
                pred = model(batch.x, batch.edge_index, batch.batch, batch.num_graphs).argmax(1)
                correct += int((pred == batch.y).sum())
                total += batch.num_graphs
        return correct / total

    best_val, best_state, best_epoch, start = -1.0, None, 0, time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        model.train()
        for batch in train_loader:  # a Batch: the graphs as one block-diagonal graph
            batch = batch.to(device)
            opt.zero_grad()
            out = model(batch.x, batch.edge_index, batch.batch, batch.num_graphs)
            loss = F.cross_entropy(out, batch.y)
            loss.backward()
            opt.step()
        val_acc = accuracy(loaders["val"])
        if val_acc > best_val:  # model selection on the validation fold only
            best_val, best_epoch = val_acc, epoch
            best_state = copy.deepcopy(model.state_dict())
        if epoch % 10 == 0 or epoch == args.epochs:
            print(f"epoch {epoch:4d}  loss {loss.item():.4f}  train "
                  f"{accuracy(loaders['train']):.4f}  val {val_acc:.4f}")
    model.load_state_dict(best_state)
    test_acc = accuracy(loaders["test"])
    print(f"{args.epochs} epochs in {time.perf_counter() - start:.1f} s")
    print(f"test accuracy: {test_acc:.4f} (best validation {best_val:.4f} at epoch "
          f"{best_epoch})")
    return test_acc


if __name__ == "__main__":
    main()
