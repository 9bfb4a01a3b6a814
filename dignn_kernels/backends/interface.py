"""The pass interface: what a backend provides so that the solvers run on it.

A backend is a :class:`Backend` record. Its three ops are named as the public ops
(``torch.ops.dignn.*``, :mod:`dignn_kernels.ops`), whose ``backend=`` argument calls them:

- ``neural_edge_weights(rowptr, col, a, p, q, eps) -> (w, kappa)``: the neural edge weights
  W_ij = a_ij tanh(1/(||q_i - q_j|| + eps)) tanh(|p_i . p_j|) (eq. 13-14) and their row sums
  kappa_i = sum_j W_ij, in one sweep over the edges;
- ``csr_fma(rowptr, col, w, y, b, cy, rs) -> b + cy.y + rs.(W y)``: the CSR sweep under
  every iteration of every solver (per-row ``cy``, ``rs``);
- ``neural_weight_grad(rowptr, col, a, p, q, z, v, eps, t_rowptr, t_col, t_perm) -> (dl/dp,
  dl/dq)`` with dl/dW_ij = v_i . (z_j - z_i): the neural Laplacian's share of the implicit
  backward. ``t_*`` describe W^T for directed graphs (None on symmetric ones).

The solvers run a sweep in one of four ways, each the ``csr_fma`` above prepared for one
solve (the graph and its row coefficients checked, and on a GPU scheduled, once):

- ``row_map(rowptr, col, w, cy, rs) -> map`` (None: :func:`op_row_map` of ``csr_fma``, for a
  backend with nothing to prepare): ``map(y, b)`` returns
  b + cy.y + rs.(W y), and ``map(y, b, out_dtype)`` from 16-bit y returns it in the compute
  dtype (``out_dtype``, w's): what the pass gives on y widened, for the last, wide iteration
  of a 16-bit fixed point (a backend whose kernels read y in 16 bits, Triton's, makes no
  widened copy of y). Every sweep of every solver runs on it
  (:class:`dignn_kernels.solvers.EquilibriumSystem`) unless one of the two below applies;
- ``row_step`` (optional): ``row_step(rowptr, col, w, b, cy, rs, c) -> step``, the row map
  of one fixed-point map with its norms in the sweep: ``step(y, out, state, history, k)`` is
  sweep k of the solvers' fixed point (:func:`dignn_kernels.solvers.fixed_point`) on the
  device: unless the solve's state says done, it writes the pass into the buffer ``out``
  (y's shape and dtype, not y itself), and it takes ``||out - y||``, ``||out||`` and
  ``sum_i c_i ||out_i||^2`` of its output as stored (0 once done: ``out`` is then left as it
  was) into the loop's bookkeeping (:func:`dignn_kernels.solvers.fixed_point_solver.
  fixed_point_update` of the float64 ``state`` and ``history``). The loop then keeps two
  buffers and never reads an iterate again for its stopping test and divergence certificate.
  Without it, the loop computes those norms from the row map's output and updates the state
  itself;
- ``row_product`` (optional): ``row_product(rowptr, col, w, cy, rs) -> product``, the row
  map with b = 0 (cy.y + rs.(W y)) and its dot products in the sweep: ``product(y, out,
  done) -> dots`` writes it into the buffer ``out`` (y's shape and dtype, not y itself)
  unless the device flag ``done`` (a tensor whose first element is nonzero once the solve is
  done: cg's flags) is set, and returns the per-channel sums out.y of its output as stored
  (a [d] tensor in w's dtype; 0 once done: ``out`` is then left as it was). It is cg's sweep
  w = A u with delta = w.u in one pass (:func:`dignn_kernels.solvers.conjugate_gradient`);
  without it, cg calls the row map and takes the dot product in a second pass over w and u;
- ``fused_solve`` (optional): a whole fixed-point solve in the backend's own loop, forward
  (``forward(rowptr, col, edge_value, x, chi, p, q, kappa, mu, eps, max_iter, tol, t_rowptr,
  t_col, t_perm, storage_dtype) -> (z, w, kappa, stats)``) and adjoint
  (``backward(rowptr, col, edge_value, w, kappa, t_rowptr, t_col, t_perm, x, chi, p, q, z,
  grad_z, mu, eps, max_iter, tol, storage_dtype) -> (grad_x, grad_chi, grad_p, grad_q,
  stats)``), with the semantics of :func:`dignn_kernels.solvers.fixed_point` (16-bit
  ``storage_dtype``: of :func:`dignn_kernels.solvers.solve_forward` with it, for float32 x
  and the dtypes in its ``storage_dtypes``). Only where it is measured faster than the
  solvers' loop over the passes: the compiled backends keep theirs (one C++ loop, no Python
  per sweep; see :mod:`dignn_kernels.backends.compiled`).

And two capabilities:

- ``storage_dtypes``: the 16-bit dtypes (of :data:`STORAGE_DTYPES`) in which the backend's
  passes take the iterates ``y``/``z``/``v`` and the projections ``p``, ``q`` (the solve's
  ``storage_dtype``): they load them, compute and accumulate in the dtype of the edge values
  and row coefficients (float32 or float64) and write the row pass's output in ``y``'s dtype,
  rounded to nearest. Edge weights, kappa and the gradient outputs stay in that compute dtype.
  Empty: the passes take every tensor in one dtype (float32 or float64);
- ``vector_kernels``: who runs the solvers' vector work (cg's update, Anderson's window) in a
  solve on this backend, as :func:`dignn_kernels.solvers.cg_update.resolve_vector_kernels`
  takes it: ``"triton"`` (fused Triton kernels), ``"torch"`` (PyTorch ops), or None for the
  device's compiled ops where there are any (Anderson's record on the CPU), else PyTorch's.
  So ``backend=`` says what runs: no Triton kernel under ``"torch"`` or ``"cuda"``.

The passes are raw: no autograd, no graph-data check. The solvers call them below the one
autograd registration of the solve (:mod:`dignn_kernels.solvers.op`); the arguments are
checked once at the boundary, for every backend (:mod:`dignn_kernels.checks`: shapes, dtypes,
devices, and the graph's data unless it is trusted). The compiled and Triton ops check
shapes again for their direct callers, with the same messages (``csrc/ops/checks.h``).

Why a record of functions rather than one dispatcher op per pass with a kernel per dispatch
key, as pyg-lib and PyTorch's extension-cpp register theirs: two of the four backends
("triton" and "torch") run on the same dispatch key (CUDA) as a third, so the dispatcher
cannot choose between them; the choice is the caller's (``backend=``). Each op of the
compiled backends is still one dispatcher op with CPU and CUDA kernels (csrc/ops/schemas.cpp),
exactly the pyg-lib layout, and the Triton ops are ``torch.library`` custom ops with fake
kernels like extension-cpp's, so every backend stays traceable by ``torch.compile``.
docs/internals/adding-a-backend.md walks through adding one.
"""
from dataclasses import dataclass
from typing import Callable, Optional, Protocol, Tuple

