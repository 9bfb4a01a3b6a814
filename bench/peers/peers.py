"""The peer harness: this layer side by side with what a user would pick instead, on the same
graph and the same weights, in one process and one run.

Peers (the names the JSON uses):

- ``dignn-<backend>``: :class:`dignn_kernels.FusedImplicitDiffusion` on every backend the device
  has (:func:`dignn_kernels.available_backends`; Triton only on a GPU).
- ``authors``: the authors' ``DEQFixedPoint(ImplicitFunc_Neural(h, h, mu), fwd_solver,
  fwd_solver, max_iter, threshold)`` imported from a checkout of github.com/guoji-fu/DIGNN whose
  path the user gives (``--authors`` or ``$DIGNN_AUTHORS``; see :func:`load_authors`).
- ``torchdeq-fixed_point``, ``torchdeq-anderson``: a DEQ written with torchdeq's ``get_deq``
  (implicit differentiation) around f(z) = x - (1/mu) Delta z.
- ``pyg-plain``: K fixed-point applications unrolled, autograd through all of them.

All compute DIGNN's layer, Z = X - (1/mu) Delta Z (paper eq. 17), with the graph neural
Laplacian of eq. 12-14, in the authors' convention: node i aggregates over the edges (i, j) of
the given edge_index (at edge_index[0]). Peers built on PyG's convention (messages to
edge_index[1]) get ``edge_index.flip(0)``, or this layer ``flow="target_to_source"`` where it
has that argument. The oracle is :mod:`dignn_kernels.reference` in float64 on the flipped graph.

Passes, in this order on each graph (``--passes``):

- product: which sparse format the PyG-written peers' product takes (:data:`PRODUCTS`: PyG's
  spmm on a COO matrix, which converts it to CSR on every call; CSR converted once per
  forward; CSR built from the values; PyG's EdgeIndex), each timed in the plain composition's
  step, rounds interleaved; the fastest is used by the PyG and torchdeq peers and recorded;
- time (equal work: 10 applications of the map forward and 10 adjoint ones, one
  forward+backward of L = sum(Z * G) per round, rounds interleaved over the peers);
- memory: the allocator's peak during one such step, plus every structure the peer keeps
  between steps (this layer's cached CSR graph and its graph-cache entry, the PyG peers'
  coalesced edges and degrees, an EdgeIndex's caches), each storage counted once;
- accuracy: every peer to convergence, Z and the gradients of L against the float64 oracle;
- tolerance: every peer to relative residual 1e-6 of the equation and of its adjoint by its
  own stopping rule (this layer with its fixed point, cg and Anderson; the authors' absolute
  threshold scaled by ||X|| and ||G||; torchdeq's fixed point and Anderson; the plain
  composition with the fewest applications that reach it), the residuals it reached measured
  the same way for all in float64 (||X - Z - Delta Z/mu|| / ||X|| and ||G - u - Delta^T u/mu||
  / ||G||, u the gradient that reaches X through the right-hand side), its iterations, and
  forward and backward timed apart, rounds interleaved over every peer and solver.

Usage: ``python bench/peers/peers.py --device cpu --out bench/results/peers_cpu.json``
(``--help``).
"""
import argparse
import contextlib
import gc
import importlib
import importlib.util
import inspect
import math
import os
import statistics
import subprocess
import sys
import time
import types
import warnings
from pathlib import Path
from typing import Callable, Dict, List, Optional

import torch
from torch import Tensor, nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import record  # noqa: E402  (bench/record.py: the results format)

HERE = Path(__file__).resolve().parent
BENCH = HERE.parent
REPO = BENCH.parent
STAND_INS = HERE / "stand_ins"
DATA_DEFAULT = REPO.parent / "shared" / "data"  # the project's default: $DIGNN_DATA, else ../shared/data
SCHEMA = "dignn-peers/2"  # 2: peak_bytes counts the cached structures; product, tolerance
GRAPHS = ("cora", "chameleon", "chameleon-directed", "cornell5", "penn94_like",
          "products")
MU, EPS, CHANNELS, SEED = 2.2, 1e-6, 64, 0
DENSE_ORACLE_MAX_NODES = 5000
K_TIMED = 10  # map applications per pass in the timing pass, forward and adjoint alike
AUTHORS_TIMED_MAX_ITER = 8  # their loop: max_iter + 2 applications forward, max_iter + 1 adjoint
ACCURACY = {"dignn_tol": 1e-7, "dignn_max_iter": 2000, "abs_threshold_per_norm_x": 1e-6,
            "authors_max_iter": 2000, "torchdeq_max_iter": 2000, "pyg_plain_k": 100}
PASSES = ("product", "time", "memory", "accuracy", "tolerance")
GOALS = {"vs_authors_time": 20.0, "vs_torchdeq_time": 4.0, "vs_authors_memory": 20.0,
         "agreement": 1e-5}
PRODUCTS_TIME_LIMIT_S = 180.0  # products: fewer timed rounds where a peer's would take longer
TOLERANCE = 1e-6  # the time-to-tolerance pass: relative residual, forward and adjoint
TOLERANCE_MAX_ITER = 2000
TOLERANCE_SOLVERS = ("fixed_point", "cg", "anderson")  # this layer's, in that pass
ERROR_KEYS = ("z", "grad_x", "grad_theta_chi", "grad_theta_phi", "grad_theta_varphi")


# ------------------------------------------------------------------ the authors' code --

class _TorchWithoutCudaSync(types.ModuleType):
    """``torch`` for the authors' module on a machine without CUDA: every attribute is
    torch's except ``cuda.synchronize``, a no-op (their backward hook calls it, which raises
    where there is no GPU)."""

    def __init__(self):
        super().__init__("torch")
        cuda = types.ModuleType("torch.cuda")
        cuda.__getattr__ = lambda name: getattr(torch.cuda, name)
        cuda.synchronize = lambda device=None: None
        self.cuda = cuda

    def __getattr__(self, name):
        return getattr(torch, name)


_AUTHORS: Dict[str, types.SimpleNamespace] = {}


def _commit_of(path: Path) -> str:
    try:
        out = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    marker = path / ".commit"
    return marker.read_text().strip() if marker.exists() else "unknown"


def _load_module_from(name: str, init: Path):
    spec = importlib.util.spec_from_file_location(name, init)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_authors(path) -> types.SimpleNamespace:
    """Imports ``DEQFixedPoint``, ``ImplicitFunc_Neural`` and ``fwd_solver`` from a checkout
    of the authors' DIGNN at ``path`` (its ``nodeclassification/src/layers.py`` and
    ``src/solvers.py``), without leaving their ``src`` package in ``sys.modules``: it is
    imported under a fresh ``src`` namespace that is removed again (with whatever ``src`` was
    there put back). ``torch_scatter``/``torch_sparse`` are the real packages where they
    import, else this project's stand-ins (bench/peers/stand_ins). Where CUDA is absent their
    module's ``torch.cuda.synchronize`` is a no-op.

    Returns a namespace with the three names and ``info`` (path, commit, stand_ins,
    cuda_synchronize) for the JSON. Raises FileNotFoundError naming the missing file."""
    root = Path(path).expanduser().resolve()
    key = str(root)
    if key in _AUTHORS:
        return _AUTHORS[key]
    pkg = root / "nodeclassification" / "src"
    for need in ("layers.py", "solvers.py"):
        if not (pkg / need).is_file():
            raise FileNotFoundError(
                f"{pkg / need} not found: --authors (or $DIGNN_AUTHORS) must name a checkout "
                f"of github.com/guoji-fu/DIGNN (the folder holding nodeclassification/)")
    swapped = ("src", "torch_scatter", "torch_sparse")
    saved = {k: m for k, m in sys.modules.items()
             if k.split(".")[0] in swapped}
    used = {}
    try:
        for k in saved:
            if k.split(".")[0] == "src":
                del sys.modules[k]
        for dep in ("torch_scatter", "torch_sparse"):
            if dep in sys.modules or importlib.util.find_spec(dep) is not None:
                importlib.import_module(dep)
                used[dep] = "real " + getattr(sys.modules[dep], "__version__", "(version ?)")
            else:
                sys.modules[dep] = _load_module_from(dep, STAND_INS / dep / "__init__.py")
                used[dep] = "stand-in bench/peers/stand_ins/" + dep
        src = types.ModuleType("src")
        src.__path__ = [str(pkg)]
        sys.modules["src"] = src
        solvers = importlib.import_module("src.solvers")
        layers = importlib.import_module("src.layers")
    finally:
        for k in [k for k in sys.modules if k.split(".")[0] in swapped]:
            del sys.modules[k]
        sys.modules.update(saved)
    if torch.cuda.is_available():
        sync = "torch.cuda.synchronize (CUDA available)"
    else:
        layers.torch = _TorchWithoutCudaSync()
        sync = "no-op on the CPU"
    ns = types.SimpleNamespace(
        DEQFixedPoint=layers.DEQFixedPoint, ImplicitFunc_Neural=layers.ImplicitFunc_Neural,
        fwd_solver=solvers.fwd_solver,
        info={"path": str(root), "commit": _commit_of(root), "stand_ins": used,
              "cuda_synchronize": sync})
    _AUTHORS[key] = ns
    return ns


# ------------------------------------------------- the map written with PyG / PyTorch --

# The sparse formats a PyG user can hand the map's sparse product (the product pass times each
# and the PyG-written peers take the fastest; --pyg-product names one instead):
PRODUCTS = {
    "coo": "a coalesced COO matrix of the edge weights into torch_geometric.utils.spmm, which "
           "converts it to CSR on every call (and warns so)",
    "csr": "the coalesced COO matrix converted to CSR once per forward (to_sparse_csr), the "
           "CSR into torch_geometric.utils.spmm (torch.sparse.mm)",
    "csr_direct": "a CSR matrix built from (crow, col, weights) once per forward into "
                  "torch_geometric.utils.spmm: its backward to the weights forms a dense n x n "
                  "gradient",
    "edge_index": "PyG's EdgeIndex sorted by row (its CSR cached across forwards), "
                  "EdgeIndex.matmul with the weights as input_value (differentiable weights "
                  "take PyG's gather/scatter path where torch_sparse is absent)",
}
PRODUCT_CANDIDATES = ("coo", "csr", "csr_direct", "edge_index")
PRODUCT_DEFAULT = "csr"  # where the product pass did not run


