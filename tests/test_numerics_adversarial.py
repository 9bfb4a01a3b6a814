"""Adversarial numerics of the solve (issue 32, part C: no wrong answer without an error).

Every case here holds a result of :func:`dignn_kernels.implicit_diffusion` (every solver, the
backends "cpu", "torch" and "triton" in the interpreter) to a dense float64 solve of the same
data, written here from the paper's formulas independently of the package: (I + Delta/mu) Z = X
(eq. 17) with Delta = C^-1 (K - W) (eq. 6), its rows zero where chi_i <= 1e-30 (guard rows keep
z_i = x_i), and for the neural Laplacian W_ij = a_ij tanh(1/(||q_i - q_j|| + eps))
tanh(|p_i . p_j|) (eq. 13-14), kappa its row sums. Gradients are the dense solve's autograd.
A call either agrees (tolerances per dtype below) or raises / warns.

Tolerances: float64 solves converge to tol=1e-13 and agree to 1e-10 relative (the dense
solve's own rounding is ~1e-15 times the condition number, which stays below ~1e3 for the
graphs and mu here); float32 solves converge to tol=1e-6 and agree to 1e-4 relative (the
data itself is float32, the passes round at 6e-8 per operation over a few hundred sweeps).
"""
import math
import warnings

import pytest
import torch

import dignn_kernels as dk
from dignn_kernels.solvers import DivergenceWarning, implicit_diffusion

SOLVERS = ["fixed_point", "cg", "anderson"]
BACKENDS = ["cpu", "torch", "triton"]
FIXED = ["rw", "unnormalized", "sym"]
EPS = 1e-6


# ----------------------------------------------------------------- the dense oracle --

def dense_weights(rowptr, col, edge_value, p=None, q=None, eps=EPS):
    """(rows, cols, W per entry) in float64, differentiable in p and q (eq. 13-14)."""
    n = rowptr.numel() - 1
    rows = torch.repeat_interleave(torch.arange(n), rowptr[1:] - rowptr[:-1])
    cols = col.long()
    if p is None:
        return rows, cols, edge_value.double()
    p, q = p.double(), q.double()
    pi = (p[rows] * p[cols]).sum(dim=1)
    rho = (q[rows] - q[cols]).norm(dim=1)
    return rows, cols, edge_value.double() * torch.tanh(1.0 / (rho + eps)) * torch.tanh(pi.abs())


def dense_solve(rowptr, col, edge_value, x, chi, p=None, q=None, kappa=None, *, mu,
                eps=EPS):
    """Z of (I + Delta/mu) Z = X in float64, differentiable in x, chi, p, q."""
    n = rowptr.numel() - 1
    rows, cols, w = dense_weights(rowptr, col, edge_value, p, q, eps)
    W = torch.zeros(n, n, dtype=torch.float64).index_put((rows, cols), w, accumulate=True)
    k = W.sum(dim=1) if kappa is None else kappa.double()
    chi = chi.double()
    guard = chi <= 1e-30
    safe = torch.where(guard, torch.ones_like(chi), chi)
    delta = torch.where(guard.unsqueeze(1), 0.0, (torch.diag(k) - W) / safe.unsqueeze(1))
    return torch.linalg.solve(torch.eye(n, dtype=torch.float64) + delta / mu, x.double())


def rel(a, b):
    """||a - b|| / ||b||, less the rounding of a float32 a into subnormals: an answer near
    1e-42 is only representable to float32's subnormal spacing 2^-149 (absolute)."""
    a, b = a.detach().double(), b.detach().double()
    s = float(b.abs().max()) if b.numel() and float(b.abs().max()) > 0 else 1.0  # (1e200^2)
    err = ((a - b).div(s).norm() * s - 2.0 ** -149 * math.sqrt(b.numel())).clamp_min(0.0)
    return float(err / s / b.div(s).norm().clamp_min(1e-300))


# ------------------------------------------------------------------------ graphs --