import torch
from torch import Tensor

# A fixed-point solve's state, which a row step updates, under the names its implementers
# know (the layout of every solver's state is dignn_kernels.solver_state's)
from ..solver_state import DIVERGED as FP_DIVERGED, DONE as FP_DONE, FIXED_POINT_STATE, \
    FP_BOUND, FP_RELATIVE, FP_TINY, FP_TOL, RESIDUAL as FP_RESIDUAL, SWEEPS as FP_SWEEPS

__all__ = ["Backend", "FusedSolve", "NeuralEdgeWeights", "CsrFma", "RowMap", "RowStep",
           "RowProduct", "NeuralWeightGrad", "op_row_map", "widened_to", "STORAGE_DTYPES",
           "ROW_STEP_SUMS", "FIXED_POINT_STATE",
           "FP_DONE", "FP_DIVERGED", "FP_SWEEPS", "FP_RESIDUAL", "FP_RELATIVE", "FP_TOL",
           "FP_BOUND", "FP_TINY"]

# The dtypes a solve may store its iterates and projections in (``storage_dtype``).
STORAGE_DTYPES: Tuple[torch.dtype, ...] = (torch.bfloat16, torch.float16)
# The sums a row step takes of its output: ||out - y||^2, ||out||^2, sum_i c_i ||out_i||^2.
ROW_STEP_SUMS = 3


class NeuralEdgeWeights(Protocol):
    def __call__(self, rowptr: Tensor, col: Tensor, a: Tensor, p: Tensor, q: Tensor,
                 eps: float) -> Tuple[Tensor, Tensor]: ...


