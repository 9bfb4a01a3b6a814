"""One backend's passes through the public face (:mod:`dignn_kernels.ops` with ``backend=``)
and its fixed-point solve through the solve entry: what the tests call per backend."""
from functools import partial
from types import SimpleNamespace

import dignn_kernels as dk
from dignn_kernels import ops


def face(backend: str) -> SimpleNamespace:
    def implicit_diffusion(*args, **kwargs):
        kwargs.setdefault("solver", "fixed_point")
        return dk.implicit_diffusion(*args, backend=backend, **kwargs)

    is_compiled = backend in ("cpu", "cuda")  # the ops themselves (the dispatcher's choice)
    extra = {"neural_edge_weights_backward": ops.neural_edge_weights_backward} \
        if is_compiled else {}
    passes = {name: partial(getattr(ops, name), backend=None if is_compiled else backend)
              for name in ("neural_edge_weights", "csr_fma", "neural_weight_grad",
                           "diffusion_step")}
    return SimpleNamespace(name=backend, implicit_diffusion=implicit_diffusion,
                           backward_stats=dk.backward_stats, **passes, **extra)
