"""``FusedImplicitDiffusion``: DIGNN's implicit graph diffusion layer on the fused kernels."""
import weakref
from collections.abc import Mapping
from typing import Optional

import torch
from torch import Tensor, nn

from . import backends, solvers
from .backends import available_backends, check_backend_storage, check_storage_dtype
from .checks import check_flow, check_int, check_scalars
from .distributed.graph import DistributedGraph
from .distributed.solve import distributed_forward
from .graph import LAPLACIANS, CSRGraph, cached_graph
from .reorder import check_reorder
from .solvers.registry import check_solver_storage, get_solver, solver_names

__all__ = ["FusedImplicitDiffusion", "BACKENDS", "available_backends"]

#: The ``backend`` choices of :class:`FusedImplicitDiffusion`: ``"auto"`` (the first of
#: :func:`available_backends` on the input's device), then every name of
#: :data:`dignn_kernels.backends.BACKENDS`.
BACKENDS = ("auto",) + backends.BACKENDS


def _stat_property(index: int, doc: str) -> property:
    """A read-only property of entry ``index`` of the layer's solve stats
    (:meth:`FusedImplicitDiffusion._stat`)."""
    return property(lambda self: self._stat(index), doc=doc)


class FusedImplicitDiffusion(nn.Module):
    r"""The implicit graph diffusion layer of DIGNN (paper eq. 17):
    :math:`Z = X - \frac{1}{\mu} \Delta Z`, solved by fixed-point iteration from Z_0 = 0
    (eq. iter), or by conjugate gradient or Anderson acceleration, and differentiated
    implicitly (appendix "Training for DIGNNs").

    Args:
        in_channels: feature width d of x (and of the output Z).
        mu: the source-constraint strength mu > 0. Plain iteration converges when
            mu > lambda_max(Delta) (the well-posedness corollary); ``cg`` for every mu > 0.
        laplacian: ``"neural"`` (the learnable graph neural Laplacian, eq. 12-14), ``"rw"``,
            ``"unnormalized"`` or ``"sym"`` (the paper's appendix).
        metric_channels: width h of the metric projections (default: ``in_channels``).
        max_iter: the most iterations (CSR sweeps for cg and anderson), forward and adjoint
            alike.
        tol: ``fixed_point`` stops once ||Z_t - Z_{t-1}||_F <= tol ||Z_t||_F; ``cg`` and
            ``anderson`` once ||X - Z - Delta Z / mu||_F <= tol ||X||_F (the same tests on
            the adjoint, relative to the incoming gradient).
        eps: the epsilon of eq. 14.
        backend: ``"auto"`` (fastest for the device), ``"cpu"`` (fused C++ kernels),
            ``"cuda"``, ``"triton"``, or ``"torch"`` (plain PyTorch composition).
        solver: ``"auto"`` (default: per graph, ``"cg"`` on an undirected graph and
            ``"anderson"`` on a directed one, ``"fixed_point"`` with a ``storage_dtype``;
            these converge for every mu > 0, see :func:`dignn_kernels.solvers.auto_solver`),
            ``"fixed_point"`` (the paper's iteration, which converges only while mu >
            lambda_max(Delta)), ``"cg"`` (Jacobi-preconditioned conjugate gradient on the SPD
            form (C + L/mu) Z = C X; undirected graphs only, directed ones fall back to
            ``"anderson"`` with a warning) or ``"anderson"`` (Anderson acceleration of the
            fixed-point map). ``solver_used`` names the one that ran. See
            :mod:`dignn_kernels.solvers`.
        check_every: ``cg``/``anderson`` read their on-device convergence flag every this
            many sweeps (None: every sweep on the CPU, every 4 on a GPU; 0: never, always
            ``max_iter`` sweeps, as CUDA graphs need). Results do not depend on it.
        sync_checks: whether a forward may read values back to the host to check them: that
            x holds no NaN or Inf (an error) and that the fixed point did not diverge (a
            :class:`DivergenceWarning`). None (default): on the CPU, where a read costs
            nothing, yes; on a GPU no, so that a training step never waits for the device
            (the solve's stats, ``layer.residual`` etc., still show a diverged or non-finite
            solve when read). True checks on every device. A graph passed as ``edge_index`` is
            fingerprinted on every forward all the same (one host read on a GPU, see below):
            pass a prebuilt :class:`~dignn_kernels.CSRGraph`, or set ``cached``, for a step
            that never syncs.
        cached: PyG's ``cached=True`` for transductive training, where the graph never
            changes: the graph built at the first forward is reused, with no read of its
            contents, while the same ``edge_index`` and ``edge_weight`` objects come back (a
            different object is built and checked again). Writing into those tensors in
            place is then the caller's business, as in PyG. Default False: every forward
            checks the graph's contents.
        storage_dtype: None (default: everything in the compute dtype), ``torch.bfloat16``
            or ``torch.float16``: the iterates of the solve and of the adjoint solve are
            stored in 16 bits (half the bytes every sweep gathers), while every sum
            accumulates in float32 (float64 for float64 layers); the projections p, q, the
            edge weights, chi, kappa and the convergence norms stay wide and the output and
            the gradients come back in the compute dtype (within about 5e-3 of float32 for
            bfloat16, 1e-3 for float16; see :mod:`dignn_kernels.solvers.op`).
            ``solver="fixed_point"`` (or ``"auto"``, which then runs it) only; every backend
            (``"auto"`` picks as without storage).
        reorder: renumber the nodes for memory locality when the graph is preprocessed:
            ``"none"`` (default), ``"rcm"`` (reverse Cuthill-McKee), ``"degree"``,
            ``"community"`` (label propagation) or ``"auto"`` (the order of lowest locality
            cost, or none); see :mod:`dignn_kernels.reorder`. Transparent: x, the output and
            every gradient stay in the caller's node order (a prebuilt :class:`CSRGraph`
            carries its own order and ignores this).
        flow: which end of ``edge_index`` aggregates, named and valued as PyG's
            ``MessagePassing(flow=...)``: ``"source_to_target"`` (default: row i of Delta sums
            over the edges (j, i), at ``edge_index[1]``) or ``"target_to_source"`` (at
            ``edge_index[0]``, as the authors' DIGNN code does; the same as passing
            ``edge_index.flip(0)``). The two agree on undirected graphs. Not
            ``"target_to_source"`` with a sparse-tensor graph (PyG's ``adj_t``: pass its
            transpose). A prebuilt :class:`CSRGraph` records the flow it was built with
            and the layer refuses one built for the other flow, as it refuses a
            :class:`~dignn_kernels.distributed.DistributedGraph` whose partition was.

    ``forward(x, edge_index, edge_weight=None)`` takes ``edge_index`` as in PyG (by default
    messages flow from ``edge_index[0]`` to ``edge_index[1]``; see ``flow``), a torch sparse
    tensor of any layout (COO, CSR, CSC, BSR, BSC) or a torch_sparse
    ``SparseTensor`` (read as PyG's ``adj_t``), or a
    :class:`~dignn_kernels.distributed.DistributedGraph` (one rank's piece of a partitioned
    graph: x holds its owned rows and the output is the owned rows of Z). The preprocessed
    graph is cached by its contents (:func:`~dignn_kernels.cached_graph`): never stale,
    whatever wrote the tensors; the check reads the graph once per forward (one host sync on a
    GPU), and a prebuilt :class:`~dignn_kernels.CSRGraph` skips it. Under ``torch.autocast``
    the layer computes in float32 (float64 for a float64 layer) and returns x's dtype;
    tensors made under ``torch.inference_mode()`` are taken inside and after it. TorchScript
    (``torch.jit.script``/``trace``) is refused: use ``torch.compile``. Rows whose chi is 0
    (isolated nodes, all-zero features) keep z_i = x_i. After a forward, ``iterations`` and
    ``residual`` describe its solve and ``solver_used`` names the solver that ran; after a
    backward, ``backward_iterations`` and
    ``backward_residual`` the adjoint solve. A diverging fixed point (mu below
    lambda_max(Delta)) gives a :class:`dignn_kernels.solvers.DivergenceWarning`.

    Conventions for users of the authors' DIGNN code: by default this layer aggregates at
    ``edge_index[1]`` (PyG's ``source_to_target`` flow: row i of Delta sums over the edges
    (j, i)), the authors' code at ``edge_index[0]``; on an undirected graph (both directions
    stored) the two agree, on a directed one pass ``flow="target_to_source"`` (or,
    equivalently, ``edge_index.flip(0)``) to reproduce theirs. ``tol`` is relative
    (||Z_t - Z_{t-1}||_F <= tol ||Z_t||_F) and ``max_iter`` counts sweeps (Z_1 = X is the
    first), while the authors' ``threshold`` is an absolute bound on ||Z_t - Z_{t-1}|| and
    their loop runs up to ``max_iter + 2`` applications of the map. :meth:`from_authors`
    builds the layer from their module or state dict with all of this mapped.

    Raises:
        ValueError: a constructor argument out of its range or not one of its choices (the
            message names it and the choices); in ``forward``, x of the wrong shape, NaN or
            Inf in x (with host checks), x and the graph or the parameters on different
            devices, or a graph the build refuses (see :func:`~dignn_kernels.build_graph`).
        TypeError: x not a floating torch.Tensor.
        IndexError: ``edge_index`` holds a node index outside 0..num_nodes-1.
        RuntimeError: ``backend`` names a backend that cannot run on x's device.

    Example:
        >>> import torch
        >>> from dignn_kernels import FusedImplicitDiffusion
        >>> _ = torch.manual_seed(0)
        >>> edge_index = torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]])  # path 0 - 1 - 2
        >>> layer = FusedImplicitDiffusion(4, mu=2.2)  # the neural Laplacian
        >>> x = torch.randn(3, 4, requires_grad=True)
        >>> z = layer(x, edge_index)
        >>> z.shape, z.dtype, layer.solver_used  # solver="auto": cg on an undirected graph
        (torch.Size([3, 4]), torch.float32, 'cg')
        >>> layer.iterations <= layer.max_iter and layer.residual >= 0
        True
        >>> z.sum().backward()
        >>> x.grad.shape, layer.backward_iterations is not None
        (torch.Size([3, 4]), True)

        A constant signal is a fixed point of the random-walk Laplacian (Delta 1 = 0):

        >>> rw = FusedImplicitDiffusion(4, mu=2.2, laplacian="rw")
        >>> torch.allclose(rw(torch.ones(3, 4), edge_index), torch.ones(3, 4))
        True
    """

    #: Whether a forward may read values back to the host (the ``sync_checks`` argument);
    #: the class default None, overridden per layer when the argument is given.
    sync_checks: Optional[bool] = None
    #: The ``flow`` argument; the class default is what a layer pickled before the argument
    #: existed reads back (it aggregated at ``edge_index[1]``).
    flow: str = "source_to_target"
    #: The ``cached`` argument (likewise for layers pickled before it existed).
    cached: bool = False
    _held = None

    def __init__(self, in_channels: int, mu: float = 2.2, laplacian: str = "neural",
                 metric_channels: Optional[int] = None, max_iter: int = 10, tol: float = 1e-6,
                 eps: float = 1e-6, backend: str = "auto", solver: str = solvers.AUTO,
                 check_every: Optional[int] = None, sync_checks: Optional[bool] = None,
                 storage_dtype: Optional[torch.dtype] = None,
                 reorder: Optional[str] = None, flow: str = "source_to_target",
                 cached: bool = False):
        super().__init__()
        check_int("in_channels", in_channels, 1)
        check_scalars(mu=mu)
        if laplacian not in LAPLACIANS:
            raise ValueError(f"laplacian must be one of {LAPLACIANS}, got {laplacian!r}")
        if metric_channels is not None:
            check_int("metric_channels", metric_channels, 1)
        check_scalars(max_iter=max_iter, tol=tol, eps=eps)
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if solver != solvers.AUTO and solver not in solver_names():
            raise ValueError(f"solver must be one of {(solvers.AUTO,) + solver_names()}, got "
                             f"{solver!r}")
        if check_every is not None:
            check_int("check_every", check_every, 0)
        if sync_checks is not None and not isinstance(sync_checks, bool):
            raise ValueError(f"sync_checks must be None, True or False, got {sync_checks!r}")
        self.storage_dtype = check_storage_dtype(storage_dtype)
        if solver != solvers.AUTO:
            check_solver_storage(solver, storage_dtype)
        if storage_dtype is not None and backend != "auto":
            check_backend_storage(backend, storage_dtype)
        self.reorder = check_reorder(reorder)
        self.flow = check_flow(flow)
        if not isinstance(cached, bool):
            raise ValueError(f"cached must be True or False, got {cached!r}")
        self.cached = cached
        self._held = None
        self.in_channels = in_channels
        self.mu = float(mu)
        self.laplacian = laplacian
        self.metric_channels = metric_channels or in_channels
        self.max_iter = max_iter
        self.tol = float(tol)
        self.eps = float(eps)
        self.backend = backend
        self.backend_used: Optional[str] = None
        self.solver = solver
        self.check_every = check_every
        self.solver_used: Optional[str] = None
        if sync_checks is not None:
            self.sync_checks = sync_checks
        if laplacian == "neural":
            h = self.metric_channels
            self.theta_chi = nn.Linear(in_channels, h, bias=False)
            self.theta_phi = nn.Linear(h, h, bias=False)
            self.theta_varphi = nn.Linear(in_channels, h, bias=False)
        self._stats: Optional[Tensor] = None

    def reset_parameters(self) -> None:
        """Re-draws the metric projections Θχ, Θφ, Θϕ of the neural Laplacian
        (``nn.Linear``'s initialization); the fixed Laplacians have no parameters.

        Example:
            >>> from dignn_kernels import FusedImplicitDiffusion
            >>> layer = FusedImplicitDiffusion(4)
            >>> layer.reset_parameters()
            >>> layer.theta_chi.weight.shape
            torch.Size([4, 4])
        """
        if self.laplacian == "neural":
            for lin in (self.theta_chi, self.theta_phi, self.theta_varphi):
                lin.reset_parameters()

    # ------------------------------------------------------- the authors' weights --
    @classmethod
    def from_authors(cls, source, prefix: Optional[str] = None,
                     **overrides) -> "FusedImplicitDiffusion":
        """The layer that computes what the authors' DIGNN code computes, from their module
        or state dict (found by attribute and key names; their code is never imported).

        What is read and how it maps:

        - ``Theta_chi``, ``Theta_phi``, ``Theta_varphi`` (``nn.Linear(bias=False)`` of
          ``ImplicitFunc_Neural``): copied into ``theta_chi``, ``theta_phi``,
          ``theta_varphi`` (same shapes: [h, d], [h, h], [h, d]), ``laplacian="neural"``,
          ``in_channels=d``, ``metric_channels=h``; the layer takes their dtype and device.
          Without them (``ImplicitFunc_RW``, which has no weights): ``laplacian="rw"``, and
          ``in_channels`` must be given.
        - their ``mu`` and ``epsilon``: ``mu`` and ``eps``.
        - ``flow="target_to_source"``: their implicit function aggregates at
          ``edge_index[0]`` (``scatter_add(..., row)``), so the layer takes the same
          ``edge_index`` they do.
        - from a ``DEQFixedPoint`` (a module with ``func``, ``max_iter`` and ``threshold``):
          their ``fwd_solver`` plus the final re-application apply the map up to
          ``max_iter + 2`` times, so ``solver="fixed_point"`` (their iteration), ``max_iter``
          theirs + 2 and ``tol=0.0``. Their
          ``threshold`` bounds ||Z_t - Z_{t-1}||_F absolutely, which has no fixed relative
          equivalent (it depends on ||Z||); ``tol=0`` always runs the whole budget, so the
          layer may apply the map more times than their early stop does: its Z is at least
          as converged. Pass ``tol=`` to stop early instead. Without a ``DEQFixedPoint``
          (their implicit function, or a state dict) the layer's defaults stay.

        ``overrides`` (any constructor argument: ``backend``, ``solver``, ``tol``,
        ``max_iter``, even ``flow``) win over what is read.

        Args:
            source: their ``DEQFixedPoint``, their ``ImplicitFunc_Neural`` or
                ``ImplicitFunc_RW``, a model holding one (their ``DIGNN_Neural`` holds the
                ``DEQFixedPoint`` as its attribute ``model``, the implicit function at
                ``model.func``), or a state dict of any of these (``mu=`` must then be
                given: a state dict holds no ``mu``; an ``ImplicitFunc_RW``'s is empty, so
                give ``laplacian="rw"`` and ``in_channels=`` with it).
            prefix: where to look when ``source`` holds more than one implicit function: a
                submodule name (``"model.func"``) or a state-dict key prefix
                (``"model.func"`` for the keys ``model.func.Theta_chi.weight`` etc.).
            **overrides: constructor arguments of the layer, applied last.

        Returns:
            FusedImplicitDiffusion: the layer, its weights copied from ``source``.

        Raises:
            TypeError: ``source`` neither an ``nn.Module`` nor a mapping of names to tensors.
            ValueError: more than one implicit function found (the message lists them: pass
                ``prefix=``), none found, a ``Theta`` missing or of the wrong shape, ``mu``
                not given with a state dict, ``in_channels`` not given for an
                ``ImplicitFunc_RW``, an override that contradicts the weights (another
                ``in_channels``, ``metric_channels`` or ``laplacian``), or an argument the
                constructor refuses.

        Example:
            >>> import torch
            >>> from torch import nn
            >>> from dignn_kernels import FusedImplicitDiffusion
            >>> class Theirs(nn.Module):  # stands for their ImplicitFunc_Neural
            ...     def __init__(self, d, h):
            ...         super().__init__()
            ...         self.mu, self.epsilon = 2.5, 1e-6
            ...         self.Theta_chi = nn.Linear(d, h, bias=False)
            ...         self.Theta_phi = nn.Linear(h, h, bias=False)
            ...         self.Theta_varphi = nn.Linear(d, h, bias=False)
            >>> theirs = Theirs(4, 3)
            >>> layer = FusedImplicitDiffusion.from_authors(theirs, backend="torch")
            >>> layer.flow, layer.mu, layer.metric_channels, layer.backend
            ('target_to_source', 2.5, 3, 'torch')
            >>> torch.equal(layer.theta_phi.weight, theirs.Theta_phi.weight)
            True
            >>> state = {f"model.func.{k}": v for k, v in theirs.state_dict().items()}
            >>> FusedImplicitDiffusion.from_authors(state, mu=2.5).in_channels
            4
        """
        found = (_authors_module(source, prefix) if isinstance(source, nn.Module) else
                 _authors_state_dict(source, prefix, overrides.get("laplacian") == "rw"))
        weights, mu, epsilon, their_max_iter = found
        settings = {"flow": "target_to_source"}
        if weights is not None:
            h, d = weights["theta_chi"].shape
            settings.update(laplacian="neural", in_channels=d, metric_channels=h)
        else:
            settings["laplacian"] = "rw"
        if mu is not None:
            settings["mu"] = mu
        if epsilon is not None:
            settings["eps"] = epsilon
        if their_max_iter is not None:
            # fwd_solver: one application before its loop, up to max_iter in it, and
            # DEQFixedPoint.forward applies the map once more: the paper's fixed-point
            # iteration, which the layer's default solver ("auto": cg or anderson) is not.
            settings.update(max_iter=int(their_max_iter) + 2, tol=0.0, solver="fixed_point")
        if weights is not None:
            for name in ("laplacian", "in_channels", "metric_channels"):
                if name in overrides and overrides[name] != settings[name]:
                    raise ValueError(
                        f"{name}={overrides[name]!r} contradicts the authors' weights, which "
                        f"give {name}={settings[name]!r} (Theta_chi is [h, d] = "
                        f"{list(weights['theta_chi'].shape)}): leave {name} out")
        elif overrides.get("laplacian") == "neural":
            raise ValueError("laplacian='neural' but the source holds no Theta weights (the "
                             "authors' ImplicitFunc_RW): the layer's would be random; leave "
                             "laplacian out (it is 'rw' then)")
        settings.update(overrides)
        if "mu" not in settings:
            raise ValueError("mu must be given (from_authors(state_dict, mu=...)): a state "
                             "dict holds no mu; use their module's mu (their --mu)")
        if "in_channels" not in settings:
            raise ValueError("in_channels must be given for the authors' ImplicitFunc_RW, "
                             "which has no weights to read it from: "
                             "from_authors(..., in_channels=d)")
        in_channels = settings.pop("in_channels")
        # The layer's own initialization is overwritten by their weights below; it must not
        # advance the global generator, or swapping their layer for this one would change
        # every later random draw of their training (dropout masks, the next model's init).
        with torch.random.fork_rng(devices=[]):
            layer = cls(in_channels, **settings)
        if weights is not None:
            like = weights["theta_chi"]
            layer.to(device=like.device, dtype=like.dtype)
            with torch.no_grad():
                for name, w in weights.items():
                    getattr(layer, name).weight.copy_(w)
        return layer

    # ----------------------------------------------------------------- diagnostics --
    def _stat(self, index: int):
        """Entry `index` of [forward iterations, residual, relative residual, backward
        iterations, residual, relative residual]; None for a solve that has not run (the
        backward's are not seen under torch.compile)."""
        if self._stats is None:
            return None
        stats = self._stats if index < 3 else solvers.backward_stats(self._stats)
        if stats is None:
            return None
        value = float(stats[index % 3])
        return int(value) if index % 3 == 0 else value

    iterations = _stat_property(
        0, "Iterations of the last forward solve (CSR sweeps for cg and anderson); None "
           "before one ran.")
    residual = _stat_property(
        1, "Residual at the end of the last forward solve: ||Z_t - Z_{t-1}||_F for the fixed "
           "point, ||X - Z - Delta Z / mu||_F for cg and anderson; None before one ran.")
    relative_residual = _stat_property(
        2, "``residual`` over ||Z_t||_F (fixed point) or ||X||_F (cg, anderson): what is "
           "compared with ``tol``; None before a forward ran.")
    backward_iterations = _stat_property(
        3, "Adjoint iterations of the last backward (None before one has run, or under "
           "torch.compile, where the backward's stats are not seen).")
    backward_residual = _stat_property(
        4, "Residual at the end of the last adjoint solve (None before a backward ran).")
    backward_relative_residual = _stat_property(
        5, "``backward_residual`` relative to the incoming gradient's norm, as compared with "
           "``tol`` (None before a backward ran).")

    # --------------------------------------------------------------------- forward --
    def _resolve_backend(self, device: torch.device, num_entries: int) -> str:
        available = available_backends(device, num_entries, self.storage_dtype)
        if self.backend == "auto":
            return available[0]
        check_backend_storage(self.backend, self.storage_dtype)
        if self.backend not in available:
            raise RuntimeError(
                f"backend={self.backend!r} cannot run on {device}: available there are "
                f"{available}. " + ("The CUDA kernels were not built; reinstall with a CUDA "
                                    "toolkit (DIGNN_WITH_CUDA=1) or use backend='triton' or "
                                    "'torch'." if self.backend == "cuda" else
                                    "Triton needs a CUDA GPU (on the CPU only its interpreter, "
                                    "TRITON_INTERPRET=1) and the triton package; use "
                                    "backend='auto'." if self.backend == "triton" else
                                    "Use backend='auto'."))
        return self.backend

    def _host_checks(self, x: Tensor) -> bool:
        """Whether this forward reads values back to check them (see ``sync_checks``)."""
        wanted = x.device.type == "cpu" if self.sync_checks is None else self.sync_checks
        return wanted and solvers.host_reads_allowed(x)

    def _check_x(self, x: Tensor) -> bool:
        """Validates x; returns whether this forward reads values back to check them."""
        if not isinstance(x, Tensor):
            raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() != 2 or x.size(1) != self.in_channels:
            raise ValueError(f"x must have shape [num_nodes, {self.in_channels}] "
                             f"(in_channels={self.in_channels}), got {list(x.shape)}")
        if not x.is_floating_point():
            raise TypeError(f"x must be a floating tensor, got {x.dtype}; convert it with "
                            f"x.float()")
        host_checks = self._host_checks(x)
        if host_checks and x.numel():
            if not bool(torch.isfinite(x).all()):
                raise ValueError("x contains NaN or Inf; the equilibrium is undefined")
        if self.laplacian == "neural":
            wdev = self.theta_chi.weight.device
            if wdev != x.device:
                raise ValueError(f"x is on {x.device} but the layer's parameters are on "
                                 f"{wdev}; move them with layer.to({str(x.device)!r})")
        return host_checks

    def forward(self, x: Tensor, edge_index, edge_weight: Optional[Tensor] = None) -> Tensor:
        """Z, the equilibrium of Z = X - (1/mu) Delta Z (eq. 17) for the input ``x``.

        Args:
            x: float Tensor [num_nodes, in_channels] (float32, float64, or 16-bit: solved in
                float32 and returned in x's dtype), on the device of the layer's parameters.
            edge_index: int64 (or int32) Tensor [2, num_edges], messages from
                ``edge_index[0]`` to ``edge_index[1]`` (row i aggregates over the edges
                (j, i), as PyG's ``source_to_target``; the other way round with
                ``flow="target_to_source"``); or a torch sparse tensor (COO, CSR, CSC, BSR,
                BSC) or torch_sparse ``SparseTensor`` [num_nodes, num_nodes] read as PyG's
                ``adj_t``; or a
                prebuilt :class:`~dignn_kernels.CSRGraph` (what ``torch.compile`` wants); or a
                :class:`~dignn_kernels.distributed.DistributedGraph` (x and Z: the owned rows).
            edge_weight: optional float Tensor [num_edges] of edge values a_ij >= 0 (default
                1; 16-bit weights are summed in float32); not with a sparse tensor or a
                :class:`~dignn_kernels.CSRGraph`.

        Returns:
            Tensor: Z of x's shape and dtype, on x's device, in x's node order.

        Raises:
            ValueError, TypeError, IndexError, RuntimeError: see the class docstring.

        Example:
            >>> import torch
            >>> from dignn_kernels import FusedImplicitDiffusion
            >>> layer = FusedImplicitDiffusion(2, laplacian="sym")
            >>> edge_index = torch.tensor([[0, 1], [1, 0]])
            >>> layer(torch.tensor([[1.0, 0.0], [0.0, 1.0]]), edge_index).shape
            torch.Size([2, 2])
        """
        if torch.jit.is_tracing():
            raise RuntimeError(_NOT_TORCHSCRIPT.format(how="torch.jit.trace"))
        if isinstance(x, Tensor) and torch.amp.is_autocast_available(x.device.type) and \
                torch.is_autocast_enabled(x.device.type):
            # Under autocast the projections' GEMMs would run in 16 bits and the solve's sums
            # with them: the layer computes in float32 (or float64) inside and returns x's
            # dtype, as it does for 16-bit x outside autocast.
            with torch.autocast(x.device.type, enabled=False):
                return self.forward(x, edge_index, edge_weight)
        if isinstance(edge_index, DistributedGraph):
            return self._forward_distributed(x, edge_index, edge_weight)
        host_checks = self._check_x(x)
        edge_device = _graph_device(edge_index)
        if edge_device is not None and edge_device != x.device:
            raise ValueError(f"x is on {x.device} but the graph is on {edge_device}; move "
                             f"both to the same device")
        graph = self._held_graph(x, edge_index, edge_weight) if self.cached else \
            self._graph(x, edge_index, edge_weight, self.reorder, self.flow)
        backend = self._resolve_backend(x.device, graph.num_edges)
        self.backend_used = backend
        solver = self._solver_for(graph.symmetric)
        self.solver_used = solver
        out_dtype = x.dtype
        compute = torch.float64 if torch.float64 in (x.dtype, self._param_dtype()) else \
            torch.float32
        xc = graph.to_graph_order(x.to(compute))
        z, stats = self._forward_kernels(graph, xc, backend, solver, host_checks)
        self._stats = stats
        return graph.to_user_order(z).to(out_dtype)

    def _solver_for(self, symmetric: bool) -> str:
        """The solver a forward runs on a graph whose W is ``symmetric`` or not: ``"auto"``
        resolved by :func:`~dignn_kernels.solvers.auto_solver`, a named one by
        :func:`~dignn_kernels.solvers.resolve_solver` (cg on a directed graph: anderson)."""
        if self.solver == solvers.AUTO:
            return solvers.auto_solver(symmetric, self.storage_dtype)
        return solvers.resolve_solver(self.solver, symmetric)

    def __prepare_scriptable__(self):
        # torch.jit.script calls this first: refuse with the fix instead of an error about
        # the layer's internals
        raise RuntimeError(_NOT_TORCHSCRIPT.format(how="torch.jit.script"))

    def _held_graph(self, x: Tensor, edge_index, edge_weight: Optional[Tensor]) -> CSRGraph:
        """``cached=True``: the graph of an earlier forward while the same ``edge_index`` and
        ``edge_weight`` objects (held by weak reference) come back with the same node count,
        device and layout options; else a fresh :meth:`_graph`, held for the next call."""
        key = (x.size(0), x.device, self.reorder, self.flow)
        held = self._held
        if held is not None and held[0]() is edge_index and held[2] == key and \
                (held[1] is None if edge_weight is None else held[1]() is edge_weight):
            return held[3]
        graph = self._graph(x, edge_index, edge_weight, self.reorder, self.flow)
        try:
            refs = (weakref.ref(edge_index),
                    None if edge_weight is None else weakref.ref(edge_weight))
        except TypeError:  # (an object without weak references is built every call)
            return graph
        self._held = refs + (key, graph)
        return graph

    def __getstate__(self):
        # the held graph is a cache of objects that a copy or a pickle does not carry
        state = super().__getstate__() if hasattr(super(), "__getstate__") else \
            self.__dict__
        state = dict(state)
        state["_held"] = None
        return state

    @staticmethod
    def _graph(x: Tensor, edge_index, edge_weight: Optional[Tensor],
               reorder: str = "none", flow: str = "source_to_target") -> CSRGraph:
        """The preprocessed graph: ``edge_index`` itself when it is a :class:`CSRGraph`
        (what ``torch.compile(..., fullgraph=True)`` needs: the cache lookup is not traced)
        built for ``flow``, else the cached build for ``flow``."""
        if not isinstance(edge_index, CSRGraph):
            return cached_graph(edge_index, x.size(0), edge_weight, reorder, flow)
        if edge_weight is not None:
            raise ValueError("edge_weight goes into the CSRGraph: pass it to "
                             "dignn_kernels.build_graph(edge_index, num_nodes, edge_weight), "
                             "not with a prebuilt graph")
        if edge_index.num_nodes != x.size(0):
            raise ValueError(f"the CSRGraph has {edge_index.num_nodes} nodes but x has "
                             f"{x.size(0)} rows")
        if edge_index.flow != flow:
            # The CSR fixes which node aggregates; solving it under the other flow would be
            # another model on a directed graph, with no error.
            raise ValueError(f"the CSRGraph was built with flow={edge_index.flow!r} but the "
                             f"layer has flow={flow!r}: build it with "
                             f"dignn_kernels.build_graph(edge_index, num_nodes, "
                             f"flow={flow!r}), or pass edge_index itself")
        if not torch.compiler.is_compiling():
            edge_index.check()  # once per graph; a no-op for graphs from build_graph
        return edge_index

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

    def _forward_kernels(self, graph: CSRGraph, x: Tensor, backend: str, solver: str,
                         host_checks: bool):
        t = graph.transposed()
        t_rowptr, t_col, t_perm = t if t is not None else (None, None, None)
        config = dict(mu=self.mu, eps=self.eps, max_iter=self.max_iter, tol=self.tol,
                      solver=solver, backend=backend, check_every=self.check_every,
                      t_rowptr=t_rowptr, t_col=t_col, t_perm=t_perm,
                      diag_index=graph.diagonal_index() if get_solver(solver).spd else None,
                      host_checks=host_checks, trusted=True,  # checked once per graph
                      storage_dtype=self.storage_dtype)
        call = solvers.implicit_diffusion
        if self.laplacian == "neural":
            a, degree = graph.values(x.dtype)
            chi, p, q = self._projections(x, degree)
            return call(graph.rowptr, graph.col, a, x, chi, p, q, None, **config)
        w, chi, kappa = graph.fixed_laplacian(self.laplacian, x.dtype)
        return call(graph.rowptr, graph.col, w, x, chi, None, None, kappa, **config)

    # ---------------------------------------------------- partitioned graphs (issue 15) --
    def _forward_distributed(self, x: Tensor, graph: "DistributedGraph",
                             edge_weight: Optional[Tensor]) -> Tensor:
        """The owned rows of Z on one rank of a partitioned graph (x: the owned rows); see
        :mod:`dignn_kernels.distributed`."""
        part_flow = getattr(graph.partition, "flow", "source_to_target")
        if part_flow != self.flow:
            raise ValueError(f"the DistributedGraph's partition was built with "
                             f"flow={part_flow!r} but the layer has flow={self.flow!r}: "
                             f"partition the graph with partition(..., flow={self.flow!r})")
        return distributed_forward(self, x, graph, edge_weight)

    def extra_repr(self) -> str:
        """The constructor's arguments as ``print(layer)`` shows them."""
        return (f"{self.in_channels}, mu={self.mu}, laplacian={self.laplacian!r}, "
                f"metric_channels={self.metric_channels}, max_iter={self.max_iter}, "
                f"tol={self.tol}, eps={self.eps}, backend={self.backend!r}, "
                f"solver={self.solver!r}" + (f", storage_dtype={self.storage_dtype}"
                                             if self.storage_dtype is not None else "")
                + (f", reorder={self.reorder!r}" if self.reorder != "none" else "")
                + f", flow={self.flow!r}" + (", cached=True" if self.cached else ""))


