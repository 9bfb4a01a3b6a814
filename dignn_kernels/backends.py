"""The passes behind the layer, per backend, under one interface.

``kernels_for(name)`` returns an object with the functions below, so the solvers are written
once for every backend:

- ``neural_edge_weights(rowptr, col, a, p, q, eps) -> (w, kappa)``
- ``csr_fma(rowptr, col, w, y, b, cy, rs) -> b + cy*y + rs*(W y)``
- ``neural_weight_grad(rowptr, col, a, p, q, z, v, eps, t_rowptr, t_col, t_perm)
  -> (dl/dp, dl/dq)`` with dl/dW_ij = v_i . (z_j - z_i)
- ``implicit_diffusion(rowptr, col, edge_value, x, chi, p, q, kappa, *, mu, eps, max_iter, tol,
  t_rowptr, t_col, t_perm) -> (z, stats)``: the differentiable fixed-point layer

Each also takes ``trusted=True``, which the solvers pass: their graphs were checked once at
the entry (or built by :mod:`dignn_kernels.graph`), so no sweep repeats the O(edges) graph
check (:func:`dignn_kernels.ops.check_graph`).

``"cpu"`` and ``"cuda"`` are the compiled ``torch.ops.dignn`` operators (the dispatcher picks the
device); ``"triton"`` is :mod:`dignn_kernels.triton_kernels`; ``"torch"`` is
:mod:`dignn_kernels.torch_passes` (plain PyTorch, any device).
"""
from types import SimpleNamespace

from . import ops

__all__ = ["kernels_for"]

_COMPILED = SimpleNamespace(
    name="compiled",
    neural_edge_weights=ops.neural_edge_weights,
    csr_fma=ops.csr_fma,
    neural_weight_grad=ops.neural_weight_grad,
    implicit_diffusion=ops.implicit_diffusion,
)


def kernels_for(backend: str):
    if backend in ("cpu", "cuda"):
        return _COMPILED
    if backend == "triton":
        from . import triton_kernels
        return triton_kernels
    if backend == "torch":
        from . import torch_passes
        return torch_passes
    raise ValueError(f"no kernels for backend {backend!r}")
