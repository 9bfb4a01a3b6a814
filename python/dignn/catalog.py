"""The names the ``dignn`` command offers, kept free of heavy imports so that ``dignn --help``
answers without loading torch (:mod:`dignn.data` holds the loaders behind these names)."""
import os
from typing import Dict

__all__ = ["DATASETS", "DEVICE_HELP", "SOLVERS", "BACKENDS", "REORDERINGS", "usable_cores",
           "MAX_THREADS_PER_CORE"]

# dataset name -> task ("node", "graph", or "multilabel": node labels across graphs)
DATASETS: Dict[str, str] = {
    "csbm": "node", "penn94-synthetic": "node",
    "cora": "node", "citeseer": "node", "pubmed": "node",
    "chameleon": "node", "squirrel": "node",
    "chameleon-directed": "node", "squirrel-directed": "node",
    "penn94": "node", "amherst41": "node", "cornell5": "node", "johnshopkins55": "node",
    "reed98": "node",
    "mutag": "graph", "ptc-mr": "graph", "proteins": "graph", "nci1": "graph",
    "imdb-binary": "graph", "imdb-multi": "graph",
    "ppi": "multilabel",
}

DEVICE_HELP = ("where to train: auto (the GPU when one is visible, else the CPU), cpu, cuda "
               "or cuda:N (default: auto)")

# The layer's choices, spelled out here so that `dignn --help` imports no torch; a test holds
# them to dignn_kernels.SOLVERS, ("auto",) + dignn_kernels.backends.BACKENDS and
# dignn_kernels.reorder.REORDERINGS.
SOLVERS = ("fixed_point", "cg", "anderson")
BACKENDS = ("auto", "cpu", "cuda", "triton", "torch")
REORDERINGS = ("none", "auto", "rcm", "degree", "community")

# CPU threads beyond a few per core only wait on each other, and OpenMP allocates per thread:
# a huge --threads exhausts the memory and aborts the process.
MAX_THREADS_PER_CORE = 4


def usable_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1