def _torch_sparse_state() -> str:
    try:
        import torch_sparse
        return "real " + getattr(torch_sparse, "__version__", "(version ?)")
    except Exception as err:  # ImportError, or a broken build
        return f"absent ({type(err).__name__}): its SparseTensor was not measured"


class NeuralLaplacianMap(nn.Module):
    """f(z) = x - (1/mu) Delta z with DIGNN's graph neural Laplacian (eq. 12-14) as a PyG user
    writes it: node projections, edge terms from gathered node rows, one sparse matrix of the
    edge weights in the format ``product`` (one of :data:`PRODUCTS`) and PyG's sparse
    product; ``weights(x)`` builds Delta once per forward (differentiable in x and the
    Thetas), ``apply`` is one application of the map. ``edge_index`` is in PyG's convention
    (aggregation at edge_index[1])."""

    def __init__(self, channels: int, mu: float = MU, eps: float = EPS, product: str = "coo"):
        super().__init__()
        if product not in PRODUCTS:
            raise ValueError(f"product must be one of {sorted(PRODUCTS)}, got {product!r}")
        self.mu, self.eps, self.product = mu, eps, product
        self.theta_chi = nn.Linear(channels, channels, bias=False)
        self.theta_phi = nn.Linear(channels, channels, bias=False)
        self.theta_varphi = nn.Linear(channels, channels, bias=False)
        self._graph = None
        self._edge_index = None
        self._rowptr = None

    def prepare(self, edge_index: Tensor, num_nodes: int) -> None:
        """Graph preprocessing, outside the timed step: the edges coalesced (a repeated edge
        becomes one entry of weight a_ij = its multiplicity, the same Laplacian) and sorted
        by target, degrees D_i = sum_j a_ij; the row pointers for ``csr_direct``, the
        EdgeIndex for ``edge_index``."""
        from torch_geometric.utils import coalesce, scatter
        ones = torch.ones(edge_index.size(1), device=edge_index.device)
        # coalesce sorts by the first row: put the target there
        (dst, src), a = coalesce(edge_index.flip(0), ones, num_nodes, reduce="sum")
        deg = scatter(a, dst, 0, dim_size=num_nodes, reduce="sum")
        index = torch.stack([dst, src])
        self._graph = (dst, src, index, a, deg, num_nodes)
        if self.product == "csr_direct":
            self._rowptr = torch._convert_indices_from_coo_to_csr(dst, num_nodes)
        if self.product == "edge_index":
            from torch_geometric import EdgeIndex
            self._edge_index = EdgeIndex(index, sparse_size=(num_nodes, num_nodes),
                                         sort_order="row")

    def caches(self) -> Dict[str, object]:
        """What the map keeps between forwards (the prepared graph; the EdgeIndex with the
        CSR it caches once used), for the memory pass."""
        dst, src, index, a, deg, _ = self._graph
        out = {"coalesced edges (dst, src, stacked index)": [dst, src, index],
               "edge multiplicities a_ij, degrees": [a, deg]}
        if self._rowptr is not None:
            out["CSR row pointers"] = [self._rowptr]
        if self._edge_index is not None:
            ei = self._edge_index
            out["EdgeIndex and its caches"] = [ei.as_tensor()] + [
                t for t in vars(ei).values() if isinstance(t, Tensor)] + _tensors_in(
                getattr(ei, "_cache", None))
        return out

    def weights(self, x: Tensor):
        from torch_geometric.utils import scatter
        dst, src, index, a, deg, n = self._graph
        h = self.theta_chi(x)
        chi = deg * torch.tanh(h.norm(dim=1))  # eq. 12
        p = self.theta_phi(h)
        phi = torch.tanh((p[dst] * p[src]).sum(dim=1).abs())  # eq. 13
        q = self.theta_varphi(x)  # linear: Theta (x_i - x_j) = q_i - q_j
        varphi_sq = torch.tanh(1.0 / ((q[dst] - q[src]).norm(dim=1) + self.eps))  # eq. 14
        w = a * phi * varphi_sq
        # On the CPU, torch.sparse.mm's backward to the values of a COO matrix, or of a CSR
        # matrix built from (crow, col, values), forms a dense n x n gradient (1.3 GiB on
        # cornell5: the product pass's csr_direct; a COO fed to torch.sparse.mm does the same),
        # while a coalesced COO converted by to_sparse_csr() keeps it sparse. PyG's spmm
        # makes that conversion itself on every call ("coo"); "csr" makes it once per forward.
        if self.product == "coo":
            adj = torch.sparse_coo_tensor(index, w, (n, n), is_coalesced=True)
        elif self.product == "csr":
            adj = torch.sparse_coo_tensor(index, w, (n, n), is_coalesced=True).to_sparse_csr()
        elif self.product == "csr_direct":
            adj = torch.sparse_csr_tensor(self._rowptr, src, w, (n, n))
        else:
            adj = (self._edge_index, w)
        row_sum = scatter(w, dst, 0, dim_size=n, reduce="sum")
        inv_chi = torch.where(chi > 0, 1.0 / chi.clamp_min(1e-30), torch.zeros_like(chi))
        return adj, row_sum.unsqueeze(1), inv_chi.unsqueeze(1)

    def apply(self, x: Tensor, z: Tensor, delta) -> Tensor:
        from torch_geometric.utils import spmm
        adj, row_sum, inv_chi = delta
        if isinstance(adj, tuple):
            wz = adj[0].matmul(z, input_value=adj[1])
        else:
            with warnings.catch_warnings():  # "coo": PyG's conversion warning, every call
                warnings.simplefilter("ignore", UserWarning)
                wz = spmm(adj, z, reduce="sum")
        # (Delta z)_i = (1/chi_i) sum_j w_ij (z_i - z_j)  (eq. 6)
        return x - inv_chi * (row_sum * z - wz) / self.mu


def _tensors_in(obj) -> List[Tensor]:
    """The tensors in ``obj`` (a tensor, or nested dicts, lists, tuples and dataclass-like
    objects' attributes), for counting cached bytes."""
    out, stack, seen = [], [obj], set()
    while stack:
        o = stack.pop()
        if o is None or id(o) in seen:
            continue
        seen.add(id(o))
        if isinstance(o, Tensor):
            out.append(o)
        elif isinstance(o, dict):
            stack.extend(o.values())
        elif isinstance(o, (list, tuple)):
            stack.extend(o)
        elif hasattr(o, "__dict__") and not isinstance(o, (type, types.ModuleType)):
            stack.extend(vars(o).values())
    return out


def _storage_key(t: Tensor):
    try:
        return (t.device, t.untyped_storage().data_ptr())
    except RuntimeError:  # a sparse tensor: its parts are listed separately
        return (t.device, id(t))


def tensor_bytes(groups: Dict[str, object]) -> Dict[str, int]:
    """Bytes held by each named group of tensors (see :func:`_tensors_in`), every storage
    counted once over all groups (a view or an alias is not counted twice); a sparse
    tensor counts its indices and values."""
    seen, out = set(), {}
    for name, obj in groups.items():
        total = 0
        for t in _tensors_in(obj):
            parts = [t]
            if t.layout == torch.sparse_coo:
                parts = [t._indices(), t._values()]
            elif t.layout in (torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr,
                              torch.sparse_bsc):
                parts = list(_compressed_parts(t))
            for part in parts:
                key = _storage_key(part)
                if key in seen:
                    continue
                seen.add(key)
                total += part.untyped_storage().nbytes()
        out[name] = total
    return out


def _compressed_parts(t: Tensor):
    if t.layout in (torch.sparse_csr, torch.sparse_bsr):
        return t.crow_indices(), t.col_indices(), t.values()
    return t.ccol_indices(), t.row_indices(), t.values()


def _python_bytes(obj) -> int:
    """sys.getsizeof summed over a nest of tuples, lists and scalars (a cache key)."""
    total, stack = 0, [obj]
    while stack:
        o = stack.pop()
        total += sys.getsizeof(o)
        if isinstance(o, (tuple, list)):
            stack.extend(o)
    return total


class _Counter:
    """Counts map applications: forward calls, and adjoint ones through an identity on z
    whose backward counts (one vector-Jacobian product of the map per call)."""

    def __init__(self):
        self.forward = self.adjoint = 0
        counter = self

        class _CountVJP(torch.autograd.Function):
            @staticmethod
            def forward(ctx, z):
                return z.view_as(z)

            @staticmethod
            def backward(ctx, g):
                counter.adjoint += 1
                return g

        self._vjp = _CountVJP

    def wrap(self, z: Tensor) -> Tensor:
        self.forward += 1
        return self._vjp.apply(z) if torch.is_grad_enabled() and z.requires_grad else z

    def hook(self, module, args):
        """A forward pre-hook for the authors' func(x, z, edge_index, ...)."""
        x, z, *rest = args
        if torch.is_grad_enabled() and z.requires_grad:
            z = self.wrap(z)
        else:
            self.forward += 1
        return (x, z, *rest)


class _Grab:
    """Keeps the gradient that reaches a tensor: ``wrap(t)`` is an identity whose backward
    stores (sums) the incoming gradient in ``grad``. On the equation's right-hand side X it
    is the adjoint solution u = (I + Delta^T/mu)^-1 G (the gradient of L in X through the
    right-hand side alone)."""

    def __init__(self):
        self.grad = None
        grab = self

        class _Identity(torch.autograd.Function):
            @staticmethod
            def forward(ctx, t):
                return t.view_as(t)

            @staticmethod
            def backward(ctx, g):
                grab.grad = g.detach().clone() if grab.grad is None else grab.grad + g
                return g

        self._fn = _Identity

    def wrap(self, t: Tensor) -> Tensor:
        return self._fn.apply(t) if torch.is_grad_enabled() and t.requires_grad else t


# ----------------------------------------------------------------------------- peers --

MODES = ("timed", "accurate", "tolerance")


def _mode(mode) -> str:
    """A peer's settings: "timed" (the equal-work pass), "accurate" (to the accuracy pass's
    tolerances) or "tolerance" (to relative residual TOLERANCE); True/False are "accurate" and
    "timed"."""
    mode = {True: "accurate", False: "timed"}.get(mode, mode)
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    return mode


