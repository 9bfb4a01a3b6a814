"""The whole Python face of the C++/CUDA operators in namespace ``torch.ops.dignn``.

Each function here calls one registered op; this module adds the fake (meta) kernels that let
``torch.compile`` trace them and the autograd formula of ``neural_edge_weights``. The math of
every op is written out in ``csrc/dignn/laplacian_math.h``. The fused solve ops
(``implicit_diffusion`` and its backward) have no Python face here: they are the compiled
backend's optional fused solve (:mod:`dignn_kernels.backends.compiled`), run under the one
differentiable solve op of :mod:`dignn_kernels.solvers`.

Every pass takes ``backend=`` (None: these compiled ops, on the tensors' device; else a name
of :mod:`dignn_kernels.backends`), so one face, with one validation, serves every backend.

Graph arguments are CSR: ``rowptr`` (int64, n + 1), ``col`` (int32 or int64, m) and per-edge
values. ``t_rowptr, t_col, t_perm`` are the transposed CSR and, for each of its entries, the
position of the same edge in the CSR; pass them for graphs whose edge values are not
symmetric (:meth:`dignn_kernels.graph.CSRGraph.transposed` makes them).

Every function that takes a CSR first runs :func:`check_graph` on it, an O(nodes + edges)
pass that proves the kernels will not index out of bounds (rowptr starts at 0, never
decreases and ends at the number of edges; every column is a node index; ``t_perm`` is a
permutation). Callers that built the CSR themselves (:mod:`dignn_kernels.graph`, whose graphs
are valid by construction; the layer and the solvers) pass ``trusted=True`` to skip it. The
ops check shapes, dtypes and devices always (csrc/ops/checks.h). Bad graphs raise RuntimeError
naming the argument, on every backend.

``backend`` (None or a name of :data:`dignn_kernels.backends.BACKENDS`: ``"cpu"``, ``"cuda"``,
``"triton"``, ``"torch"``) must name a backend that runs on the tensors' device, else a
RuntimeError says so. Shapes, dtypes and devices wrong for an op raise RuntimeError naming the
argument.

The arguments get the same checks, with the same messages, on every backend before its pass:
the compiled ops run csrc/ops/checks.h themselves, and for the other backends this module
first runs its Python mirror (:mod:`dignn_kernels.checks`: types, shapes, dtypes, every
tensor on one device), so no backend gets what the compiled ops refuse. The scalars are
checked here for all. These are O(1); the O(nodes + edges) data check is the one
``trusted=True`` skips.
"""
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from .backends import get_backend
from .backends import pytorch as torch_passes
from .backends.registration import (forward_ad_active, register_edge_weights_autograd,
                                    run_without_autocast)
from .backends.schedule import CUDA_SEGMENT_EDGES
from .checks import (check_backend_device, check_csr_fma_args, check_diffusion_step_args,
                     check_graph, check_graph_data, check_neural_edge_weights_args,
                     check_neural_weight_grad_args, check_projection_range, check_same_device,
                     check_scalars)
from .laplacian import row_coefficients

__all__ = ["neural_edge_weights", "neural_edge_weights_backward", "diffusion_step", "csr_fma",
           "csr_schedule", "row_product", "neural_weight_grad", "check_graph",
           "anderson_record"]

_ops = torch.ops.dignn


def _checking() -> bool:
    """Whether to run the Python checks: not while torch.compile traces (as the solve entry),
    where the shapes may be symbolic; the compiled graph runs the compiled and Triton ops' own
    checks."""
    return not torch.compiler.is_compiling()


def _backend(name: Optional[str], check_args, *args):
    """The backend record of ``name`` after the op's argument checks ``check_args(*args)``
    (:mod:`dignn_kernels.checks`), or None for the compiled ops, which run the same checks
    themselves (csrc/ops/checks.h, same messages; a stray meta tensor is refused by their fake
    kernels), so a trusted call pays nothing here for them. A backend is refused where it
    cannot run: the compiled ops dispatch on the tensors' device, so backend="cuda" on CPU
    tensors would run the CPU kernels (and "cpu" on CUDA tensors the CUDA ones) under its
    name."""
    if name is None:
        return None
    run = get_backend(name)
    if _checking():
        check_args(*args)
        check_backend_device(run, name, args[0].device)
    return run


