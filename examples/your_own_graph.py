"""Your own graph: read nodes and edges from CSV files, train DIGNN, predict every node.

    python examples/your_own_graph.py --nodes nodes.csv --edges edges.csv --out predictions.csv
    python examples/your_own_graph.py            # writes a small demo pair of files first
    python examples/your_own_graph.py --quick    # the demo, few epochs (seconds, for CI)

``nodes.csv``: a header line, then one node per line: its id (any text), its class (an integer
from 0, or empty where unknown: those nodes are predicted, not trained on), then its features
(numbers)::

    id,label,f0,f1,f2
    alice,0,0.3,1.2,-0.5
    bob,,0.1,0.9,0.4

``edges.csv``: a header line, then ``source,target`` node ids, one edge per line; each edge is
used in both directions (``--directed`` keeps them as given: messages flow source -> target).

The graph becomes a PyTorch Geometric ``Data``; ``dignn.from_pyg`` checks it and draws a
seeded 60/20/20 split of the labeled nodes; the model is ``dignn.DIGNNNodeClassifier`` with
the package's preset for users' graphs (``dignn.preset_config("user-data")``), trained with
model selection on the validation nodes. ``--out`` gets one line per node: its id, the
predicted class and its probability. The same graph saved with ``torch.save(data, path)``
trains from the command line too: ``dignn train --dataset my_graph.pt --split-ratio
0.6,0.2,0.2``.
"""
import argparse
import csv
import sys
import tempfile
from pathlib import Path

import torch
from torch_geometric.data import Data
from torch_geometric.utils import to_undirected

from dignn import UserDataError, from_pyg, preset_config
from dignn.data import csbm
from dignn.device import choose_threads, resolve_device
from dignn.training import train_node_split


def read_graph(nodes_csv, edges_csv, directed=False):
    """(Data, node ids) from the two CSV files described above."""
    ids, labels, features = [], [], []
    with open(nodes_csv, newline="") as f:
        rows = csv.reader(f)
        next(rows)  # the header
        for row in rows:
            ids.append(row[0])
            labels.append(int(row[1]) if row[1].strip() else -1)  # -1: unknown class
            features.append([float(v) for v in row[2:]])
    index = {node: k for k, node in enumerate(ids)}
    with open(edges_csv, newline="") as f:
        rows = csv.reader(f)
        next(rows)
        pairs = []
        for line, (source, target) in enumerate(rows, start=2):
            unknown = [node for node in (source, target) if node not in index]
            if unknown:
                sys.exit(f"{edges_csv}, line {line}: node {unknown[0]!r} is not in {nodes_csv}")
            pairs.append((index[source], index[target]))
    edge_index = torch.tensor(pairs, dtype=torch.long).t().reshape(2, -1)
    if not directed:
        edge_index = to_undirected(edge_index, num_nodes=len(ids))
    data = Data(x=torch.tensor(features), edge_index=edge_index, y=torch.tensor(labels))
    return data, ids


def write_demo_files(folder, num_nodes=400, seed=0):
    """A demo pair of files: a generated graph of ``num_nodes`` people in 4 groups (most
    links inside a group), 16 features each, a fifth of the classes left empty."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    graph = csbm(num_nodes=num_nodes, num_features=16, num_splits=1, seed=seed)
    hidden = torch.rand(num_nodes, generator=torch.Generator().manual_seed(seed)) < 0.2
    nodes, edges = folder / "nodes.csv", folder / "edges.csv"
    with open(nodes, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["id", "label"] + [f"f{j}" for j in range(graph.num_features)])
        for k in range(num_nodes):
            label = "" if hidden[k] else int(graph.y[k])
            out.writerow([f"person{k}", label] + [f"{v:.4f}" for v in graph.x[k].tolist()])
    with open(edges, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["source", "target"])
        source, target = graph.edge_index
        for s, t in zip(source.tolist(), target.tolist()):
            if s < t:  # each undirected edge once; read_graph adds the reverse
                out.writerow([f"person{s}", f"person{t}"])
    return nodes, edges


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", help="the nodes' CSV file (default: write a demo)")
    parser.add_argument("--edges", help="the edges' CSV file (default: write a demo)")
    parser.add_argument("--directed", action="store_true",
                        help="use each edge in its own direction only")
    parser.add_argument("--out", default="predictions.csv",
                        help="where to write the predictions (default predictions.csv)")
    parser.add_argument("--demo-dir", default=None,
                        help="where the demo files go (default: a new temporary folder)")
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--laplacian", default="neural", choices=["neural", "rw"])
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    parser.add_argument("--quick", action="store_true",
                        help="the demo files and 100 epochs (seconds; what CI runs)")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if (args.nodes is None) != (args.edges is None):
        sys.exit("give both --nodes and --edges (or neither, for the demo files)")
    if args.nodes is None:
        folder = args.demo_dir or tempfile.mkdtemp(prefix="dignn-demo-")
        args.nodes, args.edges = write_demo_files(folder, 300 if args.quick else 400)
        print(f"demo files written: {args.nodes}, {args.edges}")
    if args.quick:
        args.epochs = min(args.epochs, 100)
    torch.manual_seed(0)

    data, ids = read_graph(args.nodes, args.edges, args.directed)
    # Checks the graph (every problem is a dignn.UserDataError saying what to change) and
    # draws the split of the labeled nodes; unlabeled nodes (-1) are in no split.
    try:
        dataset = from_pyg(data, name=Path(args.nodes).stem, split_ratio=(0.6, 0.2, 0.2),
                           num_splits=1)
    except UserDataError as err:
        sys.exit(f"{args.nodes}, {args.edges}: {err}")
    print(f"{len(ids)} nodes ({int((data.y >= 0).sum())} labeled), "
          f"{data.edge_index.size(1)} directed edges, {dataset.num_features} features, "
          f"{dataset.num_classes} classes; train/val/test {dataset.splits[0].sizes()}")

    device = resolve_device(args.device)
    if device.type == "cpu":  # one thread is fastest on a small graph
        work = (len(ids) + data.edge_index.size(1)) * 64
        torch.set_num_threads(choose_threads(work)[0])
    config = preset_config("user-data", args.laplacian, epochs=args.epochs,
                           directed=args.directed)
    if args.quick:
        config = config.replace(hidden=16)
    result = train_node_split(dataset, config, 0, progress=False, keep_model=True,
                              device=device)
    model = result.model  # the weights of the epoch with the best validation accuracy

    model.eval()
    with torch.no_grad():
        device = next(model.parameters()).device
        prob = model(dataset.x.to(device), dataset.edge_index.to(device)).softmax(dim=1).cpu()
    confidence, predicted = prob.max(dim=1)
    with open(args.out, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["id", "predicted", "probability"])
        for node, c, p in zip(ids, predicted.tolist(), confidence.tolist()):
            out.writerow([node, c, f"{p:.4f}"])
    print(f"predictions of all {len(ids)} nodes written to {args.out}")
    print(f"test accuracy: {result.test_acc:.4f} (best validation {result.val_acc:.4f} at "
          f"epoch {result.best_epoch})")
    return result.test_acc


if __name__ == "__main__":
    main()
