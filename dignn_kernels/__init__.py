"""dignn-kernels: fused kernels for DIGNN's implicit graph neural diffusion.

- :class:`FusedImplicitDiffusion`: the drop-in implicit diffusion layer.
- :mod:`dignn_kernels.ops`: the torch ops (``torch.ops.dignn.*``) it is built from.
- :mod:`dignn_kernels.reference`: plain PyTorch straight from the paper (the test oracle).
- :mod:`dignn_kernels.solvers`: fixed point, conjugate gradient and Anderson solves.
"""
import torch


def _load_extension() -> None:
    try:
        from . import _build_info
    except ImportError:
        raise ImportError(
            "dignn_kernels' compiled extension is missing: install the package with "
            "`pip install .` from the dignn-kernels source tree (`pip install -e .` to "
            "develop), and do not import it from inside that tree.") from None
    if _build_info.TORCH_VERSION != torch.__version__:
        raise ImportError(
            f"dignn_kernels was built against torch {_build_info.TORCH_VERSION} but torch "
            f"{torch.__version__} is installed; rebuild it for this torch with "
            f"`pip install --force-reinstall --no-deps --no-cache-dir .` from the "
            f"dignn-kernels source tree.")
    try:
        from . import _C  # noqa: F401  (registers the torch.ops.dignn operators)
    except ImportError as err:
        raise ImportError(
            f"dignn_kernels' compiled extension (_C) could not be loaded from "
            f"{__path__[0]}: {err}. If that folder is the source tree rather than the installed "
            f"package, run from another directory, or build in place with `pip install -e .`."
        ) from None


_load_extension()

from . import ops, reference, solvers  # noqa: E402
from .graph import CSRGraph, build_graph, cached_graph, clear_graph_cache  # noqa: E402
from .layer import BACKENDS, FusedImplicitDiffusion, available_backends  # noqa: E402
from .solvers import SOLVERS, DivergenceWarning  # noqa: E402

__version__ = "0.1.0"
__all__ = ["FusedImplicitDiffusion", "ops", "reference", "solvers", "CSRGraph", "build_graph",
           "cached_graph", "clear_graph_cache", "BACKENDS", "available_backends", "SOLVERS",
           "DivergenceWarning"]