_NOT_TORCHSCRIPT = (
    "FusedImplicitDiffusion does not support TorchScript ({how}): use torch.compile(model) "
    "instead (with a prebuilt graph from dignn_kernels.build_graph for fullgraph=True)")


def _graph_device(edge) -> Optional[torch.device]:
    if isinstance(edge, (Tensor, CSRGraph)):
        return edge.device
    if hasattr(edge, "device") and callable(edge.device):  # torch_sparse.SparseTensor
        return edge.device()
    return None


# ------------------------------------------------------------ the authors' modules --

#: Their names of the neural Laplacian's matrices, and ours (``nn.Linear`` both).
_AUTHORS_THETAS = {"theta_chi": "Theta_chi", "theta_phi": "Theta_phi",
                   "theta_varphi": "Theta_varphi"}


def _listed(names) -> str:
    return ", ".join(repr(n) if n else "(the source itself)" for n in names)


def _checked_thetas(weights: dict, where: str) -> dict:
    """The three matrices of shapes [h, d], [h, h], [h, d], floating, or a ValueError
    naming the one that is not."""
    for ours, t in weights.items():
        if not (isinstance(t, Tensor) and t.dim() == 2 and t.is_floating_point()):
            got = f"{t.dtype} {list(t.shape)}" if isinstance(t, Tensor) else type(t).__name__
            raise ValueError(f"{where}{_AUTHORS_THETAS[ours]}.weight must be a floating "
                             f"matrix, got {got}")
    h, d = weights["theta_chi"].shape
    want = {"theta_chi": [h, d], "theta_phi": [h, h], "theta_varphi": [h, d]}
    for ours, shape in want.items():
        if list(weights[ours].shape) != shape:
            raise ValueError(f"{where}{_AUTHORS_THETAS[ours]}.weight has shape "
                             f"{list(weights[ours].shape)} but Theta_chi.weight is [h, d] = "
                             f"{[h, d]}, so it must be {shape} (Theta_chi: d -> h, Theta_phi: "
                             f"h -> h, Theta_varphi: d -> h)")
    return weights