def _scalar(value):
    """A checked scalar as the Python float the ops' schemas take (an int, a numpy float);
    as it is while torch.compile traces (it may be symbolic)."""
    return float(value) if _checking() else value


def neural_edge_weights(rowptr: Tensor, col: Tensor, a: Tensor, p: Tensor, q: Tensor,
                        eps: float = 1e-6, *, trusted: bool = False,
                        backend: Optional[str] = None) -> Tuple[Tensor, Tensor]:
    """Edge weights ``W = a tanh(1/(||q_i - q_j|| + eps)) tanh(|p_i . p_j|)`` (eq. 13-14) and
    their row sums kappa. Differentiable in a, p and q, twice (``create_graph=True``) and in
    forward mode (``torch.func.jvp``, ``torch.autograd.forward_ad``: then computed by the
    plain-PyTorch backend's same formulas).

    Args:
        rowptr, col: the graph's CSR (int64 [n + 1], int32 or int64 [m]; module docstring).
        a: float Tensor [m], the edge values a_ij >= 0 (the compute dtype: float32 or
            float64).
        p: Tensor [n, h] of a's dtype, p = Θφ Θχ x (eq. 13).
        q: Tensor [n, h] of a's dtype, q = Θϕ x (eq. 14).
        eps: the epsilon of eq. 14, > 0.
        trusted: skip the O(nodes + edges) :func:`check_graph` (a CSR from build_graph).
        backend: None (the compiled ops) or a name of :data:`~dignn_kernels.backends.BACKENDS`.

    Returns:
        (Tensor, Tensor): W [m] and kappa [n] (kappa_i = sum_j W_ij), in a's dtype.

    Raises:
        ValueError: ``eps`` not a finite number > 0, or p so large that p_i . p_j overflows
            (unless ``trusted``).
        RuntimeError: a bad tensor or CSR, or an unusable backend (module docstring).

    Example:
        >>> import torch
        >>> from dignn_kernels import build_graph, ops
        >>> g = build_graph(torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]]), 3)  # a path
        >>> p = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 2.0]])
        >>> w, kappa = ops.neural_edge_weights(g.rowptr, g.col, g.value, p, p.clone())
        >>> w.shape, kappa.shape
        (torch.Size([4]), torch.Size([3]))
        >>> torch.allclose(kappa, torch.stack([w[0], w[1] + w[2], w[3]]))
        True
    """
    check_scalars(eps=eps)
    run = _backend(backend, check_neural_edge_weights_args, rowptr, col, a, p, q, eps)
    check_graph_data(trusted, rowptr, col, p)
    if not trusted:
        check_projection_range(p)
    eps = _scalar(eps)
    if forward_ad_active() and not torch.compiler.is_compiling():
        # Tangents (torch.func.jvp, forward_ad): the dispatcher ops have no forward-mode
        # formula, so the same eq. 13-14 run as torch ops, which torch differentiates in both
        # modes.
        return torch_passes.neural_edge_weights(rowptr, col, a, p, q, eps)
    if run is None:
        return _ops.neural_edge_weights(rowptr, col, a, p, q, eps)
    return run.neural_edge_weights(rowptr, col, a, p, q, eps)


def neural_edge_weights_backward(rowptr, col, a, p, q, eps, grad_w, t_rowptr, t_col,
                                 t_perm, *, trusted: bool = False) -> Tuple[Tensor, Tensor]:
    """dl/dp and dl/dq from dl/dW: the backward of :func:`neural_edge_weights` (what its
    autograd formula calls; the compiled ops only).

    Args:
        rowptr, col: the graph's CSR (int64 [n + 1], int32 or int64 [m]; module docstring).
        a, p, q, eps: as for :func:`neural_edge_weights`.
        grad_w: Tensor [m] of a's dtype, dl/dW per CSR entry.
        t_rowptr, t_col, t_perm: the transposed CSR and, per entry, the position of the
            same edge in the CSR (:func:`dignn_kernels.graph.transpose_csr`); required
            here, also on a symmetric graph.
        trusted: skip the O(nodes + edges) :func:`check_graph` (a CSR from build_graph).

    Returns:
        (Tensor, Tensor): dl/dp [n, h] and dl/dq [n, h].

    Raises:
        ValueError: ``eps`` not a finite number > 0, or p that overflows p_i . p_j.
        RuntimeError: a bad tensor or CSR, or an unusable backend (module docstring).

    Example:
        >>> import torch
        >>> from dignn_kernels import ops
        >>> from dignn_kernels.graph import build_graph, transpose_csr
        >>> g = build_graph(torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]]), 3)  # a path
        >>> p = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 2.0]])
        >>> t_rowptr, t_col, t_perm = transpose_csr(g.rowptr, g.col, 3)
        >>> gp, gq = ops.neural_edge_weights_backward(g.rowptr, g.col, g.value, p, p, 1e-6,
        ...                                           torch.ones(4), t_rowptr, t_col, t_perm)
        >>> gp.shape, gq.shape
        (torch.Size([3, 2]), torch.Size([3, 2]))
    """
    check_scalars(eps=eps)
    check_graph_data(trusted, rowptr, col, p, t_rowptr, t_col, t_perm)
    if not trusted:
        check_projection_range(p)
    return _ops.neural_edge_weights_backward(rowptr, col, a, p, q, _scalar(eps), grad_w, t_rowptr,
                                             t_col, t_perm)


