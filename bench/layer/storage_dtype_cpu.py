"""16-bit storage (``storage_dtype``) on the CPU: speed and accuracy against float32.

Speed: one training step of FusedImplicitDiffusion (forward + backward, h = d = 64, 10 + 10
iterations, tol = 0) on cornell5 (18,660 nodes, 1,581,554 CSR entries), one intra-op thread,
storage float32 / bfloat16 / float16 interleaved round by round (the machine is shared: the
load average is recorded; the minimum over the rounds is the least disturbed), on two
backends: the compiled CPU kernels (``cpu``: every storage runs their fused C++ loop, whose
passes load 16-bit iterates and sum in float32; the 16-bit steps are timed through the
solvers' Python loop over the same passes too, ``*_solvers_loop``, which gives the same
results) and the plain-PyTorch backend (``torch``). The relative differences of Z and of
every gradient against the float32 step of the same run are recorded too.

Accuracy design check (random graphs, n = 1000, d = h = 64, neural Laplacian, two losses):
the implementation (iterates and adjoints 16-bit, last iteration wide, p and q kept in the
compute dtype) against two variants it was chosen over: p and q also stored in 16 bits, and
the last iteration rounded like the others.

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 python bench/layer/storage_dtype_cpu.py \\
        bench/results/storage_dtype_cpu.json [speed_cpu_kernels speed_torch accuracy]

The parts named on the command line (default: all) are run and replace those keys of an
existing result file; the others are kept.
"""
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

import dignn_kernels as dk
from dignn_kernels import backends
from dignn_kernels.backends import pytorch as torch_backend
from dignn_kernels.solvers import loops

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from conftest import load_facebook100, solvers_loop  # noqa: E402  (bench/conftest.py)

CHANNELS = 64
ITERS = 10
ROUNDS = 7
STORAGE = {"float32": None, "bfloat16": torch.bfloat16, "float16": torch.float16}
# The compiled backend's 16-bit steps through the solvers' loop (its fused loop taken away).
SOLVERS_LOOP = {"bfloat16_solvers_loop": torch.bfloat16, "float16_solvers_loop": torch.float16}


