"""dignn-kernels: fused kernels for DIGNN's implicit graph neural diffusion.

The modules, from the formulas up (each imports only those above it):

- :mod:`~dignn_kernels.laplacian`: the formulas of the graph neural Laplacian in PyTorch;
- :mod:`~dignn_kernels.checks`, :mod:`~dignn_kernels.csr`: argument validation, CSR indices;
- :mod:`~dignn_kernels.backends`: the pass interface and one module per backend (compiled
  C++/CUDA, Triton, plain PyTorch);
- :mod:`~dignn_kernels.ops`: the passes as public functions, one validation for every backend;
- :mod:`~dignn_kernels.graph`: graph preprocessing and its cache;
- :mod:`~dignn_kernels.solvers`: fixed point, conjugate gradient and Anderson over the passes,
  and the one differentiable solve op;
- :class:`FusedImplicitDiffusion` (:mod:`~dignn_kernels.layer`): the drop-in layer.

:mod:`dignn_kernels.reference` restates the paper in plain PyTorch: the oracle of the tests
and benchmarks, imported by nothing else.
"""
import glob
import os

import torch


def _load_extension() -> None:
    here = __path__[0]
    try:
        from . import _build_info
    except ImportError:
        raise ImportError(
            f"dignn_kernels at {here} is not built: run `pip install -e .` in that source tree "
            f"to build it in place, or import the installed package from another directory"
        ) from None
    if _build_info.TORCH_VERSION != torch.__version__:
        raise ImportError(
            f"dignn_kernels was built against torch {_build_info.TORCH_VERSION} but torch "
            f"{torch.__version__} is installed; rebuild it for this torch with "
            f"`pip install --force-reinstall --no-deps --no-cache-dir .` (or `pip install -e .`) "
            f"in the dignn-kernels source tree")
    try:
        from . import _C  # noqa: F401  (registers the torch.ops.dignn operators)
    except ImportError as err:
        if glob.glob(os.path.join(here, "_C*")):  # built, but it does not load: say why
            raise ImportError(f"dignn_kernels' compiled extension at {here} does not load: "
                              f"{err}; rebuild with `pip install -e .` there") from None
        raise ImportError(
            f"dignn_kernels at {here} is a source tree without its compiled extension: run "
            f"`pip install -e .` there to build it in place, or import the installed package "
            f"from another directory") from None


_load_extension()

from . import backends, ops, solvers  # noqa: E402
from .backends import available_backends  # noqa: E402
from .graph import CSRGraph, build_graph, cached_graph, clear_graph_cache  # noqa: E402
from .layer import BACKENDS, FusedImplicitDiffusion  # noqa: E402
from .solvers import SOLVERS, DivergenceWarning, backward_stats, implicit_diffusion  # noqa: E402

__version__ = "0.1.0"
__all__ = ["FusedImplicitDiffusion", "ops", "backends", "solvers", "CSRGraph", "build_graph",
           "cached_graph", "clear_graph_cache", "BACKENDS", "available_backends", "SOLVERS",
           "DivergenceWarning", "implicit_diffusion", "backward_stats"]