class CsrFma(Protocol):
    def __call__(self, rowptr: Tensor, col: Tensor, w: Tensor, y: Tensor, b: Tensor,
                 cy: Tensor, rs: Tensor) -> Tensor: ...


class RowMap(Protocol):
    def __call__(self, rowptr: Tensor, col: Tensor, w: Tensor, cy: Tensor, rs: Tensor
                 ) -> Callable[..., Tensor]: ...  # map(y, b, out_dtype=None)


class RowStep(Protocol):
    def __call__(self, rowptr: Tensor, col: Tensor, w: Tensor, b: Tensor, cy: Tensor,
                 rs: Tensor, c: Tensor
                 ) -> Callable[[Tensor, Tensor, Tensor, Tensor, int], None]: ...


def widened_to(y: Tensor, out_dtype: Optional[torch.dtype]) -> Tensor:
    """y as a row map without 16-bit reads takes it for ``map(y, b, out_dtype)``: widened to
    ``out_dtype`` (exact), or y itself for None or y's dtype."""
    return y if out_dtype is None or out_dtype == y.dtype else y.to(out_dtype)


def op_row_map(csr_fma: CsrFma) -> RowMap:
    """The row map of a backend with nothing to prepare (its ``row_map`` None): each
    ``map(y, b, out_dtype)`` one ``csr_fma`` call on y widened to ``out_dtype``
    (:func:`widened_to`).

    Args:
        csr_fma: the backend's op ``csr_fma(rowptr, col, w, y, b, cy, rs) -> out``.

    Returns:
        RowMap: ``row_map(rowptr, col, w, cy, rs) -> map``, ``map(y, b, out_dtype=None)``.

    Example:
        >>> import torch
        >>> from dignn_kernels.backends.interface import op_row_map
        >>> from dignn_kernels.backends.pytorch import csr_fma
        >>> rowptr, col = torch.tensor([0, 1, 2]), torch.tensor([1, 0])
        >>> ones = torch.ones(2)
        >>> step = op_row_map(csr_fma)(rowptr, col, ones, 0 * ones, ones)
        >>> step(torch.tensor([[1.0], [2.0]]), torch.zeros(2, 1)).flatten()  # W y, W swaps
        tensor([2., 1.])
    """
    def row_map(rowptr, col, w, cy, rs):
        return lambda y, b, out_dtype=None: csr_fma(rowptr, col, w, widened_to(y, out_dtype),
                                                    b, cy, rs)
    return row_map


class RowProduct(Protocol):
    def __call__(self, rowptr: Tensor, col: Tensor, w: Tensor, cy: Tensor, rs: Tensor
                 ) -> Callable[[Tensor, Tensor, Tensor], Tensor]: ...


class NeuralWeightGrad(Protocol):
    def __call__(self, rowptr: Tensor, col: Tensor, a: Tensor, p: Tensor, q: Tensor,
                 z: Tensor, v: Tensor, eps: float, t_rowptr: Optional[Tensor],
                 t_col: Optional[Tensor], t_perm: Optional[Tensor]
                 ) -> Tuple[Tensor, Tensor]: ...


@dataclass(frozen=True)
class FusedSolve:
    """A backend's own fixed-point loop (see the module docstring for the signatures)."""
    forward: Callable[..., Tuple[Tensor, Tensor, Tensor, Tensor]]
    backward: Callable[..., Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]]
    # The 16-bit dtypes the loop stores iterates in, with float32 x (other storage: the
    # solvers' loop over the passes).
    storage_dtypes: Tuple[torch.dtype, ...] = ()


@dataclass(frozen=True)
class Backend:
    """One backend: its name, where it runs, its three ops, the sweeps the solvers run on it
    (a row map, and optionally a row step, a row product and a fused solve), the 16-bit
    storage dtypes its passes take and the vector kernels of its solves (see the module
    docstring)."""
    name: str
    available: Callable[[torch.device], bool]
    neural_edge_weights: NeuralEdgeWeights
    csr_fma: CsrFma
    neural_weight_grad: NeuralWeightGrad
    row_map: Optional[RowMap] = None
    row_step: Optional[RowStep] = None
    row_product: Optional[RowProduct] = None
    fused_solve: Optional[FusedSolve] = None
    storage_dtypes: Tuple[torch.dtype, ...] = ()
    vector_kernels: Optional[str] = "torch"
