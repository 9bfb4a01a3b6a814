"""Locality reordering (``reorder=``, :mod:`dignn_kernels.reorder`): one training step of the
layer with the nodes renumbered or not, side by side in one run.

h = d = 64, 10 forward + 10 adjoint iterations (tol = 0), forward + backward, the graph
preprocessed (and renumbered) once before timing, as a static graph is in training.

- CPU (backend ``"cpu"``): cornell5 with its own ids and with shuffled ids, and a block model
  with shuffled ids (200,000 nodes, 5M undirected edges, blocks of 1,000, 90% of the edges
  inside a block), under every ``reorder``;
- GPU (``cuda`` marker; backends ``"cuda"`` and ``"triton"``): the products-sized block model
  (2,449,029 nodes, ~124M CSR entries) with shuffled ids under ``"none"``, ``"community"``,
  ``"rcm"`` and ``"auto"`` (goal: a step <= 150 ms under the best order; test_gpu_summary
  states it, met or missed), and cornell5 shuffled.

Each test stores ms per step, the locality cost of the order
(:func:`dignn_kernels.reorder.locality_cost`) and the seconds the renumbering took.

    OMP_NUM_THREADS=1 pytest bench/layer/test_locality.py -m "not cuda" \\
        --benchmark-json bench/results/locality_cpu.json
    pytest bench/layer/test_locality.py -m cuda --benchmark-json bench/results/<gpu>/locality.json
"""
import time

import pytest
import torch

import dignn_kernels as dk
from dignn_kernels.reorder import REORDERINGS, locality_cost
from dignn_kernels.synthetic import block_model_graph
from conftest import load_facebook100, state_goals, summary

CHANNELS = 64
ITERS = 10


def _shuffled(edge_index, n, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return torch.randperm(n, generator=gen)[edge_index]


_GRAPHS = {}
_BUILT = {}
STEPS = {}  # (graph, reorder, backend, device) -> ms per step and the order's facts
PRODUCTS_GOAL_MS = 150  # the products-sized step under the best order (GPU)


def _graph(name):
    if name not in _GRAPHS:
        if name.startswith("cornell5"):
            edge_index, n = load_facebook100("cornell5")
            if name.endswith("shuffled"):
                edge_index = _shuffled(edge_index, n)
        elif name == "block_model_200k_shuffled":
            n = 200_000
            edge_index = block_model_graph(n, 5_000_000, block_size=1000, inside=0.9)
        elif name == "block_model_products_shuffled":
            n = 2_449_029
            edge_index = block_model_graph(block_size=1000, inside=0.9)
        else:
            raise ValueError(name)
        _GRAPHS[name] = (edge_index, n)
    return _GRAPHS[name]


def _time_step(benchmark, name, reorder, backend, device, rounds):
    edge_index, n = _graph(name)
    edge_index = edge_index.to(device)
    torch.manual_seed(0)
    x = torch.randn(n, CHANNELS, device=device, requires_grad=True)
    layer = dk.FusedImplicitDiffusion(CHANNELS, mu=2.2, max_iter=ITERS, tol=0.0,
                                      backend=backend, reorder=reorder).to(device)
    key = (name, reorder, device)
    if key not in _BUILT:  # built once per order, shared by the backends
        start = time.perf_counter()
        graph = dk.build_graph(edge_index, n, reorder=reorder)
        _BUILT[key] = (graph, time.perf_counter() - start)
    graph, build_s = _BUILT[key]

    def step():
        layer(x, graph).square().sum().backward()
        x.grad = None
        if device == "cuda":
            torch.cuda.synchronize()

    step()  # warm-up
    benchmark.pedantic(step, rounds=rounds, iterations=1)
    info = dict(graph=name, reorder=reorder, chosen=graph.reorder, backend=backend,
                nodes=n, entries=graph.num_edges, threads=torch.get_num_threads(),
                locality_cost=round(locality_cost(graph.rowptr, graph.col), 3),
                build_and_reorder_s=round(build_s, 2),
                ms_per_step=round(benchmark.stats.stats.median * 1e3, 2))
    benchmark.extra_info.update(info)
    STEPS[(name, reorder, backend, device)] = info


@pytest.mark.parametrize("reorder", REORDERINGS)
@pytest.mark.parametrize("name", ["cornell5", "cornell5_shuffled", "block_model_200k_shuffled"])
def test_cpu_step(benchmark, name, reorder):
    _time_step(benchmark, name, reorder, "cpu", "cpu", rounds=5)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("reorder", ["none", "community", "rcm", "auto"])
@pytest.mark.parametrize("name", ["block_model_products_shuffled", "cornell5_shuffled"])
def test_gpu_step(benchmark, name, reorder, backend):
    if backend not in dk.available_backends(torch.device("cuda")):
        pytest.skip(f"backend {backend!r} not available")
    _time_step(benchmark, name, reorder, backend, "cuda", rounds=5)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_summary():
    """The locality goal on the GPU, per backend: the products-sized block model with shuffled
    ids in at most PRODUCTS_GOAL_MS per step under its best order; every order's step against
    the given ids'. Printed and written to $DIGNN_LOCALITY_SUMMARY (if set); fails if the goal
    is missed."""
    stated = _gpu_summary()
    if stated is None:
        pytest.skip("run the GPU steps of this file first")
    state_goals(*stated, "DIGNN_LOCALITY_SUMMARY")


@summary("DIGNN_LOCALITY_SUMMARY")
def _gpu_summary():
    """(lines, checks) of the GPU steps so far (None before the first)."""
    gpu = {key: info for key, info in STEPS.items() if key[3] == "cuda"}
    if not gpu:
        return None
    lines = [f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}", ""]
    checks = []
    for name, backend in sorted({(key[0], key[2]) for key in gpu}):
        steps = {key[1]: info for key, info in gpu.items() if key[0] == name and key[2] == backend}
        none = steps.get("none")
        for reorder, info in steps.items():
            gain = f", {none['ms_per_step'] / info['ms_per_step']:.2f}x the given ids' step" \
                if none else ""
            lines.append(f"{name} {backend} reorder={reorder} (took {info['chosen']}): "
                         f"{info['ms_per_step']:.1f} ms, locality cost {info['locality_cost']}"
                         f"{gain}, renumbering {info['build_and_reorder_s']} s")
        if name == "block_model_products_shuffled":
            best = min(steps, key=lambda r: steps[r]["ms_per_step"])
            ms = steps[best]["ms_per_step"]
            ok = ms <= PRODUCTS_GOAL_MS
            checks.append((ok, f"products-sized step, {backend}, best order ({best}): {ms:.1f} "
                               f"ms (goal <= {PRODUCTS_GOAL_MS} ms) {'met' if ok else 'MISSED'}"))
    return lines, checks