def _authors_module(source: nn.Module, prefix: Optional[str]):
    """(weights or None, mu, epsilon, max_iter) of the authors' module ``source``."""
    root = source
    if prefix:
        try:
            root = source.get_submodule(prefix)
        except AttributeError:
            raise ValueError(f"prefix={prefix!r} names no submodule of the source; its "
                             f"submodules are {_listed(n for n, _ in source.named_modules())}"
                             ) from None
    holders = [(n, m) for n, m in root.named_modules()
               if isinstance(getattr(m, "func", None), nn.Module)
               and hasattr(m, "max_iter") and hasattr(m, "threshold")]
    neural = [(n, m) for n, m in root.named_modules()
              if all(isinstance(getattr(m, t, None), nn.Module)
                     for t in _AUTHORS_THETAS.values())]
    for kind, found in (("DEQFixedPoint modules (func, max_iter, threshold)", holders),
                        ("implicit functions (Theta_chi, Theta_phi, Theta_varphi)", neural)):
        if len(found) > 1:
            raise ValueError(f"the source holds {len(found)} {kind}: "
                             f"{_listed(n for n, _ in found)}; pass prefix= naming the one to "
                             f"load")
    if holders:
        holder = holders[0][1]
        func, max_iter = holder.func, holder.max_iter
    elif neural:
        func, max_iter = neural[0][1], None
    elif hasattr(root, "mu") and not any(True for _ in root.parameters()):
        func, max_iter = root, None  # ImplicitFunc_RW: mu and nothing else
    else:
        raise ValueError(f"found no DIGNN implicit function in the {type(root).__name__}: "
                         f"neither a module with Theta_chi, Theta_phi and Theta_varphi "
                         f"(ImplicitFunc_Neural), nor a DEQFixedPoint (func, max_iter, "
                         f"threshold), nor an ImplicitFunc_RW (mu, no parameters)")
    if not hasattr(func, "mu"):
        raise ValueError(f"the authors' implicit function ({type(func).__name__}) has no mu")
    if all(isinstance(getattr(func, t, None), nn.Module) for t in _AUTHORS_THETAS.values()):
        weights = _checked_thetas({ours: getattr(getattr(func, t), "weight", None)
                                   for ours, t in _AUTHORS_THETAS.items()},
                                  f"{type(func).__name__}.")
        weights = {k: w.detach() for k, w in weights.items()}
        return weights, func.mu, getattr(func, "epsilon", None), max_iter
    return None, func.mu, None, max_iter


