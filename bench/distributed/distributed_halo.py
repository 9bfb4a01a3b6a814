"""Halo sizes and bytes exchanged per sweep of the distributed solve (issue 15), for METIS and
contiguous partitions of cornell5 and of a generated graph of ogbn-products' size, at 2, 4
and 8 parts.

    python bench/distributed/distributed_halo.py [--graphs cornell5,products,products:0.99] [--parts 2,4,8]
        [--methods contiguous,metis] [--out bench/results/distributed_halo.json] [--merge]

(``products:P`` is the products-sized graph with p_in = P; ``--merge`` adds the graphs to an
existing results file instead of replacing it.)

What one sweep moves: every halo row once, h values of the dtype (h = 64, float32 here), in
the forward sweep and again (the other way) in each adjoint sweep; ``bytes_per_sweep`` is the
sum over ranks, ``max_rank_bytes`` the largest one rank sends or receives.

The products-sized graph: ogbn-products itself (2,449,029 nodes, 61,859,140 undirected edges,
123,718,280 CSR entries) is not available offline, so a stochastic block model of that size
stands in: 2,449,029 nodes in communities of about 1,200 (the size of ogbn-products' METIS
clusters in Cluster-GCN's setup is of that order), each undirected edge inside its source's
community with probability ``--p-in`` (0.9), else to a uniform node, degrees skewed by a
power-law source weight; node ids shuffled, so that contiguous blocks do not see the
communities (a worst case for them: real ogbn-products ids are partly ordered). Duplicate
pairs and self-loops are dropped from 5% more draws, then 61,859,140 edges kept.

Reading the numbers: ``halo_total`` counts distinct (rank, remote node) pairs, ``cut_fraction``
the CSR entries that read a remote node. With p_in = 0.9 each node has about 5 edges to
uniformly random nodes, so METIS cuts few entries (the communities stay whole) but almost
every node is still read by some other rank: the halo, and so the bytes per sweep, is set by
the long-range edges. ``products:0.99`` (one long-range edge in 100) shows how fast that
changes. Partition times are wall times on a shared 2-core machine (other jobs running), one
torch thread.
"""
import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from dignn_kernels.csr import rowptr_from_sorted_rows  # noqa: E402
from dignn_kernels.distributed import partition  # noqa: E402
from dignn_kernels.graph import CSRGraph  # noqa: E402

DATA_ROOT = Path(os.environ.get("DIGNN_DATA", ROOT.parent / "shared" / "data"))
PRODUCTS_NODES = 2_449_029
PRODUCTS_EDGES = 61_859_140  # undirected; 123,718,280 CSR entries


def symmetric_csr(lo: torch.Tensor, hi: torch.Tensor, n: int) -> CSRGraph:
    """The CSRGraph of the undirected edges (lo, hi) (lo < hi, unique), both directions,
    unit weights."""
    rows = torch.cat([lo, hi])
    cols = torch.cat([hi, lo])
    del lo, hi
    order = torch.argsort(rows * n + cols)
    rows, cols = rows[order], cols[order].to(torch.int32)
    del order
    rowptr = rowptr_from_sorted_rows(rows, n)
    del rows
    value = torch.ones(cols.numel(), dtype=torch.float32)
    degree = (rowptr[1:] - rowptr[:-1]).float()
    return CSRGraph(num_nodes=n, rowptr=rowptr, col=cols, value=value, degree=degree,
                    symmetric=True, _checked=True)


def cornell5():
    import scipy.io
    adj = scipy.io.loadmat(str(DATA_ROOT / "cornell5" / "raw" / "data.mat"))["A"].tocoo()
    n = adj.shape[0]
    row = torch.from_numpy(adj.row.astype(np.int64))
    col = torch.from_numpy(adj.col.astype(np.int64))
    keep = row < col
    return symmetric_csr(row[keep], col[keep], n), "cornell5 (LINKX data.mat, real)"