def diffusion_step(rowptr, col, w, chi, kappa, x, z, mu: float, *, trusted: bool = False,
                   backend: Optional[str] = None) -> Tensor:
    """One forward iteration with cached weights: ``x - (1/mu) Delta z``,
    Delta z = (kappa z - W z) / chi (rows with chi = 0 keep x): the row pass with the row
    coefficients of :func:`dignn_kernels.laplacian.row_coefficients`. From z = 0 and repeated,
    it is the paper's iteration Z_(t+1) = X - (1/mu) Delta Z_t (eq. iter).

    Args:
        rowptr, col: the graph's CSR (int64 [n + 1], int32 or int64 [m]; module docstring).
        w: float Tensor [m], the edge weights W_ij (neural: :func:`neural_edge_weights`).
        chi: Tensor [n] of w's dtype, the node mass (eq. 12); rows with chi <= 1e-30 do
            not diffuse.
        kappa: Tensor [n] of w's dtype, the diagonal of L = K - W.
        x: Tensor [n, d] of w's dtype, the layer input X.
        z: Tensor [n, d] of w's dtype, the current iterate.
        mu: the source-constraint strength, a finite number > 0.
        trusted: skip the O(nodes + edges) :func:`check_graph` (a CSR from build_graph).
        backend: None (the compiled ops) or a name of :data:`~dignn_kernels.backends.BACKENDS`.

    Returns:
        Tensor: x - (1/mu) Delta z, [n, d] in x's dtype.

    Raises:
        ValueError: ``mu`` not a finite number > 0, or so small that 1/(mu chi) overflows.
        RuntimeError: a bad tensor or CSR, or an unusable backend (module docstring).

    Example:
        >>> import torch
        >>> from dignn_kernels import build_graph, ops
        >>> g = build_graph(torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]]), 3)  # a path
        >>> w, chi, kappa = g.fixed_laplacian("rw", torch.float32)  # Delta = I - D^-1 A
        >>> x = torch.tensor([[1.0], [0.0], [1.0]])
        >>> ops.diffusion_step(g.rowptr, g.col, w, chi, kappa, x, x, 2.0)
        tensor([[0.5000],
                [0.5000],
                [0.5000]])
    """
    check_scalars(mu=mu)
    run = _backend(backend, check_diffusion_step_args, rowptr, col, w, chi, kappa, x, z, mu)
    check_graph_data(trusted, rowptr, col, x)
    mu = _scalar(mu)
    if run is None:
        return _ops.diffusion_step(rowptr, col, w, chi, kappa, x, z, mu)
    cy, rs = row_coefficients(chi, kappa, mu, check=True)  # ValueError: 1/(mu chi) overflows
    return run.csr_fma(rowptr, col, w, z, x, cy, rs)