class Peer:
    """One peer's module on one graph. ``step(x)`` returns Z (forward, graph built);
    ``thetas()`` the three weights (chi, phi, varphi); ``stats()`` its solver's report;
    ``caches()`` what it keeps between steps (the memory pass counts it); ``grab`` (a
    :class:`_Grab` or None) catches the adjoint solution where it is set."""

    name = ""
    solver = ""
    counter: Optional[_Counter] = None
    grab: Optional[_Grab] = None

    def thetas(self) -> List[Tensor]:
        raise NotImplementedError

    def stats(self) -> dict:
        return {}

    def caches(self) -> Dict[str, object]:
        return {}

    @contextlib.contextmanager
    def grabbing(self):
        """While the block runs, ``self.grab`` catches the adjoint solution u."""
        self.grab = _Grab()
        try:
            yield self.grab
        finally:
            self.grab = None


class DignnPeer(Peer):
    def __init__(self, backend, base, ctx, mode, solver="fixed_point"):
        from dignn_kernels import FusedImplicitDiffusion
        mode = _mode(mode)
        self.name, self.solver = f"dignn-{backend}", solver
        flow = "flow" in inspect.signature(FusedImplicitDiffusion).parameters and ctx.get(
            "dignn_flow", True)
        kw = {"accurate": dict(max_iter=ACCURACY["dignn_max_iter"], tol=ACCURACY["dignn_tol"]),
              "timed": dict(max_iter=K_TIMED, tol=0.0),
              "tolerance": dict(max_iter=TOLERANCE_MAX_ITER, tol=TOLERANCE)}[mode]
        if flow:
            kw["flow"] = "target_to_source"
        self.layer = FusedImplicitDiffusion(CHANNELS, mu=MU, eps=EPS, backend=backend,
                                            solver=solver, **kw)
        self.layer.load_state_dict(base.state_dict())
        self.layer.to(ctx["device"])
        self.edge_index = ctx["edge_index"] if flow else ctx["edge_index_pyg"]
        self.num_nodes = ctx["num_nodes"]
        self.settings = dict(kw, backend=backend, solver=solver, graph=(
            "edge_index, flow='target_to_source'" if flow else "edge_index.flip(0) (PyG flow)"),
            preprocessing="CSR build cached by the layer (built in the warm-up step)")
        if mode == "tolerance":
            self.settings["stop"] = (
                "||Z_t - Z_(t-1)|| <= tol ||Z_t|| (its fixed point's test)"
                if solver == "fixed_point" else "||X - Z - Delta Z/mu|| <= tol ||X||") + \
                ", the adjoint's relative to the incoming gradient"

    def step(self, x):
        if self.grab is None:
            return self.layer(x, self.edge_index)
        from dignn_kernels import solvers
        solve, grab = solvers.implicit_diffusion, self.grab

        def grabbing(rowptr, col, value, x, *args, **kwargs):  # u is dL/dx of the solve
            return solve(rowptr, col, value, grab.wrap(x), *args, **kwargs)
        solvers.implicit_diffusion = grabbing
        try:
            return self.layer(x, self.edge_index)
        finally:
            solvers.implicit_diffusion = solve

    def thetas(self):
        return [self.layer.theta_chi.weight, self.layer.theta_phi.weight,
                self.layer.theta_varphi.weight]

    def caches(self):
        """The layer's cached CSRGraph (rowptr, col, value, degree, the transposed CSR, the
        per-dtype values, rows, the diagonal index, a reordering's permutations) and its
        entry in the graph cache (the key with the graph's fingerprints)."""
        from dignn_kernels import graph as graph_module
        lay = self.layer
        g = graph_module.cached_graph(self.edge_index, self.num_nodes, None, lay.reorder,
                                      lay.flow)
        out = {"CSRGraph (rowptr, col, value, degree, transposed CSR, rows, diagonal "
               "index, per-dtype values)": g}
        keys = [k for k, v in getattr(graph_module, "_CACHE", {}).items() if v is g]
        seen = [k for k, v in getattr(graph_module, "_SEEN", {}).items()
                if getattr(v, "graph", None) is g]
        out["graph cache entries (fingerprint keys)"] = _python_bytes(keys + seen)
        return out

    def stats(self):
        lay = self.layer
        it, bit = lay.iterations, lay.backward_iterations
        done = lambda i, rel: i is not None and (i < lay.max_iter or (  # noqa: E731
            rel is not None and rel <= lay.tol))
        return {"applications_forward": it, "applications_adjoint": bit,
                "converged": bool(done(it, lay.relative_residual) and
                                  done(bit, lay.backward_relative_residual)),
                "residual": lay.relative_residual,
                "backward_residual": lay.backward_relative_residual,
                "solver_used": getattr(lay, "solver_used", None)}


class AuthorsPeer(Peer):
    name = "authors"
    solver = "fixed_point"

    def __init__(self, authors, base, ctx, mode):
        mode = _mode(mode)
        self.threshold = {"accurate": ACCURACY["abs_threshold_per_norm_x"] * ctx["x_norm"],
                          "timed": 0.0,
                          "tolerance": TOLERANCE * min(ctx["x_norm"], ctx["g_norm"])}[mode]
        self.max_iter = {"accurate": ACCURACY["authors_max_iter"],
                         "timed": AUTHORS_TIMED_MAX_ITER,
                         "tolerance": TOLERANCE_MAX_ITER}[mode]
        self.func = authors.ImplicitFunc_Neural(CHANNELS, CHANNELS, MU, epsilon=EPS)
        with torch.no_grad():
            for ours, theirs in (("theta_chi", "Theta_chi"), ("theta_phi", "Theta_phi"),
                                 ("theta_varphi", "Theta_varphi")):
                getattr(self.func, theirs).weight.copy_(getattr(base, ours).weight)
        solve = authors.fwd_solver
        peer = self

        def backward_solver(f, z_init, threshold, max_iter):  # theirs; u kept when grabbing
            u, res = solve(f, z_init, threshold, max_iter)
            if peer.grab is not None:
                peer.grab.grad = u.detach().clone()
            return u, res
        self.deq = authors.DEQFixedPoint(self.func, solve, backward_solver, self.max_iter,
                                         self.threshold)
        self.deq.to(ctx["device"]).train()
        self.edge_index = ctx["edge_index"]
        self.settings = {"max_iter": self.max_iter, "threshold": self.threshold,
                         "mode": "abs (their default)", "graph": "edge_index (their convention)",
                         "preprocessing": "none: their layer recomputes everything per call"}
        if mode == "tolerance":
            self.settings["stop"] = (
                f"their absolute test ||Z_t - Z_(t-1)|| < threshold, forward and adjoint "
                f"alike, with threshold = {TOLERANCE:g} x min(||X||, ||G||)")

    def step(self, x):
        return self.deq(x, self.edge_index)

    def thetas(self):
        return [self.func.Theta_chi.weight, self.func.Theta_phi.weight,
                self.func.Theta_varphi.weight]

    def count(self):
        self.counter = _Counter()
        return self.func.register_forward_pre_hook(self.counter.hook)

    def stats(self):
        fw, bw = getattr(self.deq, "fw_res", None), getattr(self.deq, "backward_res", None)
        ok = lambda r: r is not None and r < self.threshold  # noqa: E731  (their test)
        return {"converged": bool(ok(fw) and ok(bw)), "residual": fw, "backward_residual": bw}


class _MapPeer(Peer):
    """A peer written over :class:`NeuralLaplacianMap` (``self.map``): torchdeq's and the
    plain PyG composition."""

    map: NeuralLaplacianMap

    def thetas(self):
        return [self.map.theta_chi.weight, self.map.theta_phi.weight,
                self.map.theta_varphi.weight]

    def count(self):
        self.counter = _Counter()
        return None

    def caches(self):
        return self.map.caches()

    def _rhs(self, x):
        """X as the map's right-hand side (through the grab, where one is set)."""
        return self.grab.wrap(x) if self.grab is not None else x


def _product_of(ctx) -> str:
    return ctx.get("product") or PRODUCT_DEFAULT


class TorchdeqPeer(_MapPeer):
    def __init__(self, solver, base, ctx, mode):
        import torchdeq
        mode = _mode(mode)
        self.name, self.solver = f"torchdeq-{solver}", solver
        self.map = NeuralLaplacianMap(CHANNELS, product=_product_of(ctx))
        self.map.load_state_dict(base.state_dict())
        self.map.to(ctx["device"]).prepare(ctx["edge_index_pyg"], ctx["num_nodes"])
        it = {"accurate": ACCURACY["torchdeq_max_iter"], "timed": K_TIMED,
              "tolerance": TOLERANCE_MAX_ITER}[mode]
        f_tol = {"accurate": ACCURACY["abs_threshold_per_norm_x"] * ctx["x_norm"],
                 "timed": 0.0, "tolerance": TOLERANCE * ctx["x_norm"]}[mode]
        b_tol = {"accurate": f_tol, "timed": 0.0, "tolerance": TOLERANCE * ctx["g_norm"]}[mode]
        solver_name = {"fixed_point": "fixed_point_iter", "anderson": "anderson"}[solver]
        self.kw = dict(f_solver=solver_name, b_solver=solver_name, f_max_iter=it, b_max_iter=it,
                       f_tol=f_tol, b_tol=b_tol, ift=True)
        self.deq = torchdeq.get_deq(**self.kw)
        self.deq.train()
        self.settings = dict(self.kw, stop_mode="abs (torchdeq's default)",
                             state="z as [1, n, d]: one graph is one batch element",
                             preprocessing="edges coalesced and sorted (once per graph)",
                             product=f"{self.map.product}: {PRODUCTS[self.map.product]}")
        if mode == "tolerance":
            self.settings["stop"] = (f"its absolute test ||f(Z) - Z|| < f_tol = {TOLERANCE:g} "
                                     f"||X|| (adjoint: b_tol = {TOLERANCE:g} ||G||)")
        self.info, self.binfo = None, None

    def step(self, x):
        delta = self.map.weights(x)
        c = self.counter
        rhs = self._rhs(x)

        def f(z):
            z2 = z.view(x.shape)
            if c is not None:
                z2 = c.wrap(z2)
            return self.map.apply(rhs, z2, delta).view(z.shape)

        def writer(info):
            self.binfo = info
        z_out, self.info = self.deq(f, torch.zeros_like(x).unsqueeze(0),
                                    backward_writer=writer)
        return z_out[-1].view(x.shape)

    def stats(self):
        def low(info):
            return None if info is None else float(info["abs_lowest"].max())
        fw, bw = low(self.info), low(self.binfo)
        return {"converged": bool(fw is not None and bw is not None and fw < self.kw["f_tol"]
                                  and bw < self.kw["b_tol"]),
                "residual": fw, "backward_residual": bw,
                "solver_steps_forward": None if self.info is None else int(
                    self.info["nstep"].max())}


