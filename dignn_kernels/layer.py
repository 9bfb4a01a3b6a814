"""``FusedImplicitDiffusion``: DIGNN's implicit graph diffusion layer on the fused kernels."""
import math
from typing import Optional, Tuple

import torch
from torch import Tensor, nn

from . import ops
from .backends import kernels_for
from .composed import composed_edge_weights, composed_implicit_diffusion
from .graph import LAPLACIANS, CSRGraph, cached_graph

__all__ = ["FusedImplicitDiffusion", "BACKENDS", "available_backends"]

BACKENDS = ("auto", "cpu", "cuda", "triton", "torch")


def _has_cuda_kernels() -> bool:
    from . import _build_info
    return bool(_build_info.WITH_CUDA)


def _triton_available() -> bool:
    try:
        from . import triton_kernels
    except ModuleNotFoundError as err:  # a checkout without dignn_kernels/triton_kernels.py
        if err.name == f"{__package__}.triton_kernels":
            return False
        raise
    return bool(triton_kernels.available())


def available_backends(device: torch.device) -> Tuple[str, ...]:
    """The backends that can run on ``device``, fastest first."""
    if device.type == "cpu":
        return ("cpu", "torch")
    if device.type == "cuda":
        found = []
        if _has_cuda_kernels():
            found.append("cuda")
        if _triton_available():
            found.append("triton")
        return tuple(found) + ("torch",)
    return ("torch",)


def _check_int(name, value, minimum):
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _check_positive(name, value, allow_zero=False):
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be a finite number {bound}, got {value!r}")