def csr_fma(rowptr, col, w, y, b, cy, rs, *, schedule: Optional[List[Tensor]] = None,
            trusted: bool = False, backend: Optional[str] = None) -> Tensor:
    """The row pass under every iteration: ``out = b + cy * y + rs * (W y)`` with per-row
    ``cy`` and ``rs`` (n). With b = x, cy = -kappa/(mu chi), rs = 1/(mu chi) it is the forward
    step; on the CSR of W^T with weights W_ij rs_i, the adjoint step; with
    cy = -(chi + kappa/mu), rs = 1/mu, b = chi x, the residual of (C + L/mu) Z = C X.

    ``schedule``: the graph's :func:`csr_schedule`, made once for many calls on one graph
    (a solve's sweeps); None makes it in the call. It is the compiled op's (``backend`` None);
    the other backends make their own.

    Args:
        rowptr, col: the graph's CSR (int64 [n + 1], int32 or int64 [m]; module docstring).
        w: float Tensor [m], the weights W_ij of the entries.
        y: Tensor [n, d] of w's dtype, the vector W multiplies.
        b: Tensor [n, d] of w's dtype, the added term.
        cy: Tensor [n] of w's dtype, the per-row coefficient of y.
        rs: Tensor [n] of w's dtype, the per-row scale of W y.
        schedule: the graph's :func:`csr_schedule` (``backend`` None only), or None.
        trusted: skip the O(nodes + edges) :func:`check_graph` (a CSR from build_graph).
        backend: None (the compiled ops) or a name of :data:`~dignn_kernels.backends.BACKENDS`.

    Returns:
        Tensor: ``b + cy * y + rs * (W y)``, [n, d] in y's dtype.

    Raises:
        ValueError: a ``schedule`` with a ``backend`` other than None.
        RuntimeError: a bad tensor or CSR, or an unusable backend (module docstring).

    Example:
        >>> import torch
        >>> from dignn_kernels import build_graph, ops
        >>> g = build_graph(torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]]), 3)  # a path
        >>> y = torch.arange(1.0, 4.0).unsqueeze(1)  # [[1], [2], [3]]
        >>> ones = torch.ones(3)
        >>> ops.csr_fma(g.rowptr, g.col, g.value, y, torch.zeros(3, 1), -ones, ones)
        tensor([[ 1.],
                [ 2.],
                [-1.]])
    """
    run = _backend(backend, check_csr_fma_args, rowptr, col, w, y, b, cy, rs)
    check_graph_data(trusted, rowptr, col, y)
    if run is None:
        return _ops.csr_fma(rowptr, col, w, y, b, cy, rs, schedule)
    if schedule is not None:
        raise ValueError(f"schedule is taken by the compiled op (backend=None); backend="
                         f"{backend!r} makes its own: pass schedule=None")
    return run.csr_fma(rowptr, col, w, y, b, cy, rs)


def csr_schedule(rowptr: Tensor, col: Tensor) -> List[Tensor]:
    """The work schedule of a CSR as the kernels on its device read it (on a GPU: its segments
    and heavy rows, built on the device without a sync; on the CPU: none), for the ops that
    take it (:func:`csr_fma`, :func:`row_product`) instead of building it in every call.

    Args:
        rowptr: int64 Tensor [n + 1], the CSR row pointers.
        col: int32 or int64 Tensor [m], the CSR columns.

    Returns:
        List[Tensor]: the schedule's tensors (an empty list on the CPU).

    Raises:
        RuntimeError: rowptr or col of the wrong dtype, shape or device.

    Example:
        >>> import torch
        >>> from dignn_kernels import build_graph, ops
        >>> g = build_graph(torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]]), 3)
        >>> ops.csr_schedule(g.rowptr, g.col)  # the CPU kernels need none
        []
    """
    return _ops.csr_schedule(rowptr, col)