class PygPlainPeer(_MapPeer):
    name = "pyg-plain"
    solver = "unrolled"

    def __init__(self, base, ctx, mode):
        mode = _mode(mode)
        self.map = NeuralLaplacianMap(CHANNELS, product=_product_of(ctx))
        self.map.load_state_dict(base.state_dict())
        self.map.to(ctx["device"]).prepare(ctx["edge_index_pyg"], ctx["num_nodes"])
        self.k = {"accurate": ACCURACY["pyg_plain_k"], "timed": K_TIMED,
                  "tolerance": None}[mode]  # tolerance: set by calibrate()
        self.threshold = ACCURACY["abs_threshold_per_norm_x"] * ctx["x_norm"]
        self.settings = {"K": self.k, "start": "z = 0", "gradient": "autograd through all K",
                         "preprocessing": "edges coalesced and sorted (once per graph)",
                         "product": f"{self.map.product}: {PRODUCTS[self.map.product]}"}
        self.last_change = None

    def calibrate(self, x: Tensor, tol: float = TOLERANCE,
                  max_k: int = TOLERANCE_MAX_ITER) -> int:
        """K for the tolerance pass: the fewest applications from z = 0 after which the
        equation's residual ||f(Z) - Z|| is at most ``tol`` ||X|| (the change the next
        application would make), found without autograd; a user of the plain composition
        picks K, this is the smallest that reaches the tolerance."""
        with torch.no_grad():
            delta = self.map.weights(x)
            z, bound = torch.zeros_like(x), tol * float(x.norm())
            for k in range(max_k + 1):
                z_next = self.map.apply(x, z, delta)
                if float((z_next - z).norm()) <= bound:
                    break
                z = z_next
        self.k = k
        self.settings.update(K=k, stop=f"K fixed beforehand: the fewest applications after "
                                      f"which ||f(Z) - Z|| <= {tol:g} ||X||, raised while the "
                                      f"unrolled adjoint's residual is above {tol:g}")
        return k

    def step(self, x):
        delta = self.map.weights(x)
        rhs = self._rhs(x)
        z = prev = torch.zeros_like(x)
        for _ in range(self.k):
            prev, z = z, self.map.apply(rhs, self.counter.wrap(z) if self.counter else z,
                                        delta)
        self.last_change = float((z - prev).detach().norm())
        return z

    def stats(self):
        return {"converged": bool(self.last_change is not None and
                                  self.last_change < self.threshold),
                "residual": self.last_change}


def _torchdeq_absent() -> Optional[str]:
    try:
        import torchdeq  # noqa: F401
    except Exception as err:  # ImportError, or anything its import raises
        return f"absent: torchdeq not importable ({type(err).__name__}: {err})"
    return None


def peer_names(device: str) -> List[str]:
    """The peers this harness knows on ``device``, in JSON order."""
    from dignn_kernels import available_backends
    backends = [b for b in available_backends(device)
                if not (b == "triton" and torch.device(device).type != "cuda")]
    return [f"dignn-{b}" for b in backends] + [
        "authors", "torchdeq-fixed_point", "torchdeq-anderson", "pyg-plain"]


PEERS = ("dignn-cpu", "dignn-cuda", "dignn-triton", "dignn-torch", "authors",
         "torchdeq-fixed_point", "torchdeq-anderson", "pyg-plain")


def make_peer(name: str, base, ctx, mode, authors_path=None, solver=None) -> Peer:
    """Builds peer ``name`` with ``base``'s weights in ``mode`` (see :func:`_mode`; this
    layer with ``solver``, default its fixed point); raises RuntimeError("absent: ...")
    where it cannot run here."""
    mode = _mode(mode)
    if name.startswith("dignn-"):
        return DignnPeer(name[len("dignn-"):], base, ctx, mode, solver or "fixed_point")
    if name == "authors":
        if not authors_path:
            raise RuntimeError("absent: no checkout of the authors' code given "
                               "(--authors PATH or $DIGNN_AUTHORS)")
        try:
            authors = load_authors(authors_path)
        except FileNotFoundError as err:
            raise RuntimeError(f"absent: {err}") from None
        return AuthorsPeer(authors, base, ctx, mode)
    if name.startswith("torchdeq-"):
        why = _torchdeq_absent()
        if why:
            raise RuntimeError(why)
        return TorchdeqPeer(name[len("torchdeq-"):], base, ctx, mode)
    if name == "pyg-plain":
        return PygPlainPeer(base, ctx, mode)
    raise ValueError(f"unknown peer {name!r}; choose from {PEERS}")


# ---------------------------------------------------------------------------- oracle --

def _rel(a: Tensor, b: Tensor) -> float:
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def delta64(x: Tensor, edge_index_pyg: Tensor, thetas: List[Tensor],
            chunk: int = 1 << 18) -> types.SimpleNamespace:
    """Delta of the neural Laplacian in float64 on the CPU from :mod:`dignn_kernels.reference`
    (its edge weights, edges in chunks), as the products ``delta(z)`` and ``delta_t(u)``
    (Delta^T u), with the edges (i, j), weights w, degrees and 1/chi. The same Delta for every
    peer: the oracle's, and the tolerance pass's residuals."""
    from dignn_kernels import reference
    x64 = x.detach().double().cpu()
    th = [t.detach().double().cpu() for t in thetas]
    ei = edge_index_pyg.cpu()
    n, m = x64.size(0), ei.size(1)
    kw = dict(theta_chi=th[0], theta_phi=th[1], theta_varphi=th[2], eps=EPS)
    with torch.no_grad():
        parts = [reference.graph_neural_laplacian(x64, ei[:, s:s + chunk], None, **kw)
                 for s in range(0, m, chunk)]
        i = torch.cat([p[0] for p in parts])
        j = torch.cat([p[1] for p in parts])
        w = torch.cat([p[2] for p in parts])
        del parts
        deg = torch.zeros(n, dtype=torch.float64).index_add_(0, i, torch.ones_like(w))
        chi = deg * torch.tanh((x64 @ th[0].T).norm(dim=1))  # eq. 12, over the whole graph
        inv_chi = torch.where(chi > reference.CHI_FLOOR, 1.0 / chi.clamp_min(reference.CHI_FLOOR),
                              torch.zeros_like(chi))
        adj = torch.sparse_coo_tensor(torch.stack([i, j]), w, (n, n)).coalesce().to_sparse_csr()
        adj_t = torch.sparse_coo_tensor(torch.stack([j, i]), w, (n, n)).coalesce().to_sparse_csr()
        s = torch.zeros(n, dtype=torch.float64).index_add_(0, i, w)

    def delta(z):
        return inv_chi[:, None] * (s[:, None] * z - adj @ z)

    def delta_t(u):
        v = inv_chi[:, None] * u
        return s[:, None] * v - adj_t @ v
    return types.SimpleNamespace(i=i, j=j, w=w, deg=deg, inv_chi=inv_chi, delta=delta,
                                 delta_t=delta_t)


def relative_residuals(ops, x: Tensor, z: Tensor, g: Optional[Tensor] = None,
                       u: Optional[Tensor] = None) -> tuple:
    """(||X - Z - Delta Z/mu|| / ||X||, ||G - u - Delta^T u/mu|| / ||G|| or None) in float64
    with ``ops`` from :func:`delta64`: the residual of the equation and of its adjoint,
    measured the same way for every peer."""
    with torch.no_grad():
        x64, z64 = x.detach().double().cpu(), z.detach().double().cpu()
        fwd = float((x64 - z64 - ops.delta(z64) / MU).norm() / x64.norm())
        adj = None
        if g is not None and u is not None:
            g64, u64 = g.detach().double().cpu(), u.detach().double().cpu()
            adj = float((g64 - u64 - ops.delta_t(u64) / MU).norm() / g64.norm())
    return fwd, adj


def oracle(x: Tensor, edge_index_pyg: Tensor, thetas: List[Tensor], g: Tensor,
           dense: Optional[bool] = None, tol: float = 1e-12, max_iter: int = 20000,
           chunk: int = 1 << 18) -> dict:
    """Z and the gradients of L = sum(Z * G) in float64 (on the CPU), from
    :mod:`dignn_kernels.reference`: the dense solve (autograd in float64) for small graphs,
    else the float64 iteration on Delta's weights (reference.graph_neural_laplacian, edges in
    chunks) to ``tol`` forward and adjoint, with the parameter gradients by one chunked
    backward of <u, -(1/mu) Delta Z> (u the adjoint). Returns Z, the grads, its name and
    its relative residual ||Z + Delta Z/mu - X|| / ||X|| (the adjoint's too)."""
    from dignn_kernels import reference
    x64 = x.detach().double().cpu().requires_grad_()
    th = [t.detach().double().cpu().requires_grad_() for t in thetas]
    g64 = g.detach().double().cpu()
    ei = edge_index_pyg.cpu()
    n = x.size(0)
    kw = dict(theta_chi=th[0], theta_phi=th[1], theta_varphi=th[2], eps=EPS)
    if dense if dense is not None else n <= DENSE_ORACLE_MAX_NODES:
        z, delta = reference.dense_equilibrium(x64, ei, mu=MU, **kw)
        (z * g64).sum().backward()
        with torch.no_grad():
            res = float((z + delta @ z / MU - x64).norm() / x64.norm())
        return {"z": z.detach(), "grads": [x64.grad] + [t.grad for t in th],
                "oracle": "dense float64 solve (reference.dense_equilibrium)",
                "residual": res, "adjoint_residual": None}
    m = ei.size(1)
    with torch.no_grad():
        ops = delta64(x64, ei, th, chunk)
        i, j, inv_chi, deg = ops.i, ops.j, ops.inv_chi, ops.deg
        w, delta, delta_t = ops.w, ops.delta, ops.delta_t

        def solve(op, rhs):
            z = rhs.clone()
            for it in range(max_iter):
                z_next = rhs - op(z) / MU
                change = float((z_next - z).norm())
                z = z_next
                if change <= tol * float(z.norm()):
                    break
            return z, float((z + op(z) / MU - rhs).norm() / rhs.norm())

        z, res = solve(delta, x64.detach())
        u, ures = solve(delta_t, g64)
        # dL/dp = -(1/mu) <u, (dDelta/dp) Z> (adjoint of Z + Delta Z/mu = X); per edge
        # (Delta Z)_i = (1/chi_i) sum_j w_ij (z_i - z_j), so with c_e = <u_i, z_i - z_j>:
        c = torch.cat([(u[i[a:a + chunk]] * (z[i[a:a + chunk]] - z[j[a:a + chunk]])).sum(1)
                       for a in range(0, m, chunk)])
        g_w = -(c * inv_chi[i]) / MU
        g_chi = torch.zeros(n, dtype=torch.float64).index_add_(0, i, w * c) * inv_chi ** 2 / MU
    for a in range(0, m, chunk):
        _, _, wc, _ = reference.graph_neural_laplacian(x64, ei[:, a:a + chunk], None, **kw)
        torch.autograd.backward(wc, g_w[a:a + chunk])
    chi_g = deg * torch.tanh((x64 @ th[0].T).norm(dim=1))
    torch.autograd.backward(chi_g, g_chi)
    with torch.no_grad():
        x64.grad += u
    return {"z": z, "grads": [x64.grad] + [t.grad for t in th],
            "oracle": f"float64 iteration (reference.graph_neural_laplacian weights), tol {tol}",
            "residual": res, "adjoint_residual": ures}


