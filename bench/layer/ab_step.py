"""Times training steps of the layer on cornell5 in one process, for A/B comparisons of two
checkouts of the package (the Python code, or builds of the compiled extension: run each with
its own PYTHONPATH, interleaved, several times; one thread, since another job may hold a
core).

    PYTHONPATH=<checkout> OMP_NUM_THREADS=1 python bench/layer/ab_step.py fused 8

Prints one JSON line: the package's path, the variant (fused: backend="cpu"; fused_bf16: the
same with storage_dtype=torch.bfloat16; composed: backend="torch"; each 10 + 10 iterations,
tol = 0; anderson: backend="cpu", solver="anderson", the rw Laplacian, to tol = 1e-6), the
sweeps of the last step and the sorted step times in ms (forward + backward, h = d = 64,
after one warm-up step).
"""
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import scipy.io
import torch

import dignn_kernels as dk

DATA = Path(os.environ.get("DIGNN_DATA", Path(__file__).resolve().parents[3] / "shared" / "data"))


def main(variant: str, rounds: int) -> None:
    torch.set_num_threads(1)
    adj = scipy.io.loadmat(str(DATA / "cornell5" / "raw" / "data.mat"))["A"].tocoo()
    edge_index = torch.from_numpy(np.vstack([adj.row, adj.col]).astype(np.int64))
    torch.manual_seed(0)
    x = torch.randn(adj.shape[0], 64).requires_grad_()
    if variant == "anderson":
        layer = dk.FusedImplicitDiffusion(64, mu=2.2, laplacian="rw", solver="anderson",
                                          max_iter=200, tol=1e-6)
        backend = "cpu"
    else:
        backend, storage = {"fused": ("cpu", None), "fused_bf16": ("cpu", torch.bfloat16),
                            "composed": ("torch", None)}[variant]
        layer = dk.FusedImplicitDiffusion(64, mu=2.2, max_iter=10, tol=0.0,
                                          storage_dtype=storage)
    layer.backend = backend

    def step():
        layer(x, edge_index).square().sum().backward()
        x.grad = None

    step()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        step()
        times.append((time.perf_counter() - start) * 1e3)
    print(json.dumps({"package": dk.__file__, "variant": variant,
                      "sweeps": [layer.iterations, layer.backward_iterations],
                      "ms": sorted(times)}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