def row_product(rowptr, col, w, cy, rs, schedule: List[Tensor], y: Tensor, out: Tensor,
                done: Tensor, *, trusted: bool = False) -> Tensor:
    """One cg sweep with its dot products, on the graph's :func:`csr_schedule`: writes
    ``cy * y + rs * (W y)`` into the buffer ``out`` (y's shape and dtype, not y) and returns
    ``(out * y).sum(0)`` per channel (the exact products summed in float64, in y's dtype), in
    one pass over the graph on a GPU. Once the float64 flag ``done[0]`` is nonzero (cg's
    flags) it writes nothing and returns zeros, without reading the flag on the host on a
    GPU. The compiled backends' row product (:mod:`dignn_kernels.backends.compiled`).

    Args:
        rowptr, col: the graph's CSR (int64 [n + 1], int32 or int64 [m]; module docstring).
        w: float Tensor [m], the weights W_ij.
        cy, rs: Tensors [n] of w's dtype, the per-row coefficients (as in :func:`csr_fma`).
        schedule: the graph's :func:`csr_schedule`.
        y: Tensor [n, d] of w's dtype, the search direction.
        out: Tensor of y's shape and dtype (not y), written with ``cy * y + rs * (W y)``.
        done: float64 Tensor [>= 1], cg's flags; nonzero ``done[0]`` skips the sweep.
        trusted: skip the O(nodes + edges) :func:`check_graph` (a CSR from build_graph).

    Returns:
        Tensor: [d] in y's dtype, ``(out * y).sum(0)`` (zeros once ``done[0]`` is set).

    Raises:
        RuntimeError: a bad tensor or CSR, or an unusable backend (module docstring).

    Example:
        >>> import torch
        >>> from dignn_kernels import build_graph, ops
        >>> g = build_graph(torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]]), 3)  # a path
        >>> y = torch.tensor([[1.0], [2.0], [3.0]])
        >>> out = torch.empty_like(y)
        >>> ones = torch.ones(3)
        >>> ops.row_product(g.rowptr, g.col, g.value, -ones, ones,
        ...                 ops.csr_schedule(g.rowptr, g.col), y, out,
        ...                 torch.zeros(1, dtype=torch.float64))
        tensor([2.])
        >>> out.flatten()
        tensor([ 1.,  2., -1.])
    """
    check_graph_data(trusted, rowptr, col, y)
    return _ops.row_product(rowptr, col, w, cy, rs, schedule, y, out, done)


def neural_weight_grad(rowptr, col, a, p, q, z, v, eps: float = 1e-6, t_rowptr=None,
                       t_col=None, t_perm=None, *, trusted: bool = False,
                       backend: Optional[str] = None) -> Tuple[Tensor, Tensor]:
    """The fused gradient pass: dl/dp, dl/dq with dl/dW_ij = v_i . (z_j - z_i), the chain rule
    of :func:`neural_edge_weights` (eq. 13-14) applied to the adjoint v of the implicit
    backward without storing dl/dW.

    Args:
        rowptr, col: the graph's CSR (int64 [n + 1], int32 or int64 [m]; module docstring).
        a, p, q, eps: as for :func:`neural_edge_weights`.
        z: Tensor [n, d] of a's dtype, the equilibrium Z.
        v: Tensor [n, d] of a's dtype, the adjoint, scaled by the row coefficients.
        t_rowptr, t_col, t_perm: the transposed CSR and, per entry, the position of the
            same edge in the CSR (:meth:`dignn_kernels.CSRGraph.transposed`); None on a
            graph whose edge values are symmetric.
        trusted: skip the O(nodes + edges) :func:`check_graph` (a CSR from build_graph).
        backend: None (the compiled ops) or a name of :data:`~dignn_kernels.backends.BACKENDS`.

    Returns:
        (Tensor, Tensor): dl/dp [n, h] and dl/dq [n, h], in a's dtype.

    Raises:
        ValueError: ``eps`` not a finite number > 0, or p that overflows p_i . p_j.
        RuntimeError: a bad tensor or CSR, or an unusable backend (module docstring).

    Example:
        >>> import torch
        >>> from dignn_kernels import build_graph, ops
        >>> g = build_graph(torch.tensor([[0, 1], [1, 0]]), 2)  # one undirected edge
        >>> p = torch.tensor([[1.0, 0.5], [0.5, 1.0]])
        >>> z = torch.ones(2, 4)  # a constant Z: z_j - z_i = 0, no gradient
        >>> gp, gq = ops.neural_weight_grad(g.rowptr, g.col, g.value, p, p, z, z)
        >>> gp.abs().max().item(), gq.shape
        (0.0, torch.Size([2, 2]))
    """
    check_scalars(eps=eps)
    run = _backend(backend, check_neural_weight_grad_args, rowptr, col, a, p, q, z, v, eps,
                   t_rowptr, t_col, t_perm)
    check_graph_data(trusted, rowptr, col, z, t_rowptr, t_col, t_perm)
    if not trusted:
        check_projection_range(p)
    eps = _scalar(eps)
    if run is None:
        return _ops.neural_weight_grad(rowptr, col, a, p, q, z, v, eps, t_rowptr, t_col, t_perm)
    return run.neural_weight_grad(rowptr, col, a, p, q, z, v, eps, t_rowptr, t_col, t_perm)