# ----------------------------------------------------------------------- measurements --

def _sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _clear(peer: Peer, x: Tensor) -> None:
    for t in peer.thetas():
        t.grad = None
    x.grad = None


def _train_step(peer: Peer, x: Tensor, g: Tensor):
    _clear(peer, x)
    z = peer.step(x)
    (z * g).sum().backward()
    return z


@contextlib.contextmanager
def _counting(peer: Peer):
    handle = peer.count() if hasattr(peer, "count") else None
    try:
        yield
    finally:
        if handle is not None:
            handle.remove()
        peer.counter = None


def accuracy(peer: Peer, x: Tensor, g: Tensor, ref: dict) -> dict:
    """One forward+backward at the peer's tight settings against the oracle ``ref``."""
    xl = x.detach().clone().requires_grad_()
    with _counting(peer):
        z = _train_step(peer, xl, g)
        counts = (peer.counter.forward, peer.counter.adjoint) if peer.counter else None
    out = {k: _rel(a, b) for k, a, b in zip(
        ERROR_KEYS, [z, xl.grad] + [t.grad for t in peer.thetas()], [ref["z"]] + ref["grads"])}
    st = peer.stats()
    out["applications"] = {"forward": counts[0] if counts else st.get("applications_forward"),
                           "adjoint": counts[1] if counts else st.get("applications_adjoint")}
    out["converged"] = st.get("converged")
    out["solver_report"] = {k: v for k, v in st.items() if k != "converged"}
    out["settings"] = peer.settings
    return out


def applications(peer: Peer, x: Tensor, g: Tensor) -> dict:
    """Map applications of one timed-settings step, counted (not timed)."""
    xl = x.detach().clone().requires_grad_()
    with _counting(peer):
        _train_step(peer, xl, g)
        if peer.counter is not None:
            return {"forward": peer.counter.forward, "adjoint": peer.counter.adjoint}
    st = peer.stats()
    return {"forward": st.get("applications_forward"), "adjoint": st.get("applications_adjoint")}


def timed_step(peer: Peer, x: Tensor, g: Tensor, device) -> tuple:
    """(forward ms, backward ms) of one forward+backward of L = sum(Z * G)."""
    _clear(peer, x)
    _sync(device)
    t0 = time.perf_counter()
    z = peer.step(x)
    _sync(device)
    t1 = time.perf_counter()
    (z * g).sum().backward()
    _sync(device)
    t2 = time.perf_counter()
    return 1e3 * (t1 - t0), 1e3 * (t2 - t1)


def to_tolerance(peer: Peer, x: Tensor, g: Tensor, ops) -> dict:
    """One forward+backward at the tolerance pass's settings, instrumented (not timed): the
    map applications forward and adjoint (this layer: its sweeps), the equation's residual
    of Z and its adjoint's of u (the gradient that reaches the right-hand side X), both
    relative and measured in float64 with ``ops`` (:func:`delta64`) the same way for every
    peer, whether both reached TOLERANCE, and the peer's own report."""
    xl = x.detach().clone().requires_grad_()
    with _counting(peer), peer.grabbing() as grab:
        z = _train_step(peer, xl, g)
        counts = (peer.counter.forward, peer.counter.adjoint) if peer.counter else None
    st = peer.stats()
    fwd, adj = relative_residuals(ops, x, z, g, grab.grad)
    out = {"solver": peer.solver,
           "iterations_forward": counts[0] if counts else st.get("applications_forward"),
           "iterations_adjoint": counts[1] if counts else st.get("applications_adjoint"),
           "iterations_are": "map applications (counted)" if counts else
                             "the solver's sweeps of the CSR (the layer's count)",
           "residual_forward": fwd, "residual_adjoint": adj,
           "reached": bool(fwd <= TOLERANCE and adj is not None and adj <= TOLERANCE),
           "peer_report": {k: v for k, v in st.items() if k != "converged"},
           "settings": peer.settings}
    if not out["reached"]:
        what = [f"{side} {v:.1e}" for side, v in (("forward", fwd), ("adjoint", adj))
                if v is None or v > TOLERANCE]
        out["note"] = (f"did not reach {TOLERANCE:g}: reached " + ", ".join(
            w if w is not None else "adjoint not measured" for w in what))
    return out


def cached_bytes(peer: Peer) -> dict:
    """What ``peer`` keeps between steps, in bytes by name (:meth:`Peer.caches`; an int
    entry is already bytes), every storage counted once."""
    groups = peer.caches()
    out = tensor_bytes({k: v for k, v in groups.items() if not isinstance(v, int)})
    out.update({k: int(v) for k, v in groups.items() if isinstance(v, int)})
    return {k: out[k] for k in groups}


def cpu_peak_bytes(fn: Callable[[], object]) -> int:
    """Peak bytes the CPU allocator held above its level before ``fn()``: the allocation
    and free events of torch.profiler (profile_memory=True) replayed in time order."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn()
        del out
    events = [(e.start_ns(), k, e.nbytes()) for k, e in enumerate(
        prof.profiler.kineto_results.events())
        if e.name() == "[memory]" and str(e.device_type()).endswith("CPU")]
    level = peak = 0
    for _, _, nbytes in sorted(events):
        level += nbytes
        peak = max(peak, level)
    return peak


MEMORY_METHOD = {"cpu": "torch.profiler(profile_memory=True): allocation/free events replayed "
                        "in time order, peak above the level before the step",
                 "cuda": "torch.cuda.max_memory_allocated after reset_peak_memory_stats, minus "
                         "memory_allocated before the step"}


def peak_bytes(fn: Callable[[], object], device) -> int:
    """Peak bytes allocated during ``fn()`` above the level before it (see MEMORY_METHOD)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = fn()
        torch.cuda.synchronize()
        del out
        return torch.cuda.max_memory_allocated() - before
    return cpu_peak_bytes(fn)


# ---------------------------------------------------------------------------- graphs --

def load_graph(name: str):
    """(edge_index in the authors' convention, num_nodes, directed) of a harness graph (one
    of GRAPHS, or ``random-<nodes>-<edges>``, a seeded directed graph for tests)."""
    from dignn_kernels import synthetic
    if name in ("cora", "chameleon", "chameleon-directed"):
        os.environ.setdefault("DIGNN_DATA", str(DATA_DEFAULT))
        from dignn.data import load_dataset
        data = load_dataset(name)
        ei, n = data.edge_index, data.x.size(0)
    elif name == "cornell5":
        import numpy as np
        import scipy.io
        root = Path(os.environ.get("DIGNN_DATA", str(DATA_DEFAULT)))
        adj = scipy.io.loadmat(str(root / "cornell5" / "raw" / "data.mat"))["A"].tocoo()
        ei = torch.from_numpy(np.vstack([adj.row, adj.col]).astype(np.int64))
        n = adj.shape[0]
    elif name == "penn94_like":  # undirected by construction (both directions stored)
        return synthetic.penn94_like_graph(), synthetic.PENN94_NODES, False
    elif name == "products":
        return synthetic.block_model_graph(), synthetic.PRODUCTS_NODES, False
    elif name.startswith("random-"):  # random-<nodes>-<edges>: seeded, directed, for tests
        n, m = (int(v) for v in name.split("-")[1:3])
        ei = torch.randint(0, n, (2, m), generator=torch.Generator().manual_seed(SEED))
    else:
        raise ValueError(f"unknown graph {name!r}; choose from {GRAPHS}")
    if isinstance(ei, tuple):
        ei = ei[0]
    ei = ei.long()
    key = ei[0] * n + ei[1]
    rev = ei[1] * n + ei[0]
    directed = not torch.equal(torch.sort(key).values, torch.sort(rev).values)
    return ei, n, directed


def estimate_bytes(peer: str, n: int, m: int, mode, product: str = "coo") -> int:
    """A rough estimate of a peer's peak for one forward+backward (float32, h = d = 64), in
    rows of [n, 64] and edge-level [m, 64] tensors, scaled from the peaks measured on cornell5
    (one thread): the fused backend about 13 node rows above its cached CSR graph, the
    torch backend and the PyG-written peers about 5 edge rows (the gathered projections
    autograd keeps), the authors' layer about 20 edge rows (every application gathers and
    projects both ends of every edge; their backward keeps two such graphs). The PyG-written
    peers' product adds a dense n x n gradient (``csr_direct``) or an edge row per application
    (``edge_index``: gather/scatter)."""
    mode = _mode(mode)
    row_n, row_m = 4 * CHANNELS * n, 4 * CHANNELS * m
    if peer == "dignn-torch":
        return 6 * row_m + 16 * row_n
    if peer.startswith("dignn-"):
        return 16 * row_n + 24 * m
    if peer == "authors":
        return 21 * row_m
    k = {"accurate": ACCURACY["pyg_plain_k"], "timed": K_TIMED, "tolerance": 4 * K_TIMED}[mode]
    base = 6 * row_m + 40 * m + 12 * row_n
    if product == "csr_direct":
        base += 8 * n * n
    elif product == "edge_index":
        base += (k if peer == "pyg-plain" else 2) * row_m
    if peer == "pyg-plain":
        return base + 3 * k * row_n
    return base + (16 if peer.endswith("anderson") else 6) * row_n