class FusedImplicitDiffusion(nn.Module):
    r"""The implicit graph diffusion layer of DIGNN (paper eq. 10):
    :math:`Z = X - \frac{1}{\mu} \Delta Z`, solved by fixed-point iteration from Z_0 = 0
    (eq. iter) and differentiated implicitly (appendix "Training for DIGNNs").

    Args:
        in_channels: feature width d of x (and of the output Z).
        mu: the source-constraint strength mu > 0. Plain iteration converges when
            mu > lambda_max(Delta) (corollary 4.3).
        laplacian: ``"neural"`` (the learnable graph neural Laplacian, eq. 12-14), ``"rw"``,
            ``"unnormalized"`` or ``"sym"`` (appendix table 1).
        metric_channels: width h of the metric projections (default: ``in_channels``).
        max_iter: the most fixed-point iterations, forward and adjoint alike.
        tol: stop once ||Z_t - Z_{t-1}||_F <= tol ||Z_t||_F (the same test on the adjoint).
        eps: the epsilon of eq. 14.
        backend: ``"auto"`` (fastest for the device), ``"cpu"`` (fused C++ kernels),
            ``"cuda"``, ``"triton"``, or ``"torch"`` (plain PyTorch composition).

    ``forward(x, edge_index, edge_weight=None)`` takes ``edge_index`` as in PyG (messages flow
    from ``edge_index[0]`` to ``edge_index[1]``), a torch sparse tensor or a torch_sparse
    ``SparseTensor`` (read as PyG's ``adj_t``). The preprocessed graph is cached while the same
    tensors are passed again. Rows whose chi is 0 (isolated nodes, all-zero features) keep
    z_i = x_i. After a forward, ``iterations`` and ``residual`` describe its solve; after a
    backward, ``backward_iterations`` and ``backward_residual`` the adjoint solve.
    """

    def __init__(self, in_channels: int, mu: float = 2.2, laplacian: str = "neural",
                 metric_channels: Optional[int] = None, max_iter: int = 10, tol: float = 1e-6,
                 eps: float = 1e-6, backend: str = "auto"):
        super().__init__()
        _check_int("in_channels", in_channels, 1)
        _check_positive("mu", mu)
        if laplacian not in LAPLACIANS:
            raise ValueError(f"laplacian must be one of {LAPLACIANS}, got {laplacian!r}")
        if metric_channels is not None:
            _check_int("metric_channels", metric_channels, 1)
        _check_int("max_iter", max_iter, 1)
        _check_positive("tol", tol, allow_zero=True)
        _check_positive("eps", eps)
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        self.in_channels = in_channels
        self.mu = float(mu)
        self.laplacian = laplacian
        self.metric_channels = metric_channels or in_channels
        self.max_iter = max_iter
        self.tol = float(tol)
        self.eps = float(eps)
        self.backend = backend
        self.backend_used: Optional[str] = None
        if laplacian == "neural":
            h = self.metric_channels
            self.theta_chi = nn.Linear(in_channels, h, bias=False)
            self.theta_phi = nn.Linear(h, h, bias=False)
            self.theta_varphi = nn.Linear(in_channels, h, bias=False)
        self._stats: Optional[Tensor] = None

    def reset_parameters(self) -> None:
        if self.laplacian == "neural":
            for lin in (self.theta_chi, self.theta_phi, self.theta_varphi):
                lin.reset_parameters()

    # ----------------------------------------------------------------- diagnostics --
    def _stat(self, index: int):
        """Entry `index` of [forward iterations, residual, relative residual, backward
        iterations, residual, relative residual]; None for a solve that has not run (the
        backward's are not seen under torch.compile)."""
        if self._stats is None:
            return None
        stats = self._stats if index < 3 else ops.backward_stats(self._stats)
        if stats is None:
            return None
        value = float(stats[index % 3])
        return int(value) if index % 3 == 0 else value

    @property
    def iterations(self) -> Optional[int]:
        """Fixed-point iterations of the last forward solve."""
        return self._stat(0)

    @property
    def residual(self) -> Optional[float]:
        """||Z_t - Z_{t-1}||_F at the end of the last forward solve."""
        return self._stat(1)

    @property
    def relative_residual(self) -> Optional[float]:
        return self._stat(2)

    @property
    def backward_iterations(self) -> Optional[int]:
        """Adjoint iterations of the last backward (None before one has run)."""
        return self._stat(3)

    @property
    def backward_residual(self) -> Optional[float]:
        return self._stat(4)

    # --------------------------------------------------------------------- forward --
    def _resolve_backend(self, device: torch.device) -> str:
        available = available_backends(device)
        if self.backend == "auto":
            return available[0]
        if self.backend not in available:
            raise RuntimeError(
                f"backend={self.backend!r} cannot run on {device}: available there are "
                f"{available}. " + ("The CUDA kernels were not built; reinstall with a CUDA "
                                    "toolkit (DIGNN_WITH_CUDA=1) or use backend='triton' or "
                                    "'torch'." if self.backend == "cuda" else
                                    "Use backend='auto'."))
        return self.backend

    def _check_x(self, x: Tensor) -> None:
        if not isinstance(x, Tensor):
            raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() != 2 or x.size(1) != self.in_channels:
            raise ValueError(f"x must have shape [num_nodes, {self.in_channels}] "
                             f"(in_channels={self.in_channels}), got {list(x.shape)}")
        if not x.is_floating_point():
            raise TypeError(f"x must be a floating tensor, got {x.dtype}; convert it with "
                            f"x.float()")
        capturing = x.is_cuda and torch.cuda.is_current_stream_capturing()
        if not torch.compiler.is_compiling() and not capturing and x.numel():
            if not bool(torch.isfinite(x).all()):
                raise ValueError("x contains NaN or Inf; the equilibrium is undefined")
        if self.laplacian == "neural":
            wdev = self.theta_chi.weight.device
            if wdev != x.device:
                raise ValueError(f"x is on {x.device} but the layer's parameters are on "
                                 f"{wdev}; move them with layer.to({str(x.device)!r})")

    def forward(self, x: Tensor, edge_index, edge_weight: Optional[Tensor] = None) -> Tensor:
        self._check_x(x)
        edge_device = _graph_device(edge_index)
        if edge_device is not None and edge_device != x.device:
            raise ValueError(f"x is on {x.device} but the graph is on {edge_device}; move "
                             f"both to the same device")
        graph = cached_graph(edge_index, x.size(0), edge_weight)
        backend = self._resolve_backend(x.device)
        self.backend_used = backend
        out_dtype = x.dtype
        compute = torch.float64 if torch.float64 in (x.dtype, self._param_dtype()) else \
            torch.float32
        xc = x.to(compute)
        stats = torch.zeros(3, dtype=torch.float64)
        if backend == "torch":
            z = self._forward_composed(graph, xc, stats)
        else:
            z, stats = self._forward_kernels(graph, xc, backend)
        self._stats = stats
        return z.to(out_dtype)

    def _param_dtype(self):
        return self.theta_chi.weight.dtype if self.laplacian == "neural" else torch.float32

    def _projections(self, x: Tensor, degree: Tensor):
        """chi (eq. 12), p = Θφ Θχ x and q = Θϕ x: the dense GEMMs, once per forward."""
        dtype = x.dtype
        c = nn.functional.linear(x, self.theta_chi.weight.to(dtype))
        chi = degree * torch.tanh(torch.linalg.vector_norm(c, dim=1))
        p = nn.functional.linear(c, self.theta_phi.weight.to(dtype))
        q = nn.functional.linear(x, self.theta_varphi.weight.to(dtype))
        return chi, p, q

    def _forward_kernels(self, graph: CSRGraph, x: Tensor, backend: str):
        t = graph.transposed()
        t_rowptr, t_col, t_perm = t if t is not None else (None, None, None)
        solver = dict(mu=self.mu, eps=self.eps, max_iter=self.max_iter, tol=self.tol,
                      t_rowptr=t_rowptr, t_col=t_col, t_perm=t_perm)
        call = kernels_for(backend).implicit_diffusion
        if self.laplacian == "neural":
            a, degree = graph.values(x.dtype)
            chi, p, q = self._projections(x, degree)
            return call(graph.rowptr, graph.col, a, x, chi, p, q, None, **solver)
        w, chi, kappa = graph.fixed_laplacian(self.laplacian, x.dtype)
        return call(graph.rowptr, graph.col, w, x, chi, None, None, kappa, **solver)

    def _forward_composed(self, graph: CSRGraph, x: Tensor, stats: Tensor) -> Tensor:
        solver = dict(mu=self.mu, max_iter=self.max_iter, tol=self.tol, stats=stats)
        if self.laplacian == "neural":
            a, degree = graph.values(x.dtype)
            chi, p, q = self._projections(x, degree)
            w = composed_edge_weights(graph, a, p, q, self.eps)
            return composed_implicit_diffusion(graph, x, w, chi, None, **solver)
        w, chi, kappa = graph.fixed_laplacian(self.laplacian, x.dtype)
        return composed_implicit_diffusion(graph, x, w, chi, kappa, **solver)

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, mu={self.mu}, laplacian={self.laplacian!r}, "
                f"metric_channels={self.metric_channels}, max_iter={self.max_iter}, "
                f"tol={self.tol}, eps={self.eps}, backend={self.backend!r}")


def _graph_device(edge) -> Optional[torch.device]:
    if isinstance(edge, Tensor):
        return edge.device
    if hasattr(edge, "device") and callable(edge.device):  # torch_sparse.SparseTensor
        return edge.device()
    return None
