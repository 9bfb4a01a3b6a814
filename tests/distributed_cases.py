"""Workers of tests/test_distributed.py: each rank runs the layer on its piece of a partitioned
graph and compares Z, dl/dx and the Theta gradients with the single-process layer on the
whole graph (computed on every rank, the graphs are small or loaded once)."""
import datetime
import os
import socket
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

from conftest import DATA_ROOT, make_graph, make_layer
from dignn_kernels.distributed import (DistributedGraph, GraphPartition, all_reduce_gradients,
                                       partition)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init(rank: int, world: int, port: int, timeout_s: float) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))


def cornell5_edges():
    import numpy as np
    import scipy.io
    adj = scipy.io.loadmat(str(DATA_ROOT / "cornell5" / "raw" / "data.mat"))["A"].tocoo()
    return torch.from_numpy(np.vstack([adj.row, adj.col]).astype(np.int64)), adj.shape[0]


def case_graph(kind: str, dtype, n: int, d: int, seed: int = 0):
    """(x, edge_index, edge_weight, assignment or None) of a test graph."""
    if kind == "cornell5":
        ei, n = cornell5_edges()
        g = torch.Generator().manual_seed(seed)
        return torch.randn(n, d, generator=g, dtype=dtype), ei, None, None
    if kind == "weighted_directed":
        x, ei, _ = make_graph("directed", n=n, d=d, seed=seed, dtype=dtype)
        g = torch.Generator().manual_seed(seed + 1)
        return x, ei, torch.rand(ei.size(1), generator=g, dtype=dtype) + 0.1, None
    if kind == "rank_without_edges":
        # the last ranks' nodes are isolated: ranks that own nodes but no CSR entries
        x, ei, w = make_graph("isolated", n=n, d=d, seed=seed, dtype=dtype)
        return x, ei, w, "isolated_last"
    if kind == "rank_without_nodes":
        x, ei, w = make_graph("symmetric", n=n, d=d, seed=seed, dtype=dtype)
        return x, ei, w, "skip_last"
    x, ei, w = make_graph(kind, n=n, d=d, seed=seed, dtype=dtype)
    return x, ei, w, None


def _assignment(rule, n, world):
    if rule == "isolated_last":  # make_graph("isolated"): nodes n-4.. have no edges
        a = torch.arange(n) * max(world - 1, 1) // (n - 4)
        a[n - 4:] = world - 1
        return a.clamp(max=world - 1)
    if rule == "skip_last":  # rank world-1 owns nothing (world >= 2), ids interleaved
        return torch.arange(n) % max(world - 1, 1)
    raise ValueError(rule)


def _global_rel(a, b, group) -> float:
    a, b = a.detach().double(), b.detach().double()
    sums = torch.stack([(a - b).square().sum(), b.square().sum()])
    dist.all_reduce(sums, group=group)
    return float(sums[0].sqrt() / sums[1].sqrt().clamp_min(1e-300))


def run_case(case: dict, rank: int, world: int, group=None) -> dict:
    dtype = case.get("dtype", torch.float64)
    x, ei, w, rule = case_graph(case["graph"], dtype, case.get("n", 40), case.get("d", 5))
    n = x.size(0)
    layer = make_layer(x.size(1), case["laplacian"], mu=case.get("mu"), h=case.get("h", 4),
                       dtype=dtype, solver=case["solver"], max_iter=case.get("max_iter", 8),
                       tol=case.get("tol", 0.0), backend=case.get("backend", "auto"),
                       check_every=case.get("check_every"))
    g = torch.Generator().manual_seed(7)
    seed_grad = torch.randn(x.shape, generator=g, dtype=dtype)
    # single process, whole graph
    xr = x.clone().requires_grad_()
    z_ref = layer(xr, ei, w)
    (z_ref * seed_grad).sum().backward()
    ref_iters = (layer.iterations, layer.backward_iterations)
    theta_ref = {k: p.grad.clone() for k, p in layer.named_parameters()}
    layer.zero_grad(set_to_none=True)
    # partitioned
    if rule is not None and world > 1:
        part = GraphPartition.from_assignment(ei, n, _assignment(rule, n, world), world, w)
    else:
        part = partition(ei, n, world, method=case.get("method", "contiguous"), edge_weight=w)
    graph = DistributedGraph(part, group=group)
    xo = x[graph.owned].clone().requires_grad_()
    z = layer(xo, graph)
    (z * seed_grad[graph.owned]).sum().backward()
    all_reduce_gradients(layer, group)
    out = {
        "z": _global_rel(z, z_ref.detach()[graph.owned], group),
        "grad_x": _global_rel(xo.grad, xr.grad[graph.owned], group),
        "theta": {k: float((p.grad - theta_ref[k]).norm() / theta_ref[k].norm().clamp_min(1e-300))
                  for k, p in layer.named_parameters()},
        "iterations": (layer.iterations, layer.backward_iterations), "ref_iterations": ref_iters,
        "solver_used": layer.solver_used, "owned": graph.num_owned, "entries": graph.num_edges,
        "halo": graph.num_halo, "theta_norms": {k: float(p.norm()) for k, p in theta_ref.items()},
    }
    return out


def compare_worker(rank: int, world: int, port: int, cases: list, out_dir: str) -> None:
    """Runs each case on the first ``case["world"]`` ranks (a sub-group; the others wait), so
    that one spawn covers every world size up to ``world``."""
    init(rank, world, port, 120.0)
    groups = {size: dist.new_group(list(range(size))) for size in range(1, world + 1)}
    results = {}
    try:
        for case in cases:
            size = case["world"]
            if rank < size:
                results[f"{size}/{case['name']}"] = run_case(case, rank, size, groups[size])
    except Exception:  # reported by the test, with the rank
        results["error"] = traceback.format_exc()
    torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


def fault_worker(rank: int, world: int, port: int, mode: str, timeout_s: float,
                 out_dir: str) -> None:
    """Rank 1 dies (``mode="dead"``) or stays silent (``"silent"``) before the forward; rank 0
    records the error its forward raised and how long it took."""
    init(rank, world, port, timeout_s)
    x, ei, w = make_graph("symmetric", n=30, d=4, dtype=torch.float64)
    graph = DistributedGraph(partition(ei, 30, world))
    layer = make_layer(4, "neural", dtype=torch.float64)
    dist.barrier()
    if rank == 1:
        if mode == "dead":
            os._exit(3)
        time.sleep(timeout_s * 3)
        os._exit(0)
    began = time.perf_counter()
    try:
        layer(x[graph.owned], graph)
        record = {"raised": None}
    except Exception as err:  # noqa: BLE001 -- the test checks type and message
        record = {"raised": type(err).__name__, "message": str(err)}
    record["seconds"] = time.perf_counter() - began
    torch.save(record, Path(out_dir) / "fault.pt")
    os._exit(0)


def spawn(target, world: int, args: tuple, timeout: float) -> list:
    """Starts ``world`` spawned processes running target(rank, world, port, *args); returns
    their exit codes (None for one still running at ``timeout``, which is then killed)."""
    ctx = torch.multiprocessing.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=target, args=(r, world, port) + args) for r in range(world)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout
    for p in procs:
        p.join(max(deadline - time.monotonic(), 0.1))
    codes = []
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
            codes.append(None)
        else:
            codes.append(p.exitcode)
    return codes
