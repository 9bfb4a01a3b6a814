"""The names the ``dignn`` command offers, kept free of heavy imports so that ``dignn --help``
answers without loading torch (:mod:`dignn.data` holds the loaders behind these names)."""
import os
from typing import Dict

__all__ = ["DATASETS", "GENERATED", "NUM_SPLITS", "DEFAULT_NUM_SPLITS", "DEVICE_HELP",
           "SOLVERS", "BACKENDS", "REORDERINGS", "usable_cores", "MAX_THREADS_PER_CORE"]

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

# The graphs made on the spot (no files; their splits are --num-splits, default 10).
GENERATED = ("csbm", "penn94-synthetic")

# The splits (folds) each named dataset comes with, so that `dignn train --splits` is checked
# before any data is read: Planetoid's and the Wikipedia graphs' 10 Geom-GCN splits, penn94's 5
# fixed LINKX splits, the other facebook100 graphs' 10 seeded random splits, the TU datasets'
# 10 stratified folds (the gin protocol's too), PPI's one (GraphSAGE's). A test holds them to
# the loaders.
DEFAULT_NUM_SPLITS = 10
NUM_SPLITS: Dict[str, int] = {**{name: DEFAULT_NUM_SPLITS for name in DATASETS},
                              "penn94": 5, "ppi": 1}

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