def random_graph(n, seed, *, symmetric=True, self_loops=False, duplicates=False,
                 zero_weights=False, isolated=0, weights=(0.5, 1.5)):
    """(rowptr, col, a) of a seeded random graph (CSR by target row)."""
    g = torch.Generator().manual_seed(seed)
    m = 2 * n
    e = torch.randint(0, n - isolated, (2, m), generator=g) if n > isolated else \
        torch.empty(2, 0, dtype=torch.long)
    e = e[:, e[0] != e[1]]
    lo, hi = weights
    a = lo + (hi - lo) * torch.rand(e.size(1), generator=g, dtype=torch.float64)
    if zero_weights and a.numel():
        a[::4] = 0.0
    if duplicates and e.size(1):
        e = torch.cat([e, e[:, :3]], dim=1)
        a = torch.cat([a, a[:3]])
    if symmetric:
        e = torch.cat([e, e.flip(0)], dim=1)
        a = torch.cat([a, a])
    if self_loops:
        loops = torch.arange(0, n, 3)
        e = torch.cat([e, loops.repeat(2, 1)], dim=1)
        a = torch.cat([a, torch.full((loops.numel(),), 0.7, dtype=torch.float64)])
    graph = dk.build_graph(e, n, a)
    return graph.rowptr, graph.col, graph.value, graph


def fixed_system(graph, laplacian, dtype):
    w, chi, kappa = graph.fixed_laplacian(laplacian, dtype)
    return w, chi.clone(), kappa