def anderson_record(gy_new: Tensor, y_new: Tensor, f: Tensor, gy: Tensor, d_f: Tensor,
                    d_g: Tensor, slot: int, count: int) -> Tuple[Tensor, Tensor]:
    """Anderson's record (:meth:`dignn_kernels.solvers.anderson_update.AndersonVectors.record`)
    in one pass on the CPU: returns f_new = gy_new - y_new and the float64 sums [1 + 2 count,
    d] (||f_new||^2 per channel, then <d_f[j], d_f[slot]> and <d_f[j], f_new> per channel for
    j < count, the products in the dtype of the vectors), and writes d_f[slot] = f_new - f and
    d_g[slot] = gy_new - gy. All float32 or float64, contiguous, on the CPU (the GPU solves take
    the Triton record); 0 <= slot < count <= m.

    Args:
        gy_new: Tensor [n, d], G(y_new), the map applied to the new iterate.
        y_new: Tensor [n, d], the new iterate.
        f: Tensor [n, d], the previous residual f = G(y) - y.
        gy: Tensor [n, d], the previous G(y).
        d_f: Tensor [m, n, d], the residual differences (slot ``slot`` written).
        d_g: Tensor [m, n, d], the differences of G (slot ``slot`` written).
        slot: int, the history slot to write.
        count: int, the slots in use after this record.

    Returns:
        (Tensor, Tensor): f_new [n, d] and the float64 sums [1 + 2 count, d].

    Raises:
        TypeError: ``slot`` or ``count`` not an int.
        RuntimeError: tensors not float32/float64, not contiguous, not on the CPU, of
            mismatched shapes, or slot and count out of range.

    Example:
        >>> import torch
        >>> from dignn_kernels import ops
        >>> y, gy_new = torch.zeros(2, 1), torch.ones(2, 1)
        >>> d_f, d_g = torch.zeros(3, 2, 1), torch.zeros(3, 2, 1)
        >>> f_new, sums = ops.anderson_record(gy_new, y, y, y, d_f, d_g, 0, 1)
        >>> f_new.flatten(), sums.flatten()
        (tensor([1., 1.]), tensor([2., 2., 2.], dtype=torch.float64))
    """
    for name, value in (("slot", slot), ("count", count)):  # their range: the op's check
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    return _ops.anderson_record(gy_new, y_new, f, gy, d_f, d_g, slot, count)


# ------------------------------------------------------------------ fake kernels --
# Each first checks that its tensors are on one device: the dispatcher picks these kernels for
# torch.compile's fake tensors and for meta tensors, also when only one argument is on the
# meta device (a real call with a stray meta tensor), which would otherwise return their
# uninitialized outputs as its results. (Shapes are the real kernels' to check: here they may
# be symbolic.)

def _num_nodes(rowptr: Tensor):
    return rowptr.shape[0] - 1


def _one_device(op: str, **tensors) -> None:
    check_same_device(f"dignn::{op}", **tensors)


@torch.library.register_fake("dignn::check_graph")
def _(rowptr, col, num_nodes, t_rowptr=None, t_col=None, t_perm=None):
    _one_device("check_graph", rowptr=rowptr, col=col, t_rowptr=t_rowptr, t_col=t_col,
                t_perm=t_perm)
    return None


@torch.library.register_fake("dignn::neural_edge_weights")
def _(rowptr, col, a, p, q, eps):
    _one_device("neural_edge_weights", rowptr=rowptr, col=col, a=a, p=p, q=q)
    return a.new_empty(col.shape[0]), a.new_empty(_num_nodes(rowptr))  # a: the compute dtype


@torch.library.register_fake("dignn::neural_edge_weights_backward")
def _(rowptr, col, a, p, q, eps, grad_w, t_rowptr, t_col, t_perm):
    _one_device("neural_edge_weights_backward", rowptr=rowptr, col=col, a=a, p=p, q=q,
                grad_w=grad_w, t_rowptr=t_rowptr, t_col=t_col, t_perm=t_perm)
    return torch.empty_like(p), torch.empty_like(q)


@torch.library.register_fake("dignn::diffusion_step")
def _(rowptr, col, w, chi, kappa, x, z, mu):
    _one_device("diffusion_step", rowptr=rowptr, col=col, w=w, chi=chi, kappa=kappa, x=x, z=z)
    return torch.empty_like(x)