def rel(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


def step_outputs(layer, x, edge_index):
    xr = x.clone().requires_grad_()
    z = layer(xr, edge_index)
    z.square().sum().backward()
    grads = {"z": z.detach(), "x": xr.grad}
    grads.update({name: p.grad.clone() for name, p in layer.named_parameters()})
    layer.zero_grad(set_to_none=True)
    return grads


def speed(backend):
    edge_index, n = load_facebook100("cornell5")
    torch.manual_seed(0)
    x = torch.randn(n, CHANNELS)
    variants = dict(STORAGE, **(SOLVERS_LOOP if backend == "cpu" else {}))
    layers = {}
    for name, dtype in variants.items():
        torch.manual_seed(0)
        layers[name] = dk.FusedImplicitDiffusion(CHANNELS, mu=2.2, max_iter=ITERS, tol=0.0,
                                                 backend=backend, storage_dtype=dtype)
    def step(name):
        with solvers_loop(backend, enabled=name in SOLVERS_LOOP):
            return step_outputs(layers[name], x, edge_index)

    outputs = {name: step(name) for name in variants}
    times = {name: [] for name in variants}
    for _ in range(ROUNDS):
        for name in variants:
            start = time.perf_counter()
            step(name)
            times[name].append(time.perf_counter() - start)
    result = {}
    for name in variants:
        ms = statistics.median(times[name]) * 1e3
        result[name] = {"ms_per_step_median": round(ms, 1),
                        "ms_per_step_min": round(min(times[name]) * 1e3, 1),
                        "ms_per_step_all": [round(t * 1e3, 1) for t in times[name]],
                        "iterations": layers[name].iterations,
                        "backward_iterations": layers[name].backward_iterations,
                        "relative_difference_to_float32": {
                            k: float(f"{rel(v, outputs['float32'][k]):.3g}")
                            for k, v in outputs[name].items()}}
    for name in variants:
        if name == "float32":
            continue
        for stat in ("median", "min"):
            result[name][f"speedup_over_float32_{stat}"] = round(
                result["float32"][f"ms_per_step_{stat}"] / result[name][f"ms_per_step_{stat}"],
                3)
    for name, dtype in SOLVERS_LOOP.items():
        if name in result:  # the fused loop's 16-bit step against the solvers' loop's
            fused_name = str(dtype).split(".")[1]
            result[fused_name]["speedup_over_solvers_loop_median"] = round(
                result[name]["ms_per_step_median"] / result[fused_name]["ms_per_step_median"], 3)
            result[fused_name]["equal_to_solvers_loop"] = all(
                torch.equal(outputs[fused_name][k], outputs[name][k]) for k in outputs[name])
    return {"graph": "cornell5", "nodes": n, "csr_entries": dk.cached_graph(edge_index,
                                                                             n).num_edges,
            "backend": backend, "threads": torch.get_num_threads(), "rounds": ROUNDS,
            "load_average_after": os.getloadavg(), "steps": result}


def _round_pq(storage_dtype):
    """The torch backend with p and q rounded to storage_dtype in both passes that read them."""
    base = backends.get_backend("torch")

    def edge_weights(rowptr, col, a, p, q, eps):
        return torch_backend.neural_edge_weights(rowptr, col, a, p.to(storage_dtype),
                                                 q.to(storage_dtype), eps)

    def neural_weight_grad(rowptr, col, a, p, q, z, v, eps, *transposed):
        return torch_backend.neural_weight_grad(rowptr, col, a, p.to(storage_dtype),
                                                q.to(storage_dtype), z, v, eps, *transposed)

    import dataclasses
    return dataclasses.replace(base, neural_edge_weights=edge_weights,
                               neural_weight_grad=neural_weight_grad)


def accuracy():
    n, d = 1000, 64
    original_last = loops._wide_last_iteration

    def rounded_last(step, rhs, out, max_iter):
        result = original_last(step, rhs, out, max_iter)
        result.solution = result.solution.to(out.solution.dtype).to(rhs.dtype)
        return result

    rows = []
    for kind in ("symmetric", "directed"):
        gen = torch.Generator().manual_seed(0)
        e = torch.randint(0, n, (2, 3 * n), generator=gen)
        e = e[:, e[0] != e[1]]
        ei = e if kind == "directed" else torch.cat([e, e.flip(0)], dim=1)
        x = torch.randn(n, d, generator=gen)
        for loss in ("linspace", "randn"):
            weight = torch.linspace(-1, 1, n * d).view(n, d) if loss == "linspace" else \
                torch.randn(n, d, generator=torch.Generator().manual_seed(3))

            def run(storage_dtype, variant="implementation"):
                torch.manual_seed(0)
                layer = dk.FusedImplicitDiffusion(d, mu=3.0, backend="torch",
                                                  storage_dtype=storage_dtype)
                with torch.no_grad():
                    for lin in (layer.theta_chi, layer.theta_phi, layer.theta_varphi):
                        lin.weight.mul_(0.4 / lin.weight.abs().max())
                saved = backends._REGISTRY["torch"]
                if variant == "p_q_16bit_too":
                    backends._REGISTRY["torch"] = _round_pq(storage_dtype)
                if variant == "last_iteration_rounded":
                    loops._wide_last_iteration = rounded_last
                try:
                    xr = x.clone().requires_grad_()
                    z = layer(xr, ei)
                    (z * weight).sum().backward()
                finally:
                    backends._REGISTRY["torch"] = saved
                    loops._wide_last_iteration = original_last
                out = {"z": z.detach(), "x": xr.grad}
                out.update({k: p.grad for k, p in layer.named_parameters()})
                return out

            ref = run(None)
            for name, dtype in (("bfloat16", torch.bfloat16), ("float16", torch.float16)):
                for variant in ("implementation", "p_q_16bit_too", "last_iteration_rounded"):
                    got = run(dtype, variant)
                    errors = {k: float(f"{rel(got[k], ref[k]):.3g}") for k in ref}
                    rows.append({"graph": kind, "loss": loss, "storage": name,
                                 "variant": variant, "max": max(errors.values()),
                                 "relative_error_to_float32": errors})
    return {"nodes": n, "channels": d, "metric_channels": d, "mu": 3.0, "max_iter": 10,
            "tol": 1e-6, "rows": rows}


PARTS = {"speed_cpu_kernels": lambda: speed("cpu"), "speed_torch": lambda: speed("torch"),
         "accuracy": lambda: accuracy()}
# The keys of the result file (speed_cornell5: the torch backend's, named before the CPU
# kernels had 16-bit storage).
KEYS = {"speed_cpu_kernels": "speed_cornell5_cpu_kernels", "speed_torch": "speed_cornell5",
        "accuracy": "accuracy_design"}


def main(path, parts):
    torch.set_num_threads(1)
    out = json.loads(Path(path).read_text()) if Path(path).exists() else {}
    out.update({"command": "PYTHONPATH=$PWD OMP_NUM_THREADS=1 python bench/layer/storage_dtype_cpu.py "
                           "bench/results/storage_dtype_cpu.json [parts]",
                "cpu_count": os.cpu_count()})
    for part in parts:
        out[KEYS[part]] = dict(PARTS[part](), torch=torch.__version__)
    Path(path).write_text(json.dumps(out, indent=2) + "\n")
    for part in parts:
        if part == "accuracy":
            for row in out["accuracy_design"]["rows"]:
                print(row["graph"], row["loss"], row["storage"], row["variant"], row["max"])
        else:
            print(json.dumps(out[KEYS[part]], indent=2))


if __name__ == "__main__":
    args = sys.argv[1:]
    unknown = [a for a in args[1:] if a not in PARTS]
    if unknown:
        sys.exit(f"unknown parts {unknown}: choose from {sorted(PARTS)}")
    main(args[0] if args else "bench/results/storage_dtype_cpu.json", args[1:] or list(PARTS))