def solve(rowptr, col, value, x, chi, p=None, q=None, kappa=None, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("error", DivergenceWarning)
        return implicit_diffusion(rowptr, col, value, x, chi, p, q, kappa, **kw)[0]


# ------------------------------------------------- 1. cg on graphs with guard rows --

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("solver", SOLVERS)
def test_guard_row_with_edges_forward_and_gradients(solver, backend):
    """A row whose chi is 0 while it has edges keeps z_i = x_i, and the other rows still
    diffuse from it: every solver agrees with the dense solve, forward and backward (cg
    eliminates the guard row; before, it solved a different system, 1.7e-2 off)."""
    rowptr, col, a, graph = random_graph(9, seed=1)
    n, d = 9, 2
    x = torch.randn(n, d, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    g = torch.randn(n, d, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    opts = dict(mu=2.5, solver=solver, backend=backend, max_iter=400, tol=1e-13)
    for laplacian in FIXED + ["neural"]:
        if laplacian == "neural":
            gen = torch.Generator().manual_seed(4)
            p = torch.randn(n, 2, dtype=torch.float64, generator=gen)
            q = torch.randn(n, 2, dtype=torch.float64, generator=gen)
            value, chi, kappa = a, graph.degree.clone(), None
        else:
            value, chi, kappa = fixed_system(graph, laplacian, torch.float64)
            p = q = None
        chi[[2, 5]] = 0.0
        assert (rowptr[3] > rowptr[2]) and (rowptr[6] > rowptr[5])  # guard rows with edges
        leaves = [x.clone().requires_grad_(), chi.clone().requires_grad_()]
        if p is not None:
            leaves += [p.clone().requires_grad_(), q.clone().requires_grad_()]
        pq = leaves[2:] if p is not None else [None, None]
        mu = 25.0 if laplacian == "unnormalized" else 2.5
        z = solve(rowptr, col, value, leaves[0], leaves[1], *pq, kappa, **{**opts, "mu": mu})
        want = dense_solve(rowptr, col, value, *[t.detach() for t in leaves[:2]],
                           *[t.detach() if t is not None else None for t in pq], kappa, mu=mu)
        assert rel(z, want) < 1e-10, (laplacian, rel(z, want))
        assert torch.equal(z[[2, 5]].detach(), x[[2, 5]])
        got = torch.autograd.grad(z, leaves, g)
        dense_leaves = [t.detach().clone().requires_grad_() for t in leaves]
        dpq = dense_leaves[2:] if p is not None else [None, None]
        zd = dense_solve(rowptr, col, value, dense_leaves[0], dense_leaves[1], *dpq, kappa,
                         mu=mu)
        wanted = torch.autograd.grad(zd, dense_leaves, g)
        for name, a_, b_ in zip(["x", "chi", "p", "q"], got, wanted):
            assert rel(a_, b_) < 1e-9, (laplacian, name, rel(a_, b_))


def test_guard_row_gradcheck_cg():
    """gradcheck of the cg solve (forward and adjoint elimination) in x, p and q on a tiny
    neural graph with a guard row that has edges."""
    rowptr, col, a, graph = random_graph(6, seed=5)
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(6, 2, dtype=torch.float64, generator=gen, requires_grad=True)
    p = torch.randn(6, 2, dtype=torch.float64, generator=gen, requires_grad=True)
    q = torch.randn(6, 2, dtype=torch.float64, generator=gen, requires_grad=True)
    chi = graph.degree.clone()
    chi[1] = 0.0
    assert rowptr[2] > rowptr[1]

    def f(x, p, q):
        return solve(rowptr, col, a, x, chi, p, q, mu=1.5, solver="cg", max_iter=200,
                     tol=1e-14)
    assert torch.autograd.gradcheck(f, (x, p, q), eps=1e-6, atol=1e-7, rtol=1e-6)


# ------------------------------------------- 2. magnitudes: overflow and underflow --

def _data(n, d, magnitude, dtype, seed, mixed=False):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, dtype=torch.float64, generator=gen) * magnitude
    if mixed:  # every magnitude from 1e-30 to 1e30 (both signs) in one x
        x = x.sign() * 10.0 ** (60 * torch.rand(n, d, generator=gen, dtype=torch.float64) - 30)
    return x.to(dtype)


MAGNITUDES = [1e30, 1e-30, 1e-42]  # 1e-42: float32 subnormals


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("solver", SOLVERS)
def test_features_across_magnitudes(solver, backend):
    """float32 features near 1e30 (squares overflow), near 1e-30 (squares underflow) and
    subnormal, and a mixed x: the solve agrees with the dense float64 solve of the same float32
    data (before: 14 % off silently, cg zeros), forward and backward."""
    rowptr, col, a, graph = random_graph(8, seed=7, self_loops=True)
    opts = dict(mu=2.5, solver=solver, backend=backend, max_iter=300, tol=1e-6)
    value, chi, kappa = fixed_system(graph, "rw", torch.float32)
    for magnitude in MAGNITUDES + ["mixed"]:
        x = _data(8, 3, 1.0 if magnitude == "mixed" else magnitude, torch.float32, 8,
                  mixed=magnitude == "mixed")
        xr = x.clone().requires_grad_()
        z = solve(rowptr, col, value, xr, chi, kappa=kappa, **opts)
        want = dense_solve(rowptr, col, value, x, chi, kappa=kappa, mu=2.5)
        assert rel(z, want) < 1e-4, (magnitude, rel(z, want))
        # the backward with a gradient of the same magnitude as x
        g = _data(8, 3, 1.0 if magnitude == "mixed" else magnitude, torch.float32, 9)
        (gx,) = torch.autograd.grad(z, xr, g)
        xd = x.double().requires_grad_()
        (want_g,) = torch.autograd.grad(dense_solve(rowptr, col, value, xd, chi, kappa=kappa,
                                                    mu=2.5), xd, g.double())
        assert rel(gx, want_g) < 1e-4, (magnitude, rel(gx, want_g))


@pytest.mark.parametrize("laplacian", FIXED + ["neural"])
@pytest.mark.parametrize("solver", SOLVERS)
def test_layer_with_features_near_1e30(solver, laplacian):
    """The layer in float32 on x ~ 1e30 against the same layer in float64 (before: rw,
    unnormalized and sym 15-43 % off, silently)."""
    rowptr, col, a, graph = random_graph(10, seed=11)
    ei = torch.stack([torch.repeat_interleave(torch.arange(10), rowptr[1:] - rowptr[:-1]),
                      col.long()]).flip(0)
    x = _data(10, 3, 1e30, torch.float32, 12)
    mu = 30.0 if laplacian == "unnormalized" else 3.0
    torch.manual_seed(0)
    layer = dk.FusedImplicitDiffusion(3, mu=mu, laplacian=laplacian, solver=solver,
                                      max_iter=300, tol=1e-7)
    wide = dk.FusedImplicitDiffusion(3, mu=mu, laplacian=laplacian, solver=solver,
                                     max_iter=300, tol=1e-13).double()
    wide.load_state_dict({k: v.double() for k, v in layer.state_dict().items()})
    with warnings.catch_warnings():
        warnings.simplefilter("error", DivergenceWarning)
        if laplacian == "neural":  # p_i . p_j overflows float32: refused (see below)
            with pytest.raises(ValueError, match=r"p reaches \|p\| = .*float64"):
                layer(x, ei, a.float())
            return
        z = layer(x, ei, a.float())
        want = wide(x.double(), ei, a)
    assert rel(z.detach(), want.detach()) < 1e-5


@pytest.mark.parametrize("backend", ["cpu", "torch", "triton"])
def test_projection_dot_overflow_is_refused(backend):
    """p_i . p_j summed in float32 overflows once h max|p|^2 passes float32's range: with
    mixed signs the exact dot may be 0 (here p_0 . p_1 = 0, so W_01 = 0) while the float32
    sum is inf - inf = NaN, which the compiled CPU weights read as tanh = 1 and the torch and
    Triton ones as NaN. The ops and the solve refuse such p, naming it; float64 computes it."""
    rowptr, col = torch.tensor([0, 1, 2]), torch.tensor([1, 0])
    p = torch.tensor([[1e20, 1e20], [1e20, -1e20]])
    q = torch.zeros(2, 2)
    a = torch.ones(2)
    with pytest.raises(ValueError, match=r"p reaches \|p\| = 1e\+20"):
        dk.ops.neural_edge_weights(rowptr, col, a, p, q, backend=backend)
    with pytest.raises(ValueError, match=r"p reaches"):
        dk.ops.neural_weight_grad(rowptr, col, a, p, q, torch.ones(2, 1), torch.ones(2, 1),
                                  backend=backend)
    with pytest.raises(ValueError, match=r"p reaches"):
        implicit_diffusion(rowptr, col, a, torch.ones(2, 1), torch.ones(2), p, q, mu=3.0,
                           backend=backend)
    w, _ = dk.ops.neural_edge_weights(rowptr, col, a.double(), p.double(), q.double(),
                                      backend=backend)
    assert w.tolist() == [0.0, 0.0]


# ------------------------------------------------------------- 3. extreme mu --

MUS = [1e-300, 1e-40, 1e38, 1e300]


def _agrees_or_refuses(call, want, tol):
    """call() agrees with ``want`` to ``tol``, or raises a ValueError naming mu, or warns
    (DivergenceWarning): never a silently wrong result. Returns what happened."""
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        try:
            z = call()
        except ValueError as err:
            assert "mu=" in str(err) and "float" in str(err), str(err)
            return "refused"
    if any(issubclass(r.category, DivergenceWarning) for r in rec):
        return "warned"
    assert torch.isfinite(z).all() and rel(z, want) < tol, rel(z, want)
    return "agrees"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("backend", BACKENDS)
def test_extreme_mu(backend, dtype):
    """mu from 1e-300 to 1e300, float32 and float64: the one step of ops.diffusion_step and
    every solver agree with the float64 result, or refuse with a ValueError naming mu (1/mu
    or 1/(mu chi) not finite in the dtype), or warn; before, NaN/Inf or a RuntimeError
    naming nothing. A small chi (1e-12) makes 1/(mu chi) overflow float64 at mu = 1e-300."""
    rowptr, col, a, graph = random_graph(7, seed=13)
    value, chi, kappa = fixed_system(graph, "rw", dtype)
    chi[0] = 1e-12
    x = _data(7, 2, 1.0, dtype, 14)
    tol = 1e-4 if dtype == torch.float32 else 1e-9
    seen = []
    for mu in MUS:
        want = dense_solve(rowptr, col, value, x, chi, kappa=kappa, mu=mu)
        rows = torch.repeat_interleave(torch.arange(7), rowptr[1:] - rowptr[:-1])
        W = torch.zeros(7, 7, dtype=torch.float64).index_put((rows, col.long()),
                                                             value.double(), accumulate=True)
        # z = 0: the float64 step is x itself at every mu, while its coefficients
        # 1/(mu chi), kappa/(mu chi) overflow at mu = 1e-300 (0 * inf: NaN before)
        z = torch.zeros_like(x)
        step_want = x.double() - ((kappa.double().unsqueeze(1) * z.double() - W @ z.double())
                                  / chi.double().unsqueeze(1)) / mu
        if torch.isfinite(step_want).all():
            seen.append(_agrees_or_refuses(
                lambda: dk.ops.diffusion_step(rowptr, col, value, chi, kappa, x, z, mu,
                                              backend=None if backend == "cpu" else backend),
                step_want, tol))
        for solver in SOLVERS:
            seen.append(_agrees_or_refuses(
                lambda: implicit_diffusion(rowptr, col, value, x, chi, kappa=kappa, mu=mu,
                                           solver=solver, backend=backend, max_iter=300,
                                           tol=1e-7 if dtype == torch.float32 else 1e-13)[0],
                want, tol))
        if dtype == torch.float32 and mu < 1e-38:  # 1/mu is not a float32
            assert seen[-3:] == ["refused"] * 3
    assert "agrees" in seen


# ------------------------------------------ 4. non-finite inputs named, not mu --

@pytest.mark.parametrize("solver", SOLVERS)
def test_nonfinite_inputs_are_named(solver):
    """A NaN or Inf in x, chi, p, q or the edge values: the result agrees with the dense
    solve of the same data where that is finite (an infinite chi or p is a limit the formulas
    take exactly: the row stops diffusing, tanh(|p_i . p_j|) = 1), else the warning names
    that input, not mu (before: 'diverged at mu=2.625'; cg returned zeros for an Inf in x,
    silently)."""
    rowptr, col, a, graph = random_graph(8, seed=15)
    gen = torch.Generator().manual_seed(16)
    x = torch.randn(8, 2, dtype=torch.float64, generator=gen)
    p = torch.randn(8, 2, dtype=torch.float64, generator=gen)
    q = torch.randn(8, 2, dtype=torch.float64, generator=gen)
    chi = graph.degree.clone()
    for name in ["x", "chi", "p", "q", "edge_value"]:
        for bad in (math.nan, math.inf):
            args = dict(x=x.clone(), chi=chi.clone(), p=p.clone(), q=q.clone(),
                        edge_value=a.clone())
            args[name].view(-1)[3] = bad
            with warnings.catch_warnings(record=True) as rec:
                warnings.simplefilter("always")
                z = implicit_diffusion(rowptr, col, args["edge_value"], args["x"], args["chi"],
                                       args["p"], args["q"], mu=2.625, solver=solver,
                                       max_iter=200, tol=1e-12)[0]
            messages = [str(r.message) for r in rec if r.category is DivergenceWarning]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # (torch.linalg.solve of non-finite data)
                want = dense_solve(rowptr, col, args["edge_value"], args["x"], args["chi"],
                                   args["p"], args["q"], mu=2.625)
            if messages:
                assert len(messages) == 1 and f"{name} (1 of" in messages[0], messages
                assert "at mu=" not in messages[0]
            else:
                assert torch.isfinite(want).all() and rel(z, want) < 1e-9, (name, bad)


# ---------------------------------------------------- random adversarial graphs --

def _random_case(seed):
    """One seeded case: a graph of some kind, a Laplacian, a dtype, features of some
    magnitude, guard rows (with or without edges), a solver and a backend."""
    gen = torch.Generator().manual_seed(1000 + seed)
    pick = lambda options: options[int(torch.randint(len(options), (1,), generator=gen))]  # noqa
    n = pick([1, 2, 5, 9])
    kind = dict(symmetric=pick([True, True, False]), self_loops=pick([False, True]),
                duplicates=pick([False, True]), zero_weights=pick([False, True]),
                isolated=pick([0, 0, 1, 2]) if n > 2 else 0)
    empty = n > 1 and pick([False, False, False, True])
    rowptr, col, a, graph = random_graph(n, seed, **kind) if not empty else \
        random_graph(n, seed, isolated=n)
    laplacian = pick(FIXED + ["neural"])
    dtype = pick([torch.float32, torch.float64])
    magnitude = 10.0 ** pick([-30, -10, 0, 0, 10, 30] if dtype == torch.float32 else
                             [-200, 0, 0, 200])
    x = _data(n, 2, magnitude, dtype, seed, mixed=pick([False, False, True]))
    if laplacian == "neural":
        p = torch.randn(n, 2, generator=gen, dtype=torch.float64).to(dtype)
        q = torch.randn(n, 2, generator=gen, dtype=torch.float64).to(dtype)
        value, chi, kappa = a.to(dtype), graph.degree.to(dtype).clone(), None
    else:
        value, chi, kappa = fixed_system(graph, laplacian, dtype)
        p = q = None
    if n > 2 and pick([False, True]):
        chi[int(torch.randint(n, (1,), generator=gen))] = 0.0  # a guard row
    solver = pick(SOLVERS)
    backend = pick(["cpu", "cpu", "torch"])
    mu = {"unnormalized": 40.0}.get(laplacian, 3.0)
    return dict(rowptr=rowptr, col=col, value=value, x=x, chi=chi, p=p, q=q, kappa=kappa,
                solver=solver, backend=backend, mu=mu, dtype=dtype,
                transposed=None if graph.symmetric else graph.transposed())


RANDOM_CASES = 200


@pytest.mark.parametrize("seed", range(0, RANDOM_CASES, 10))
def test_random_adversarial_cases(seed):
    """Random valid graphs (directed and undirected, isolated nodes, self loops, duplicates,
    zero-weight edges, guard rows with and without edges, empty graphs, one node) with
    features from 1e-30 to 1e30 in float32 (1e-200 to 1e200 in float64), every Laplacian,
    solver and CPU backend: the result and dl/dx agree with the dense float64 solve, or the
    call warns or raises. Ten cases per test."""
    for case_seed in range(seed, seed + 10):
        c = _random_case(case_seed)
        tol = 1e-4 if c["dtype"] == torch.float32 else 1e-9
        t_rowptr, t_col, t_perm = c["transposed"] or (None, None, None)
        solver = c["solver"] if c["transposed"] is None or c["solver"] != "cg" else "anderson"
        xr = c["x"].clone().requires_grad_()
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            z = implicit_diffusion(c["rowptr"], c["col"], c["value"], xr, c["chi"], c["p"],
                                   c["q"], c["kappa"], mu=c["mu"], solver=solver,
                                   backend=c["backend"], max_iter=500,
                                   tol=1e-7 if c["dtype"] == torch.float32 else 1e-13,
                                   t_rowptr=t_rowptr, t_col=t_col, t_perm=t_perm)[0]
            g = torch.ones_like(z)
            (gx,) = torch.autograd.grad(z, xr, g)
        if any(issubclass(r.category, DivergenceWarning) for r in rec):
            continue  # said so
        want_x = c["x"].double().requires_grad_()
        want = dense_solve(c["rowptr"], c["col"], c["value"], want_x, c["chi"], c["p"], c["q"],
                           c["kappa"], mu=c["mu"])
        (want_g,) = torch.autograd.grad(want, want_x, g.double())
        assert rel(z, want) < tol, (case_seed, rel(z, want))
        assert rel(gx, want_g) < tol, (case_seed, rel(gx, want_g))


@pytest.mark.parametrize("solver", SOLVERS)
def test_huge_edge_values_agree_or_warn(solver):
    """float32 edge values (so chi = D for rw) near 1e20 and 1e30: the fixed point and
    Anderson (whose coefficients are ratios) agree; cg's SPD form (C + L/mu) Z = C X squares
    chi times x past float32, and says so, naming the fix, rather than returning a wrong z."""
    rowptr, col, a, graph = random_graph(8, seed=3)
    x = _data(8, 2, 1.0, torch.float32, 17)
    for scale in (1e20, 1e30):
        w, chi, kappa = graph.fixed_laplacian("rw", torch.float32)
        w, chi, kappa = w * scale, chi * scale, kappa * scale
        want = dense_solve(rowptr, col, w, x, chi, kappa=kappa, mu=3.0)
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            z = implicit_diffusion(rowptr, col, w, x, chi, kappa=kappa, mu=3.0, solver=solver,
                                   max_iter=300, tol=1e-6)[0]
        messages = [str(r.message) for r in rec if r.category is DivergenceWarning]
        if messages:
            assert solver == "cg" and "overflowed" in messages[0] and "float64" in messages[0]
        else:
            assert rel(z, want) < 1e-4