@torch.library.register_fake("dignn::csr_fma")
def _(rowptr, col, w, y, b, cy, rs, schedule=None):
    _one_device("csr_fma", rowptr=rowptr, col=col, w=w, y=y, b=b, cy=cy, rs=rs,
                schedule=schedule)
    return torch.empty_like(y)


@torch.library.register_fake("dignn::csr_schedule")
def _(rowptr, col):
    _one_device("csr_schedule", rowptr=rowptr, col=col)
    n, m = _num_nodes(rowptr), col.shape[0]
    if rowptr.device.type != "cuda" or n == 0:
        return []
    # the GPU's segments and heavy rows (csrc/cuda/device_csr.h)
    return [rowptr.new_empty(3, n),
            rowptr.new_empty(n + m // CUDA_SEGMENT_EDGES, dtype=torch.int32),
            rowptr.new_empty(m // (CUDA_SEGMENT_EDGES + 1) + 1, dtype=torch.int32)]


@torch.library.register_fake("dignn::row_product")
def _(rowptr, col, w, cy, rs, schedule, y, out, done):
    _one_device("row_product", rowptr=rowptr, col=col, w=w, cy=cy, rs=rs, schedule=schedule,
                y=y, out=out, done=done)
    return y.new_empty(y.shape[1])


@torch.library.register_fake("dignn::neural_weight_grad")
def _(rowptr, col, a, p, q, z, v, eps, t_rowptr=None, t_col=None, t_perm=None):
    _one_device("neural_weight_grad", rowptr=rowptr, col=col, a=a, p=p, q=q, z=z, v=v,
                t_rowptr=t_rowptr, t_col=t_col, t_perm=t_perm)
    return p.new_empty(p.shape, dtype=a.dtype), q.new_empty(q.shape, dtype=a.dtype)


@torch.library.register_fake("dignn::anderson_record")
def _(gy_new, y_new, f, gy, d_f, d_g, slot, count):
    _one_device("anderson_record", gy_new=gy_new, y_new=y_new, f=f, gy=gy, d_f=d_f, d_g=d_g)
    return (torch.empty_like(gy_new),
            gy_new.new_empty((1 + 2 * count, gy_new.shape[1]), dtype=torch.float64))


@torch.library.register_fake("dignn::implicit_diffusion")
def _(rowptr, col, edge_value, x, chi, p, q, kappa, mu, eps, max_iter, tol, t_rowptr=None,
      t_col=None, t_perm=None, storage_dtype=None):
    _one_device("implicit_diffusion", rowptr=rowptr, col=col, edge_value=edge_value, x=x,
                chi=chi, p=p, q=q, kappa=kappa, t_rowptr=t_rowptr, t_col=t_col, t_perm=t_perm)
    stats = torch.empty(3, dtype=torch.float64, device=x.device)
    return (torch.empty_like(x), x.new_empty(col.shape[0]), x.new_empty(_num_nodes(rowptr)),
            stats)


@torch.library.register_fake("dignn::implicit_diffusion_backward")
def _(rowptr, col, edge_value, w, kappa, t_rowptr, t_col, t_perm, x, chi, p, q, z, grad_z, mu,
      eps, max_iter, tol, storage_dtype=None):
    _one_device("implicit_diffusion_backward", rowptr=rowptr, col=col, edge_value=edge_value,
                w=w, kappa=kappa, t_rowptr=t_rowptr, t_col=t_col, t_perm=t_perm, x=x, chi=chi,
                p=p, q=q, z=z, grad_z=grad_z)
    grad_p = torch.empty_like(p) if p is not None else x.new_empty(0)
    grad_q = torch.empty_like(q) if q is not None else x.new_empty(0)
    return (torch.empty_like(x), torch.empty_like(chi), grad_p, grad_q,
            torch.empty(3, dtype=torch.float64, device=x.device))


# ---------------------------------------------------------------------- autograd --

register_edge_weights_autograd("dignn::neural_edge_weights", _ops.neural_edge_weights_backward)

# Every op computes in the dtypes it is given, also when called inside an autocast region.
for _name in ("check_graph", "neural_edge_weights", "neural_edge_weights_backward",
              "diffusion_step", "csr_fma", "csr_schedule", "row_product", "neural_weight_grad",
              "anderson_record", "implicit_diffusion", "implicit_diffusion_backward"):
    run_without_autocast(f"dignn::{_name}")