def products_like(p_in: float, community: int, seed: int = 0):
    """The block model described in the module docstring."""
    n, m = PRODUCTS_NODES, PRODUCTS_EDGES
    gen = torch.Generator().manual_seed(seed)
    draws = int(m * 1.05)  # duplicates and self-loops dropped below leave m or more
    # skewed sources (expected degree ~ rank^-1/1.6), communities of consecutive ids
    weight = (torch.arange(n, dtype=torch.float64) + n / 1000.0) ** (-1.0 / 1.6)
    weight = weight[torch.randperm(n, generator=gen)]
    src = torch.multinomial(weight, draws, replacement=True, generator=gen)
    del weight
    inside = torch.rand(draws, generator=gen) < p_in
    base = (src // community) * community
    size = torch.clamp(n - base, max=community)
    dst = torch.where(inside, base + (torch.rand(draws, generator=gen) * size).long(),
                      torch.randint(0, n, (draws,), generator=gen))
    del inside, base, size
    keep = src != dst
    lo = torch.minimum(src[keep], dst[keep])
    hi = torch.maximum(src[keep], dst[keep])
    del src, dst, keep
    key = torch.unique(lo * n + hi)
    del lo, hi
    key = key[torch.randperm(key.numel(), generator=gen)[:m]]
    perm = torch.randperm(n, generator=gen)  # shuffled ids
    lo, hi = perm[key // n], perm[key % n]
    del key
    lo, hi = torch.minimum(lo, hi), torch.maximum(lo, hi)
    return symmetric_csr(lo, hi, n), (
        f"stochastic block model of ogbn-products' size: {n} nodes, communities of "
        f"{community}, p_in={p_in}, power-law source weights, ids shuffled, seed {seed}")


def machine() -> dict:
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if "model name" in line)
    except (OSError, StopIteration):
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": round(mem, 1),
            "torch_threads": torch.get_num_threads(), "python": platform.python_version(),
            "torch": torch.__version__}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graphs", default="cornell5,products")
    ap.add_argument("--parts", default="2,4,8")
    ap.add_argument("--methods", default="contiguous,metis")
    ap.add_argument("--h", type=int, default=64)
    ap.add_argument("--p-in", type=float, default=0.9)
    ap.add_argument("--community", type=int, default=1200)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "distributed_halo.json"))
    ap.add_argument("--merge", action="store_true")
    args = ap.parse_args(argv)
    parts = [int(p) for p in args.parts.split(",")]
    methods = args.methods.split(",")
    record = {"command": "python bench/distributed/distributed_halo.py " + " ".join(argv or sys.argv[1:]),
              "machine": machine(), "h": args.h, "dtype": "float32", "graphs": {}}
    try:
        from importlib.metadata import version
        record["machine"]["pymetis"] = version("pymetis")
    except ImportError:
        pass
    for name in args.graphs.split(","):
        began = time.perf_counter()
        kind, _, p_in = name.partition(":")
        graph, source = cornell5() if kind == "cornell5" else \
            products_like(float(p_in) if p_in else args.p_in, args.community)
        entry = {"source": source, "num_nodes": graph.num_nodes,
                 "num_entries": graph.num_edges,
                 "build_seconds": round(time.perf_counter() - began, 2), "runs": []}
        print(f"{name}: {graph.num_nodes} nodes, {graph.num_edges} CSR entries "
              f"({entry['build_seconds']} s)", flush=True)
        for method in methods:
            for k in parts:
                began = time.perf_counter()
                part = partition(graph, graph.num_nodes, k, method=method)
                seconds = time.perf_counter() - began
                s = part.stats(h=args.h, dtype=torch.float32)
                run = {key: s[key] for key in (
                    "method", "parts", "owned_nodes", "entries", "halo_nodes", "halo_total",
                    "halo_fraction", "cut_fraction", "bytes_per_sweep",
                    "bytes_sent_per_rank", "bytes_received_per_rank")}
                run["max_rank_bytes"] = max(s["bytes_sent_per_rank"] +
                                            s["bytes_received_per_rank"])
                run["partition_seconds"] = round(seconds, 2)
                entry["runs"].append(run)
                print(f"  {method:10s} {k}: halo {s['halo_total']:>10d} "
                      f"({s['halo_fraction']:.3f} of n), cut {s['cut_fraction']:.3f}, "
                      f"{s['bytes_per_sweep'] / 2**20:9.1f} MiB/sweep, "
                      f"max rank {run['max_rank_bytes'] / 2**20:8.1f} MiB, "
                      f"{seconds:.1f} s", flush=True)
                del part
        entry["command"] = record["command"]
        record["graphs"][name] = entry
        del graph
    if args.merge and Path(args.out).exists():
        merged = json.loads(Path(args.out).read_text())
        merged["graphs"].update(record["graphs"])
        record = merged
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