def _authors_state_dict(source, prefix: Optional[str], rw_given: bool):
    """(weights or None, None, None, None) of a state dict of the authors' modules; None
    weights (an ImplicitFunc_RW's empty state dict) only when ``laplacian="rw"`` was
    given."""
    if not isinstance(source, Mapping):
        raise TypeError(f"source must be the authors' module (an nn.Module) or a state dict "
                        f"(a mapping of names to tensors), got {type(source).__name__}")
    start = prefix.rstrip(".") + "." if prefix else ""
    keys = [k for k in source if isinstance(k, str) and k.startswith(start)]
    if prefix and not keys and not rw_given:
        raise ValueError(f"prefix={prefix!r} matches no key of the state dict")
    chi = "Theta_chi.weight"
    groups = [k[: len(k) - len(chi)] for k in keys if k == start + chi or
              k.endswith("." + chi)]
    if len(groups) > 1:
        raise ValueError(f"the state dict holds {len(groups)} sets of Theta weights, under "
                         f"{_listed(g.rstrip('.') for g in groups)}; pass prefix= naming the "
                         f"one to load")
    if not groups:
        if rw_given:
            return None, None, None, None
        raise ValueError("the state dict holds no Theta_chi.weight (under any prefix): for "
                         "the authors' ImplicitFunc_RW, whose state dict is empty, pass "
                         "laplacian='rw', in_channels= and mu= (or pass their module)")
    group = groups[0]
    missing = [group + t + ".weight" for t in _AUTHORS_THETAS.values()
               if group + t + ".weight" not in source]
    if missing:
        raise ValueError(f"the state dict lacks {', '.join(missing)} (next to "
                         f"{group + chi})")
    weights = _checked_thetas({ours: source[group + t + ".weight"]
                               for ours, t in _AUTHORS_THETAS.items()}, group)
    return {k: w.detach() for k, w in weights.items()}, None, None, None