def mem_available() -> int:
    """The host's MemAvailable, after handing the heap this process has freed back to the
    system (glibc keeps freed blocks; without this an earlier graph's peak counts as used)."""
    gc.collect()
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: MemAvailable as it is
        pass
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 62


# ------------------------------------------------------------------------- the harness --

_json_default = record.json_default
write_json = record.write_json
_machine = record.machine
_versions = record.versions
_git_head = record.git_head


def _is_directed(edge_index: Tensor, n: int) -> bool:
    key = edge_index[0] * n + edge_index[1]
    rev = edge_index[1] * n + edge_index[0]
    return not torch.equal(torch.sort(key).values, torch.sort(rev).values)


def _rounds_for(step_s: Dict, rounds: int, left: Callable[[], float],
                budget_s: Optional[float], time_limit_s: Optional[float]) -> int:
    """Timed rounds that the budget (a warm-up round included) and the slowest runner's
    time limit leave, at least one."""
    total = sum(step_s.values()) or 1e-9
    n_rounds = rounds if budget_s is None else max(1, min(rounds, int(left() // total) - 1))
    slowest = max(list(step_s.values()) or [0.0])
    if time_limit_s is not None and slowest * n_rounds > time_limit_s:
        n_rounds = max(1, int(time_limit_s // slowest))
    return n_rounds


def measure(graph: str, edge_index: Tensor, num_nodes: int, peers: List[str], *,
            device="cpu", passes=("accuracy", "time", "memory"), rounds: int = 5,
            authors_path=None, budget_s: Optional[float] = None, started: Optional[float] = None,
            mem_limit: Optional[int] = None, dense_oracle: Optional[bool] = None,
            time_limit_s: Optional[float] = None, dignn_flow: bool = True,
            product: str = "auto", product_candidates=PRODUCT_CANDIDATES,
            tolerance_time_limit_s: Optional[float] = None, directed: Optional[bool] = None,
            log=print) -> dict:
    """Measures ``peers`` on one graph (edge_index in the authors' convention): the product
    pass first (which sparse format the PyG-written peers' product takes: each of
    ``product_candidates`` timed in the plain composition's step, the fastest kept, unless
    ``product`` names one), then the timing pass, memory, accuracy and the time-to-tolerance
    pass (so that a short budget still times the peers). A pass the budget leaves no time for
    is recorded as {"status": "skipped: budget"}, and a peer that none of its passes ran for
    gets that status. Returns {"graph": {...}, "results": [one entry per peer]}; see the
    module docstring. ``dignn_flow=False`` gives this layer ``edge_index.flip(0)`` even where
    it has ``flow=``; ``time_limit_s`` (``tolerance_time_limit_s``) caps the timed rounds of
    the slowest peer of the timing (tolerance) pass: fewer rounds, at least one."""
    started = time.perf_counter() if started is None else started
    left = (lambda: math.inf) if budget_s is None else (  # noqa: E731
        lambda: budget_s - (time.perf_counter() - started))
    m = edge_index.size(1)
    gen = torch.Generator().manual_seed(SEED)
    x = torch.randn(num_nodes, CHANNELS, generator=gen).to(device)
    g = torch.randn(num_nodes, CHANNELS, generator=gen).to(device)
    torch.manual_seed(SEED)
    from dignn_kernels import FusedImplicitDiffusion
    base = FusedImplicitDiffusion(CHANNELS, mu=MU, eps=EPS)
    thetas = [base.theta_chi.weight, base.theta_phi.weight, base.theta_varphi.weight]
    ei = edge_index.to(device)
    if directed is None:
        directed = _is_directed(edge_index.cpu(), num_nodes)
    if product != "auto" and product not in PRODUCTS:
        raise ValueError(f"product must be 'auto' or one of {sorted(PRODUCTS)}, got {product!r}")
    ctx = {"device": device, "edge_index": ei, "edge_index_pyg": ei.flip(0),
           "num_nodes": num_nodes, "x_norm": float(x.norm()), "g_norm": float(g.norm()),
           "dignn_flow": dignn_flow,
           "product": product if product != "auto" else PRODUCT_DEFAULT}
    info = {"nodes": num_nodes, "edges": m, "oracle": "not computed", "oracle_residual": None}
    results = {p: {"graph": graph, "peer": p, "status": "ok"} for p in peers}
    limit = host_limit = int(0.8 * mem_available())  # the oracle runs on the host
    if torch.device(device).type == "cuda":  # the peers' tensors live on the GPU there
        limit = int(0.9 * torch.cuda.mem_get_info(torch.device(device))[0])
    if mem_limit is not None:
        limit, host_limit = min(limit, mem_limit), min(host_limit, mem_limit)
    budget_skips = {p: 0 for p in peers}
    peer_passes = [p for p in passes if p != "product"]

    def check_memory(name, mode, product_name):
        est = estimate_bytes(name, num_nodes, m, mode, product_name)
        if est > limit:
            raise RuntimeError(f"skipped: needs ~{est / 2**30:.1f} GB, "
                               f"{limit / 2**30:.1f} GB available")

    def build(name, mode, solver=None):
        check_memory(name, mode, ctx["product"])
        return make_peer(name, base, ctx, mode, authors_path, solver)

    def fail(name, err):
        msg = str(err)
        if not (msg.startswith("absent:") or msg.startswith("skipped:")):
            msg = f"failed: {type(err).__name__}: {msg}"
        results[name]["status"] = msg
        log(f"[{graph}] {name}: {msg}")

    def alive(name):
        return results[name]["status"] == "ok"

    def out_of_budget(name, pass_name, need_s=0.0):
        if left() - need_s > 0:
            return False
        results[name][pass_name] = {"status": "skipped: budget"}
        budget_skips[name] += 1
        return True

    if "product" in passes:
        info["product"] = product_pass(
            base, ctx, x, g, product_candidates, rounds=rounds, device=device, left=left,
            budget_s=budget_s, time_limit_s=time_limit_s, check_memory=check_memory,
            log=lambda s: log(f"[{graph}] {s}"))
        chosen = info["product"].get("fastest")
        if product != "auto":
            ctx["product"] = product
            info["product"]["used"] = product
            info["product"]["why"] = "given (--pyg-product)"
        elif chosen is not None:
            ctx["product"] = chosen
            info["product"]["used"] = chosen
            info["product"]["why"] = "the fastest median of the product pass"
    if "product" not in info:
        info["product"] = {"used": ctx["product"], "why": (
            "given (--pyg-product)" if product != "auto" else
            "the default: the product pass did not run"),
            "torch_sparse": _torch_sparse_state()}
    elif "used" not in info["product"]:
        info["product"].update(used=ctx["product"], why="the default: no candidate ran")
    info["product"]["used_means"] = PRODUCTS[ctx["product"]]

    step_s: Dict[str, float] = {}
    if "time" in passes:
        runners = {}
        for name in peers:
            if not alive(name) or out_of_budget(name, "time"):
                continue
            try:
                peer = build(name, "timed")
                t0 = time.perf_counter()
                results[name]["time"] = {"applications": applications(peer, x, g)}
                step_s[name] = time.perf_counter() - t0  # this first step builds the caches
                runners[name] = peer
            except Exception as err:  # recorded, the run goes on
                fail(name, err)
        # as many rounds (and a warm-up) as the budget leaves time for, slowest peers dropped
        while runners and 2 * sum(step_s[k] for k in runners) > left():
            slow = max(runners, key=step_s.get)
            del runners[slow]
            results[slow]["time"] = {"status": "skipped: budget"}
            budget_skips[slow] += 1
        total = sum(step_s[k] for k in runners) or 1e-9
        n_rounds = rounds if budget_s is None else max(1, min(rounds, int(left() // total) - 1))
        slowest = max([step_s[k] for k in runners] or [0.0])
        if time_limit_s is not None and slowest * n_rounds > time_limit_s:
            n_rounds = max(1, int(time_limit_s // slowest))
        times = {k: [] for k in runners}
        xl = x.detach().clone().requires_grad_()
        for r in range(n_rounds + 1):  # round 0 is the warm-up
            for name, peer in list(runners.items()):
                try:
                    _sync(device)
                    t0 = time.perf_counter()
                    _train_step(peer, xl, g)
                    _sync(device)
                    if r:
                        times[name].append(1e3 * (time.perf_counter() - t0))
                except Exception as err:
                    fail(name, err)
                    del runners[name]
        for name in runners:
            t = results[name]["time"]
            t.update(median_ms=statistics.median(times[name]),
                     rounds_ms=[round(v, 3) for v in times[name]],
                     rounds=n_rounds, settings=runners[name].settings)
            t["applications_forward"] = t["applications"]["forward"]
            t["applications_adjoint"] = t["applications"]["adjoint"]
            log(f"[{graph}] {name}: median {t['median_ms']:.1f} ms over {n_rounds} rounds")
        runners = peer = None
        gc.collect()

    if "memory" in passes:
        for name in peers:
            if not alive(name) or out_of_budget(name, "memory", 2 * step_s.get(name, 0.0)):
                continue
            try:
                peer = build(name, "timed")
                xl = x.detach().clone().requires_grad_()
                _train_step(peer, xl, g)  # warm-up: caches built, lazy imports done
                _sync(device)
                _clear(peer, xl)
                peak = peak_bytes(lambda: _train_step(peer, xl, g), device)
                cached = cached_bytes(peer)
                kept = sum(cached.values())
                results[name]["memory"] = {
                    "peak_bytes": int(peak) + kept, "step_peak_bytes": int(peak),
                    "cached_bytes": kept, "cached": cached,
                    "method": MEMORY_METHOD[torch.device(device).type] + "; plus the bytes of "
                              "every structure the peer keeps between steps (cached), each "
                              "storage once",
                    "settings": "the timing pass's (10 applications)"}
                log(f"[{graph}] {name}: peak {(peak + kept) / 2**20:.1f} MiB "
                    f"({kept / 2**20:.1f} MiB of it cached between steps)")
            except Exception as err:
                fail(name, err)
            finally:
                peer = None
                gc.collect()

    if "accuracy" in passes:
        ref = None
        need = 8 * num_nodes ** 2 * 6 if num_nodes <= DENSE_ORACLE_MAX_NODES else (
            8 * CHANNELS * (12 * num_nodes + 10 * min(m, 1 << 18)) + 64 * m)
        if need > host_limit:
            info["oracle"] = f"not computed: needs ~{need / 2**30:.1f} GB, " \
                             f"{host_limit / 2**30:.1f} GB available"
        elif left() <= 0:
            info["oracle"] = "not computed: budget"
        else:
            t0 = time.perf_counter()
            ref = oracle(x, ctx["edge_index_pyg"], thetas, g, dense=dense_oracle)
            info.update(oracle=ref["oracle"], oracle_residual=ref["residual"],
                        oracle_adjoint_residual=ref["adjoint_residual"],
                        oracle_seconds=round(time.perf_counter() - t0, 2))
            log(f"[{graph}] oracle: {ref['oracle']}, residual {ref['residual']:.2e}")
        for name in peers:
            if not alive(name):
                continue
            if ref is None:
                results[name]["accuracy"] = {"status": info["oracle"]}
                budget_skips[name] += info["oracle"].endswith("budget")
                continue
            if out_of_budget(name, "accuracy"):
                continue
            try:
                peer = build(name, "accurate")
                results[name]["accuracy"] = accuracy(peer, x, g, ref)
                acc = results[name]["accuracy"]
                log(f"[{graph}] {name}: worst error {max(acc[k] for k in ERROR_KEYS):.2e}, "
                    f"converged {acc['converged']}, applications {acc['applications']}")
            except Exception as err:
                fail(name, err)
            finally:
                peer = None
                gc.collect()
        ref = None
        gc.collect()
    if "tolerance" in passes:
        tolerance_pass(peers, results, build, ctx, x, g, thetas, directed=directed,
                       rounds=rounds, device=device, left=left, budget_s=budget_s,
                       time_limit_s=tolerance_time_limit_s, host_limit=host_limit,
                       alive=alive, budget_skips=budget_skips, info=info,
                       log=lambda s: log(f"[{graph}] {s}"))
    for name in peers:
        if alive(name) and peer_passes and budget_skips[name] >= len(peer_passes):
            results[name]["status"] = "skipped: budget"
    return {"graph": info, "results": [results[p] for p in peers]}


def product_pass(base, ctx, x, g, candidates, *, rounds, device, left, budget_s,
                 time_limit_s, check_memory, log) -> dict:
    """Times the plain PyG composition's step (K_TIMED applications under autograd, forward
    and backward) with each sparse format of ``candidates`` (:data:`PRODUCTS`), rounds
    interleaved, and its peak memory; returns the record's ``product`` entry with the
    fastest by median."""
    out = {"step": f"pyg-plain's timed step: {K_TIMED} applications of the map under "
                   f"autograd, forward+backward of L = sum(Z * G)",
           "torch_sparse": _torch_sparse_state(), "candidates": {}}
    runners, step_s = {}, {}
    for c in candidates:
        entry = out["candidates"][c] = {"means": PRODUCTS[c]}
        try:
            check_memory("pyg-plain", "timed", c)
            if left() <= 0:
                raise RuntimeError("skipped: budget")
            peer = PygPlainPeer(base, dict(ctx, product=c), "timed")
            xl = x.detach().clone().requires_grad_()
            t0 = time.perf_counter()
            _train_step(peer, xl, g)  # warm-up: lazy imports, EdgeIndex's CSR
            step_s[c] = time.perf_counter() - t0
            runners[c] = peer
        except Exception as err:
            msg = str(err)
            entry["status"] = msg if msg.startswith("skipped:") else \
                f"failed: {type(err).__name__}: {msg}"
            log(f"product {c}: {entry['status']}")
    n_rounds = _rounds_for(step_s, rounds, left, budget_s, time_limit_s)
    times = {c: [] for c in runners}
    xl = x.detach().clone().requires_grad_()
    for _ in range(n_rounds):
        for c, peer in runners.items():
            f_ms, b_ms = timed_step(peer, xl, g, device)
            times[c].append(f_ms + b_ms)
    for c, peer in runners.items():
        _clear(peer, xl)
        peak = peak_bytes(lambda: _train_step(peer, xl, g), device)
        out["candidates"][c].update(status="ok", median_ms=statistics.median(times[c]),
                                    rounds_ms=[round(v, 3) for v in times[c]],
                                    rounds=n_rounds, step_peak_bytes=int(peak))
        log(f"product {c}: median {statistics.median(times[c]):.1f} ms, "
            f"peak {peak / 2**20:.1f} MiB")
    ok = {c: e["median_ms"] for c, e in out["candidates"].items() if e.get("status") == "ok"}
    out["fastest"] = min(ok, key=ok.get) if ok else None
    return out


def tolerance_pass(peers, results, build, ctx, x, g, thetas, *, directed, rounds, device,
                   left, budget_s, time_limit_s, host_limit, alive, budget_skips, info,
                   log) -> None:
    """Each peer to relative residual TOLERANCE of the equation and of its adjoint (this
    layer with each of TOLERANCE_SOLVERS on its fused backends): one instrumented step
    (:func:`to_tolerance`: iterations, residuals measured alike for all), then forward and
    backward timed, rounds interleaved over every peer and solver, medians. Fills
    ``results[peer]["tolerance"] = {"runs": [...]}``."""
    need = 8 * (12 * x.numel() + 10 * ctx["edge_index"].size(1))
    if need > host_limit:
        for name in peers:
            if alive(name):
                results[name]["tolerance"] = {
                    "status": f"not run: the float64 residuals need ~{need / 2**30:.1f} GB"}
        return
    t0 = time.perf_counter()
    ops = delta64(x, ctx["edge_index_pyg"], thetas)
    info["tolerance"] = {"target": TOLERANCE, "max_iter": TOLERANCE_MAX_ITER,
                         "residuals": "||X - Z - Delta Z/mu|| / ||X|| and ||G - u - Delta^T "
                                      "u/mu|| / ||G|| in float64 (dignn_kernels.reference's "
                                      "Delta), u the gradient of L that reaches X through the "
                                      "equation's right-hand side",
                         "delta64_seconds": round(time.perf_counter() - t0, 2)}
    runners, step_s, entries = {}, {}, {}
    for name in peers:
        if not alive(name):
            continue
        if name == "dignn-torch":
            results[name]["tolerance"] = {"status": "not run: the tolerance pass times this "
                                                    "layer's fused backends"}
            continue
        results[name]["tolerance"] = {"runs": []}
        solvers = TOLERANCE_SOLVERS if name.startswith("dignn-") else (None,)
        for solver in solvers:
            if solver == "cg" and directed:
                results[name]["tolerance"]["runs"].append(
                    {"solver": "cg", "status": "not run: a directed graph (cg needs a "
                                               "symmetric W; the layer runs anderson there)"})
                continue
            if left() <= 0:
                results[name]["tolerance"]["runs"].append(
                    {"solver": solver, "status": "skipped: budget"})
                continue
            key = (name, solver)
            try:
                peer = build(name, "tolerance", solver)
                if isinstance(peer, PygPlainPeer):
                    peer.calibrate(x)
                xl = x.detach().clone().requires_grad_()
                t_start = time.perf_counter()
                _train_step(peer, xl, g)  # warm-up: the caches built
                step_s[key] = time.perf_counter() - t_start
                entry = to_tolerance(peer, x, g, ops)
                while isinstance(peer, PygPlainPeer) and not entry["reached"] and \
                        peer.k < TOLERANCE_MAX_ITER and math.isfinite(entry["residual_forward"]):
                    peer.k += 1  # the unrolled adjoint lags the forward: one more application
                    peer.settings["K"] = peer.k
                    entry = to_tolerance(peer, x, g, ops)
                entry["status"] = "ok"
                results[name]["tolerance"]["runs"].append(entry)
                entries[key], runners[key] = entry, peer
                adj = entry["residual_adjoint"]
                log(f"{name} {entry['solver']}: iterations {entry['iterations_forward']} + "
                    f"{entry['iterations_adjoint']}, residuals {entry['residual_forward']:.1e} "
                    f"/ {'-' if adj is None else format(adj, '.1e')}")
            except Exception as err:
                msg = str(err)
                if not msg.startswith(("skipped:", "absent:")):
                    msg = f"failed: {type(err).__name__}: {msg}"
                results[name]["tolerance"]["runs"].append({"solver": solver or "",
                                                           "status": msg})
                log(f"{name} {solver or ''}: {msg}")
    n_rounds = _rounds_for(step_s, rounds, left, budget_s, time_limit_s)
    fwd = {k: [] for k in runners}
    bwd = {k: [] for k in runners}
    xl = x.detach().clone().requires_grad_()
    for _ in range(n_rounds):
        for key, peer in list(runners.items()):
            try:
                f_ms, b_ms = timed_step(peer, xl, g, device)
                fwd[key].append(f_ms)
                bwd[key].append(b_ms)
            except Exception as err:
                entries[key]["status"] = f"failed: {type(err).__name__}: {err}"
                del runners[key]
    for key in runners:
        steps = [f + b for f, b in zip(fwd[key], bwd[key])]
        entries[key].update(forward_ms=statistics.median(fwd[key]),
                            backward_ms=statistics.median(bwd[key]),
                            median_ms=statistics.median(steps), rounds=n_rounds,
                            rounds_forward_ms=[round(v, 3) for v in fwd[key]],
                            rounds_backward_ms=[round(v, 3) for v in bwd[key]])
        log(f"{key[0]} {entries[key]['solver']}: to {TOLERANCE:g} in "
            f"{entries[key]['forward_ms']:.1f} + {entries[key]['backward_ms']:.1f} ms")
    runners = ops = None
    gc.collect()


def tolerance_runs(rs: List[dict]) -> List[dict]:
    """The tolerance pass's timed runs of one graph's results, each with its ``peer``."""
    return [dict(run, peer=r["peer"]) for r in rs if r.get("status") == "ok"
            for run in (r.get("tolerance") or {}).get("runs", [])
            if run.get("status") == "ok" and run.get("median_ms") is not None]


def tolerance_lines(graph: str, rs: List[dict]) -> List[str]:
    """The summary's lines of the tolerance pass on one graph: this layer's fastest solver to
    TOLERANCE, each peer's time against it, what did not reach it."""
    runs = tolerance_runs(rs)
    if not runs:
        return []
    ours = [r for r in runs if r["peer"].startswith("dignn-")]
    best = min(ours, key=lambda r: r["median_ms"]) if ours else None
    out = [f"{graph}: to relative residual {TOLERANCE:g} (forward and adjoint): " + (
        f"this layer's fastest {best['peer']} {best['solver']} {best['median_ms']:.1f} ms "
        f"({best['iterations_forward']} + {best['iterations_adjoint']} iterations)"
        if best else "this layer not timed")]
    for r in runs:
        if r is best:
            continue
        text = (f"  {r['peer']} {r['solver']}: {r['median_ms']:.1f} ms, "
                f"{r['iterations_forward']} + {r['iterations_adjoint']} iterations")
        if best is not None:
            text += f", {r['median_ms'] / best['median_ms']:.2f}x"
        if not r.get("reached"):
            text += f" ({r.get('note', 'did not reach it')})"
        out.append(text)
    return out


def summarize(doc: dict) -> List[str]:
    """The summary lines: per graph this layer's best backend against each peer, each peer's
    worst agreement; the issue's goals on cornell5."""
    lines = []
    by_graph: Dict[str, List[dict]] = {}
    for r in doc["results"]:
        by_graph.setdefault(r["graph"], []).append(r)

    def med(r):
        return r.get("time", {}).get("median_ms") if r["status"] == "ok" else None

    def peak(r):
        return r.get("memory", {}).get("peak_bytes") if r["status"] == "ok" else None

    def worst(r):
        acc = r.get("accuracy", {})
        return max(acc[k] for k in ERROR_KEYS) if all(k in acc for k in ERROR_KEYS) else None

    for graph, rs in by_graph.items():
        ours = [r for r in rs if r["peer"].startswith("dignn-") and med(r) is not None]
        best = min(ours, key=med) if ours else None
        lean = min([r for r in ours if peak(r)], key=peak, default=None)
        if best:
            lines.append(f"{graph}: this layer's fastest backend {best['peer']} "
                         f"{med(best):.2f} ms"
                         + (f", leanest {lean['peer']} {peak(lean) / 2**20:.1f} MiB" if lean
                            else ""))
        else:
            lines.append(f"{graph}: this layer not timed")
        for r in rs:
            w = worst(r)
            agree = f"worst agreement {w:.1e}" if w is not None else "agreement not computed"
            if r.get("accuracy", {}).get("converged") is False:
                agree += " (did not converge)"
            if r["status"] != "ok":
                lines.append(f"  {r['peer']}: {r['status']}")
                continue
            parts = [agree]
            if best is not None and med(r) is not None and r is not best:
                parts.append(f"time {med(r) / med(best):.2f}x {best['peer']}'s")
            if lean is not None and peak(r) is not None and r is not lean:
                parts.append(f"peak memory {peak(r) / max(peak(lean), 1):.2f}x {lean['peer']}'s")
            lines.append(f"  {r['peer']}: " + ", ".join(parts))
    for graph, rs in by_graph.items():
        lines += tolerance_lines(graph, rs)
    rs = {r["peer"]: r for r in by_graph.get("cornell5", [])}
    if rs:
        ours = [r for p, r in rs.items() if p.startswith("dignn-") and med(r) is not None]
        best = min(ours, key=med) if ours else None
        lean = min([r for r in ours if peak(r)], key=peak, default=None)

        def goal(text, peer, ratio, need):
            if peer is None or ratio is None:
                lines.append(f"goal cornell5 {text}: not measured ({peer or 'peer'} absent "
                             f"or not run)")
            else:
                lines.append(f"goal cornell5 {text}: {'met' if ratio >= need else 'MISSED'} "
                             f"({ratio:.2f}x, needs >= {need:g}x)")

        a = rs.get("authors")
        ok_a = a is not None and best is not None and med(a) is not None
        goal("forward+backward >= 20x faster than the authors' layer", a and a["peer"]
             if ok_a else (a["status"] if a else "authors"),
             med(a) / med(best) if ok_a else None, GOALS["vs_authors_time"])
        deqs = [r for p, r in rs.items() if p.startswith("torchdeq-") and med(r) is not None]
        fast = min(deqs, key=med) if deqs else None
        goal("forward+backward >= 4x faster than torchdeq's faster solver",
             fast["peer"] if fast and best else (
                 rs.get("torchdeq-anderson", {}).get("status") or "torchdeq"),
             med(fast) / med(best) if fast and best else None, GOALS["vs_torchdeq_time"])
        ok_m = a is not None and lean is not None and peak(a) is not None
        goal(">= 20x less peak memory than the authors' layer",
             "authors" if ok_m else (a["status"] if a else "authors"),
             peak(a) / peak(lean) if ok_m else None, GOALS["vs_authors_memory"])
        bad, checked = [], 0
        for p, r in rs.items():
            w = worst(r)
            if w is None or not r.get("accuracy", {}).get("converged"):
                continue
            checked += 1
            if w > GOALS["agreement"]:
                bad.append(f"{p} {w:.1e}")
        lines.append("goal cornell5 every converged peer within 1e-5 of the float64 oracle: "
                     + ("not measured" if not checked else
                        ("met" if not bad else "MISSED (" + ", ".join(bad) + ")"))
                     + f" ({checked} peers checked)")
    return lines


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--graphs", default=",".join(GRAPHS))
    ap.add_argument("--peers", default=None, help="comma-separated (default: all here)")
    ap.add_argument("--authors", default=os.environ.get("DIGNN_AUTHORS"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--passes", default=",".join(PASSES),
                    help=f"comma-separated, from {','.join(PASSES)} (default: all)")
    ap.add_argument("--pyg-product", default="auto", choices=("auto",) + tuple(PRODUCTS),
                    help="the sparse format of the PyG-written peers' product (auto: the "
                         "product pass's fastest)")
    ap.add_argument("--pyg-products", default=",".join(PRODUCT_CANDIDATES),
                    help="the formats the product pass times")
    ap.add_argument("--tolerance-time-limit-s", type=float, default=None,
                    help="fewer tolerance rounds where the slowest peer's would take longer")
    ap.add_argument("--budget-s", type=float, default=None)
    ap.add_argument("--mem-limit-gb", type=float, default=None,
                    help="skip a peer whose estimated peak exceeds this (always at most 0.8 "
                         "x MemAvailable at its start)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    passes = tuple(p for p in args.passes.split(",") if p)
    for p in passes:
        if p not in PASSES:
            ap.error(f"--passes: unknown pass {p!r}; choose from {','.join(PASSES)}")
    candidates = tuple(c for c in args.pyg_products.split(",") if c)
    for c in candidates:
        if c not in PRODUCTS:
            ap.error(f"--pyg-products: unknown format {c!r}; choose from {','.join(PRODUCTS)}")
    graphs = [gname for gname in args.graphs.split(",") if gname]
    for gname in graphs:
        if gname not in GRAPHS and not gname.startswith("random-"):
            ap.error(f"--graphs: unknown graph {gname!r}; choose from {','.join(GRAPHS)}")
    names = peer_names(args.device) if args.peers is None else args.peers.split(",")
    for p in names:
        if p not in PEERS:
            ap.error(f"--peers: unknown peer {p!r}; choose from {','.join(PEERS)}")
    started = time.perf_counter()
    authors_info = {"path": args.authors, "commit": None, "stand_ins": None,
                    "cuda_synchronize": None}
    if args.authors and "authors" in names:
        try:
            authors_info = load_authors(args.authors).info
        except FileNotFoundError as err:
            authors_info["error"] = str(err)
    doc = {"schema": SCHEMA, "command": [sys.executable] + sys.argv if argv is None else
           ["bench/peers/peers.py"] + list(argv), "commit": _git_head(),
           "date": record.now(),
           "machine": _machine(args.device, torch.get_num_threads()), "versions": _versions(),
           "authors": authors_info,
           "settings": {"mu": MU, "eps": EPS, "channels": CHANNELS, "seed": SEED,
                        "x": "seeded standard normal [n, 64] float32", "loss": "sum(Z * G), G "
                        "seeded standard normal", "rounds": args.rounds, "passes": list(passes),
                        "timed_applications": K_TIMED, "authors_timed_max_iter":
                        AUTHORS_TIMED_MAX_ITER, "accuracy": ACCURACY,
                        "budget_s": args.budget_s, "mem_limit_gb": args.mem_limit_gb,
                        "pyg_product": args.pyg_product, "pyg_products": list(candidates),
                        "tolerance": TOLERANCE, "tolerance_max_iter": TOLERANCE_MAX_ITER,
                        "tolerance_solvers": list(TOLERANCE_SOLVERS),
                        "tolerance_time_limit_s": args.tolerance_time_limit_s,
                        "products_time_limit_s": PRODUCTS_TIME_LIMIT_S,
                        "memory_method":
                        MEMORY_METHOD[torch.device(args.device).type],
                        "tolerance_step": "each peer to relative residual tolerance of the "
                                          "equation and of its adjoint by its own stopping "
                                          "rule, forward and backward timed apart, peers and "
                                          "solvers interleaved round by round, after a warm-up "
                                          "step and an instrumented (untimed) step",
                        "timed_step": "one forward+backward of L per round, graph preprocessing "
                                      "outside the timed region where the peer caches it, peers "
                                      "interleaved round by round, warm-up round not counted"},
           "graphs": {}, "results": [], "summary": []}
    mem_limit = int(args.mem_limit_gb * 2**30) if args.mem_limit_gb else None
    for gname in graphs:
        budget_left = None if args.budget_s is None else args.budget_s - (
            time.perf_counter() - started)
        if budget_left is not None and budget_left <= 0:
            doc["graphs"][gname] = {"oracle": "not computed: budget"}
            doc["results"] += [{"graph": gname, "peer": p, "status": "skipped: budget"}
                               for p in names]
            continue
        ei, n, directed = load_graph(gname)
        print(f"[{gname}] {n} nodes, {ei.size(1)} edges, directed {directed}", flush=True)
        out = measure(gname, ei, n, names, device=args.device, passes=passes,
                      rounds=args.rounds, authors_path=args.authors, budget_s=args.budget_s,
                      started=started, mem_limit=mem_limit,
                      time_limit_s=PRODUCTS_TIME_LIMIT_S if gname == "products" else None,
                      product=args.pyg_product, product_candidates=candidates,
                      tolerance_time_limit_s=args.tolerance_time_limit_s, directed=directed,
                      log=lambda s: print(s, flush=True))
        out["graph"]["directed"] = directed
        doc["graphs"][gname] = out["graph"]
        doc["results"] += out["results"]
        doc["summary"] = summarize(doc)
        write_json(doc, args.out)
        del ei
        gc.collect()
    doc["summary"] = summarize(doc)
    write_json(doc, args.out)
    print("\n".join(doc["summary"]))
    return doc


if __name__ == "__main__":
    main()
