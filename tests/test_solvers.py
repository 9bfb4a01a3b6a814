"""The equilibrium solvers: fixed point, Jacobi-preconditioned CG on the SPD form
(C + L/mu) Z = C X, Anderson acceleration, against the dense float64 solve, gradcheck and each
other; divergence of the fixed point below lambda_max; the on-device stopping logic."""
import dataclasses
import math
import warnings

import pytest
import torch

import dignn_kernels as dk
from dignn_kernels import ops, reference, solvers
from dignn_kernels.backends import get_backend, interface as iface
from dignn_kernels.solvers import loops
from backend_faces import face
from dignn_kernels.synthetic import uniform_graph
from conftest import (GRAPH_KINDS, LAPLACIANS, HostReads, gradcheck_layer, make_graph,
                      make_layer, rel_err, thetas)

EXACT = dict(max_iter=400, tol=1e-14)
SOLVERS = ["fixed_point", "cg", "anderson"]
CPU = get_backend("cpu")
torch_passes = face("torch")


@pytest.fixture
def unfused_cpu(monkeypatch):
    """backend="cpu" without its fused solve: the solvers' loops on the compiled passes."""
    monkeypatch.setitem(dk.backends._REGISTRY, "cpu",
                        dataclasses.replace(CPU, fused_solve=None))


def dense(layer, x, ei, w, mu=None):
    """(Z*, Delta) in float64."""
    return reference.dense_equilibrium(x, ei, w, laplacian=layer.laplacian,
                                       mu=layer.mu if mu is None else mu, eps=layer.eps,
                                       **thetas(layer))


def lambda_max(delta):
    return float(torch.linalg.eigvals(delta.detach()).real.max())


def equation_residual(x, z, delta, mu):
    """||X - Z - Delta Z / mu||_F / ||X||_F, computed densely in float64."""
    x, z = x.double(), z.detach().double()
    return float((x - z - delta @ z / mu).norm() / x.norm())


def run(layer, x, ei, w=None):
    """layer(x, ei, w), expecting the cg -> anderson fallback warning exactly when it
    applies (cg on a graph without symmetric edge values)."""
    graph = dk.build_graph(ei, x.size(0), w)
    if layer.solver == "cg" and not graph.symmetric:
        with pytest.warns(UserWarning, match="solver='anderson' runs instead"):
            return layer(x, ei, w)
    return layer(x, ei, w)


# ------------------------------------------------------------------- forward values --

@pytest.mark.parametrize("laplacian", LAPLACIANS)
@pytest.mark.parametrize("kind", GRAPH_KINDS)
@pytest.mark.parametrize("solver", SOLVERS)
def test_matches_dense_solve(solver, kind, laplacian):
    x, ei, w = make_graph(kind)
    layer = make_layer(x.size(1), laplacian, solver=solver, **EXACT)
    z = run(layer, x, ei, w)
    assert layer.iterations < EXACT["max_iter"], "the solve did not converge"
    want, delta = dense(layer, x, ei, w)
    assert rel_err(z, want) < 1e-12
    directed = not dk.build_graph(ei, x.size(0), w).symmetric
    assert layer.solver_used == ("anderson" if solver == "cg" and directed else solver)
    if solver != "fixed_point":  # the reported residual is the equation's
        assert layer.relative_residual <= EXACT["tol"]


@pytest.mark.parametrize("laplacian", LAPLACIANS)
@pytest.mark.parametrize("kind", ["symmetric", "directed", "zero_rows", "self_loops"])
def test_solvers_agree_in_float32(kind, laplacian):
    x, ei, w = make_graph(kind, n=60, d=8, dtype=torch.float32)
    w = w.float() if w is not None else None
    out = {}
    for solver in SOLVERS:
        layer = make_layer(8, laplacian, solver=solver, max_iter=500, tol=1e-7,
                           dtype=torch.float32)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # cg -> anderson on 'directed'
            out[solver] = layer(x, ei, w)
        assert out[solver].dtype == torch.float32
    want, _ = dense(layer, x, ei, w)
    for solver, z in out.items():
        assert rel_err(z, want) < 2e-6, solver
    assert rel_err(out["cg"], out["anderson"]) < 2e-6
    assert rel_err(out["cg"], out["fixed_point"]) < 2e-6


def test_guard_rows_keep_their_features():
    """chi = 0 rows (all-zero features under the neural Laplacian, isolated nodes) are
    identity rows of the SPD form: z_i = x_i exactly, no NaN forward or backward, at the
    paper's settings in float32 with the default initialization."""
    x, ei, _ = make_graph("zero_rows", n=50, d=8, dtype=torch.float32)
    x[7] = 0.0
    zero = (x == 0).all(dim=1)
    for solver in ("cg", "anderson"):
        torch.manual_seed(0)
        layer = dk.FusedImplicitDiffusion(8, mu=2.2, solver=solver)
        xr = x.clone().requires_grad_()
        z = layer(xr, ei)
        assert torch.isfinite(z).all()
        assert torch.equal(z[zero], torch.zeros_like(z[zero]))
        z.square().sum().backward()
        assert torch.isfinite(xr.grad).all()
        assert all(torch.isfinite(p.grad).all() for p in layer.parameters())
    xi, eii, _ = make_graph("isolated")
    for laplacian in LAPLACIANS:
        z = make_layer(xi.size(1), laplacian, solver="cg")(xi, eii)
        assert torch.equal(z[-4:], xi[-4:])


def test_zero_input_needs_no_sweep():
    x, ei, _ = make_graph("symmetric")
    for solver in ("cg", "anderson"):
        layer = make_layer(x.size(1), "rw", solver=solver)
        z = layer(torch.zeros_like(x), ei)
        assert torch.equal(z, torch.zeros_like(x))
        assert layer.iterations <= 1 and layer.residual == 0.0


# --------------------------------------------------------------------- gradients --

GRAD_CASES = ([("cg", k, lap) for k in ("symmetric", "self_loops", "zero_rows", "isolated")
               for lap in ("neural", "rw", "sym")] +
              [("anderson", k, lap) for k, lap in [("symmetric", "neural"), ("directed", "neural"),
                                                   ("zero_rows", "neural"), ("symmetric", "rw"),
                                                   ("directed", "sym")]])


@pytest.mark.parametrize("solver,kind,laplacian", GRAD_CASES)
def test_gradcheck(solver, kind, laplacian):
    x, ei, w = make_graph(kind, n=14, d=3)
    layer = make_layer(3, laplacian, h=3, solver=solver, **EXACT)
    assert gradcheck_layer(layer, kind, x, ei, w)
    assert layer.backward_iterations < EXACT["max_iter"]


@pytest.mark.parametrize("laplacian", LAPLACIANS)
@pytest.mark.parametrize("solver", ["cg", "anderson"])
def test_gradients_match_fixed_point(solver, laplacian):
    """The adjoint of the SPD form, u = C (C + L/mu)^-1 g, and Anderson's adjoint give the
    gradients of the paper's implicit backward."""
    x, ei, w = make_graph("weighted", n=30, d=5)
    grads = {}
    for name in ("fixed_point", solver):
        layer = make_layer(5, laplacian, solver=name, **EXACT)
        xr = x.clone().requires_grad_()
        z = layer(xr, ei, w)
        g = torch.linspace(-1, 1, z.numel(), dtype=z.dtype).view_as(z)
        grads[name] = torch.autograd.grad(z, [xr] + list(layer.parameters()), g)
        assert layer.backward_iterations < EXACT["max_iter"]
        if name != "fixed_point":
            assert layer.backward_relative_residual <= EXACT["tol"]
    for a, b in zip(grads[solver], grads["fixed_point"]):
        assert rel_err(a, b) < 1e-11


def test_gradcheck_unnormalized_cg():
    x, ei, w = make_graph("weighted", n=14, d=3)
    layer = make_layer(3, "unnormalized", solver="cg", **EXACT)
    x.requires_grad_()
    assert torch.autograd.gradcheck(lambda x: layer(x, ei, w), (x,), eps=1e-6, atol=1e-6)


# ------------------------------------------------------------ mu below lambda_max --

@pytest.mark.parametrize("laplacian", ["neural", "rw", "sym", "unnormalized"])
def test_below_lambda_max_fixed_point_warns_and_cg_is_exact(laplacian):
    x, ei, w = make_graph("symmetric", n=40, d=4)
    probe = make_layer(4, laplacian, scale=3.0)
    _, delta = dense(probe, x, ei, w, mu=1.0)
    lam = lambda_max(delta)
    mu = 0.5 * lam  # the fixed point's error grows like 2^t
    want, _ = dense(probe, x, ei, w, mu=mu)

    for max_iter in (10, 60):
        fp = make_layer(4, laplacian, scale=3.0, mu=mu, max_iter=max_iter, tol=1e-12)
        with pytest.warns(dk.DivergenceWarning, match=rf"mu={mu:g}.*solver='cg'"):
            z = fp(x, ei, w)
        assert torch.isfinite(z).all()
        assert rel_err(z, want) > 1.0  # what the warning is about
    eye = torch.eye(x.size(0), dtype=torch.float64)
    for solver in ("cg", "anderson"):
        layer = make_layer(4, laplacian, scale=3.0, mu=mu, solver=solver, **EXACT)
        xr = x.clone().requires_grad_()
        with warnings.catch_warnings():
            warnings.simplefilter("error", dk.DivergenceWarning)
            z = layer(xr, ei, w)
        assert rel_err(z, want) < 1e-11, solver
        if laplacian != "neural":  # (the neural Delta depends on x too: see test_gradcheck)
            g = torch.randn_like(z)
            (gx,) = torch.autograd.grad(z, xr, g)  # the adjoint (I + Delta^T/mu)^-1 g
            assert rel_err(gx, torch.linalg.solve(eye + delta.T / mu, g)) < 1e-10


def test_below_lambda_max_float32_no_nan_and_warns():
    """Far past overflow range (float32, 300 iterations at twice lambda_max / mu): a
    warning, never a silent NaN."""
    x, ei, _ = make_graph("symmetric", n=40, d=4, dtype=torch.float32)
    layer = make_layer(4, "rw", mu=0.5, max_iter=300, tol=0.0, dtype=torch.float32)
    with pytest.warns(dk.DivergenceWarning, match="mu=0.5"):
        layer(x, ei)
    cg = make_layer(4, "rw", mu=0.5, max_iter=300, tol=1e-6, dtype=torch.float32,
                    solver="cg")
    z = cg(x, ei)
    want, _ = reference.dense_equilibrium(x, ei, laplacian="rw", mu=0.5)
    assert rel_err(z, want) < 1e-5


@pytest.mark.parametrize("backend", ["cpu", "torch"])
def test_python_fixed_point_stops_at_divergence(backend):
    """The fixed point on csr_fma (every backend) checks its divergence certificate on the
    device: it stops before anything overflows, returns a finite iterate and flags it."""
    x, ei, _ = make_graph("symmetric", n=40, d=4)
    g = dk.build_graph(ei, x.size(0))
    wf, chi, kappa = g.fixed_laplacian("rw", x.dtype)
    kw = dict(mu=0.5, max_iter=2000, tol=0.0, solver="fixed_point", backend=backend)
    if backend == "cpu":  # the compiled loop runs all 2000 iterations, then warns
        with pytest.warns(dk.DivergenceWarning, match="mu=0.5"):
            solvers.implicit_diffusion(g.rowptr, g.col, wf, x, chi, None, None, kappa, **kw)
        system = solvers.EquilibriumSystem(CPU, g.rowptr, g.col, wf, chi, kappa, 0.5)
        out = solvers.solve_forward(system, x, "fixed_point", max_iter=2000, tol=0.0)
        assert bool(out.diverged) and int(out.sweeps) < 100
        assert torch.isfinite(out.solution).all()
        return
    with pytest.warns(dk.DivergenceWarning, match="mu=0.5"):
        z, stats = solvers.implicit_diffusion(g.rowptr, g.col, wf, x, chi, None, None, kappa,
                                              **kw)
    assert torch.isfinite(z).all() and stats[3] == 1 and stats[0] < 100


def test_torch_backend_fixed_point_warns():
    x, ei, _ = make_graph("symmetric", n=40, d=4)
    layer = make_layer(4, "rw", mu=0.5, max_iter=40, backend="torch")
    with pytest.warns(dk.DivergenceWarning, match="mu=0.5"):
        layer(x, ei)


def test_converging_fixed_point_does_not_warn():
    """The certificate ||Z_t||_C <= ||X||_C holds for every iterate when mu >= lambda_max:
    no false alarm, even right at mu = lambda_max and after a few iterations."""
    x, ei, w = make_graph("weighted", n=40, d=4)
    for laplacian in LAPLACIANS:
        probe = make_layer(4, laplacian)
        _, delta = dense(probe, x, ei, w, mu=1.0)
        lam = lambda_max(delta)
        for mu in (lam * 1.0001, 1.5 * lam, 10 * lam):
            for max_iter in (2, 3, 10, 200):
                layer = make_layer(4, laplacian, mu=mu, max_iter=max_iter)
                with warnings.catch_warnings():
                    warnings.simplefilter("error", dk.DivergenceWarning)
                    layer(x, ei, w)


# ---------------------------------------------------------- convergence and loops --

@pytest.mark.parametrize("mu", [2.2, 1.0, 0.25])
def test_cg_sweeps_within_chebyshev_bound(mu):
    """Jacobi-preconditioned CG on the rw Laplacian: the preconditioned matrix is
    I + Delta/mu, condition number kappa <= 1 + 2/mu, so the error falls at least like
    2 ((sqrt(kappa) - 1) / (sqrt(kappa) + 1))^k. CG reaches 1e-6 within twice that many
    sweeps (the slack covers the norm change), for every mu; the fixed point needs far more
    at mu = 2.2 and diverges below mu = lambda_max."""
    ring = torch.arange(400, 406)  # a 6-cycle: bipartite, so lambda_max(Delta) = 2 (as cornell5)
    cycle = torch.stack([ring, ring.roll(1)])
    edge_index = torch.cat([uniform_graph(400, 3000, seed=1), cycle, cycle.flip(0)], dim=1)
    x = torch.randn(406, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    cond = 1.0 + 2.0 / mu
    rate = (math.sqrt(cond) - 1) / (math.sqrt(cond) + 1)
    bound = math.ceil(math.log(2 / 1e-6) / -math.log(rate))
    layer = make_layer(6, "rw", mu=mu, solver="cg", max_iter=500, tol=1e-6)
    z = layer(x, edge_index)
    assert layer.iterations <= 2 * bound
    want, delta = reference.dense_equilibrium(x, edge_index, laplacian="rw", mu=mu)
    assert equation_residual(x, z, delta, mu) < 2e-6
    if mu == 2.2:
        g = dk.build_graph(edge_index, 406)
        wf, chi, kappa = g.fixed_laplacian("rw", x.dtype)
        system = solvers.EquilibriumSystem(CPU, g.rowptr, g.col, wf, chi, kappa, mu)
        fp = solvers.solve_forward(system, x, "fixed_point", max_iter=2000, tol=1e-6)
        assert int(fp.sweeps) >= 5 * layer.iterations


@pytest.mark.parametrize("solver", SOLVERS)
def test_check_every_does_not_change_results(solver, unfused_cpu):
    """Converged solves freeze on the device, so reading the flag every sweep, every 3
    sweeps or never (a fixed max_iter sweeps) gives bit-identical results and stats."""
    x, ei, w = make_graph("weighted", n=40, d=5)
    g = dk.build_graph(ei, x.size(0), w)
    wf, chi, kappa = g.fixed_laplacian("rw", x.dtype)
    results = []
    for check_every in (1, 3, 0):
        xr = x.clone().requires_grad_()
        z, _, _, stats = torch.ops.dignn.implicit_solve(  # the Python loops, fixed point too
            g.rowptr, g.col, wf, xr, chi, None, None, kappa, None, None, None, None, 2.2, 1e-6,
            200, 1e-9, solver, "cpu", check_every, 5)
        (gx,) = torch.autograd.grad(z, xr, torch.ones_like(z))
        results.append((z.detach(), gx, stats, solvers.backward_stats(stats)))
    for other in results[1:]:
        for a, b in zip(results[0], other):
            assert torch.equal(a, b)
    assert results[0][2][0] < 200  # converged before max_iter


def test_python_fixed_point_matches_compiled_loop(unfused_cpu):
    """solver='fixed_point' on csr_fma is the compiled loop's iteration: Z_1 = X, then one
    sweep per iteration, the same iteration count and stopping test."""
    x, ei, w = make_graph("weighted", n=30, d=5)
    layer = make_layer(5, "neural", max_iter=9, tol=0.0)
    g = dk.build_graph(ei, x.size(0), w)
    a, degree = g.values(x.dtype)
    chi, p, q = layer._projections(x, degree)
    for tol in (0.0, 1e-4):
        want, want_stats = torch.ops.dignn.implicit_diffusion(
            g.rowptr, g.col, a, x, chi, p, q, None, layer.mu, 1e-6, 9, tol, None, None,
            None)[::3]
        z, _, _, stats = torch.ops.dignn.implicit_solve(
            g.rowptr, g.col, a, x, chi, p, q, None, None, None, None, None, layer.mu, 1e-6, 9,
            tol, "fixed_point", "cpu", 1, 5)
        assert int(stats[0]) == int(want_stats[0]) == (9 if tol == 0 else int(stats[0]))
        assert rel_err(z, want) < 1e-14
        assert torch.allclose(stats[:3], want_stats, rtol=1e-12)


def composed_row_step(row_pass):
    """The pass interface's row step (interface.RowStep) composed from a row pass and the
    loop's own bookkeeping: the contract the Triton kernels implement, on any backend."""
    def row_step(rowptr, col, w, b, cy, rs, c):
        def step(y, out, state, history, k):
            done = state[iface.FP_DONE] != 0
            new = row_pass(rowptr, col, w, y, b, cy, rs)
            out.copy_(torch.where(done, out, new))
            live = (~done).double()  # a done sweep's norms are 0
            wide = new.double()
            row_sq = wide.square().sum(dim=1)
            loops.fixed_point_update(state, history, k, live * (wide - y.double()).norm(),
                                     live * row_sq.sum().sqrt(), live * (c * row_sq).sum())
        return step
    return row_step


ROW_STEP_CASES = [  # (graph, laplacian, mu, max_iter, tol, storage): stops, diverges, edges
    ("weighted", "rw", 2.2, 200, 1e-7, None),  # converges early
    ("directed", "rw", 2.2, 12, 0.0, None),  # every sweep, a directed adjoint
    ("symmetric", "rw", 0.5, 400, 0.0, None),  # breaks the certificate: diverged
    ("symmetric", "rw", 0.5, 2, 0.0, None),
    ("weighted", "sym", 2.2, 1, 1e-7, None),  # no sweep
    ("zero_rows", "rw", 2.2, 60, 1e-4, torch.bfloat16),
    ("directed", "rw", 2.2, 9, 0.0, torch.float16),
]


@pytest.mark.parametrize("case", ROW_STEP_CASES)
def test_fixed_point_on_a_row_step_equals_the_plain_loop(case):
    """The fixed point on a backend's row step (two buffers, the norms from the sweep, done
    sweeps that write nothing, the last accepted iterate picked at the end) gives what the
    loop on the row pass gives: the same iterate bit for bit, the same sweeps and flags and
    the same residuals, reading the flag every sweep, every 3 sweeps or never, forward and
    adjoint, from X = 0 too."""
    kind, laplacian, mu, max_iter, tol, storage = case
    x, ei, w = make_graph(kind, n=40, d=5, dtype=torch.float32)
    g = dk.build_graph(ei, x.size(0), w)
    wf, chi, kappa = g.fixed_laplacian(laplacian, x.dtype)
    t = g.transposed() or (None, None, None)
    stepped = dataclasses.replace(CPU, fused_solve=None,
                                  row_step=composed_row_step(CPU.csr_fma))
    systems = [solvers.EquilibriumSystem(backend, g.rowptr, g.col, wf, chi, kappa, mu,
                                         t_rowptr=t[0], t_col=t[1], t_perm=t[2])
               for backend in (CPU, stepped)]
    assert systems[0].row_step_of(False, x, chi) is None
    diverged = []
    for solve in (solvers.solve_forward, solvers.solve_adjoint):
        for rhs in (x, torch.zeros_like(x)):
            for check_every in (1, 3, 0):
                plain, on_step = (solve(system, rhs, "fixed_point", max_iter=max_iter, tol=tol,
                                        check_every=check_every, storage_dtype=storage)
                                  for system in systems)
                assert torch.equal(on_step.solution, plain.solution)
                assert on_step.solution.dtype == x.dtype
                assert int(on_step.sweeps) == int(plain.sweeps)
                assert bool(on_step.diverged) == bool(plain.diverged)
                # 16-bit: the row step sums the exact differences of the stored iterates (as
                # the fused loops do), the plain loop their difference rounded to 16 bits
                rtol = 1e-5 if storage is None else 1e-3
                assert torch.allclose(on_step.stats(), plain.stats(), rtol=rtol, atol=1e-30)
                assert torch.allclose(on_step.history, plain.history, rtol=rtol,
                                      equal_nan=True)
                diverged.append(bool(plain.diverged))
    assert any(diverged) == (mu < 1.0)  # mu = 0.5 breaks the certificate at sweep 1 already


def composed_row_product(row_pass):
    """The pass interface's row product (interface.RowProduct) composed from a row pass and
    the dot product of the PyTorch cg update: the contract the Triton kernels implement."""
    def row_product(rowptr, col, w, cy, rs):
        def product(y, out, done):
            new = row_pass(rowptr, col, w, y, torch.zeros_like(y), cy, rs)
            out.copy_(torch.where(done[0] != 0, out, new))
            return torch.where(done[0] != 0, 0.0, (out * y).sum(dim=0))
        return product
    return row_product


CG_PRODUCT_CASES = [("weighted", "rw", 2.2, 200, 1e-7), ("zero_rows", "neural", 1.0, 200, 1e-9),
                    ("isolated", "sym", 0.3, 25, 0.0), ("symmetric", "rw", 2.2, 1, 1e-7),
                    ("empty", "rw", 2.2, 10, 1e-7)]


@pytest.mark.parametrize("case", CG_PRODUCT_CASES)
def test_cg_on_a_row_product_equals_cg_on_the_row_pass(case):
    """cg on a backend's row product (the sweep into one reused buffer, its dots w.u from
    the product, nothing once done) gives what cg on the row pass and its own dot product
    gives: the same solution bit for bit, sweeps, flags and history, reading the flag every
    sweep, every 3 sweeps or never, forward and adjoint, from X = 0 too."""
    kind, laplacian, mu, max_iter, tol = case
    x, ei, w = make_graph(kind, n=40, d=5, dtype=torch.float64)
    g = dk.build_graph(ei, x.size(0), w)
    if laplacian == "neural":
        layer = make_layer(5, "neural", dtype=torch.float64)
        a, degree = g.values(x.dtype)
        chi, p, q = (t.detach() for t in layer._projections(x, degree))
        wf, kappa = ops.neural_edge_weights(g.rowptr, g.col, a, p, q)
    else:
        wf, chi, kappa = g.fixed_laplacian(laplacian, x.dtype)
    with_product = dataclasses.replace(CPU, fused_solve=None,
                                       row_product=composed_row_product(CPU.csr_fma))
    systems = [solvers.EquilibriumSystem(backend, g.rowptr, g.col, wf, chi, kappa, mu)
               for backend in (CPU, with_product)]
    assert systems[0].spd_product() is None and systems[1].spd_product() is not None
    for solve in (solvers.solve_forward, solvers.solve_adjoint):
        for rhs in (x, torch.zeros_like(x)):
            for check_every in (1, 3, 0):
                plain, on_product = (solve(system, rhs, "cg", max_iter=max_iter, tol=tol,
                                           check_every=check_every) for system in systems)
                assert torch.equal(on_product.solution, plain.solution)
                assert int(on_product.sweeps) == int(plain.sweeps)
                assert bool(on_product.diverged) == bool(plain.diverged)
                assert torch.equal(on_product.stats(), plain.stats())
                assert torch.equal(on_product.history.nan_to_num(-1.0),
                                   plain.history.nan_to_num(-1.0))


@pytest.mark.parametrize("solver", SOLVERS)
def test_solves_read_nothing_on_the_host_between_checks(solver):
    """The GPU default (the flag read every 16 fixed-point sweeps, every 4 of cg and
    anderson): a solve of fewer sweeps, converged from the start (X = 0) or not, forward and
    adjoint, on the row pass and on a row step (or cg's row product), reads no value back to
    the host (on a GPU each read is a device sync); reading the flag every 4 sweeps reads it
    2 times in 8 or 9 sweeps."""
    x, ei, w = make_graph("weighted", n=30, d=4)
    g = dk.build_graph(ei, x.size(0), w)
    wf, chi, kappa = g.fixed_laplacian("rw", x.dtype)
    stepped = dataclasses.replace(CPU, fused_solve=None,
                                  row_step=composed_row_step(CPU.csr_fma),
                                  row_product=composed_row_product(CPU.csr_fma))
    backends = [CPU] + ([stepped] if solver != "anderson" else [])
    quiet = 16 if solver == "fixed_point" else 4
    for backend in backends:
        system = solvers.EquilibriumSystem(backend, g.rowptr, g.col, wf, chi, kappa, 2.2)
        for solve in (solvers.solve_forward, solvers.solve_adjoint):
            for rhs in (x, torch.zeros_like(x)):
                with HostReads() as reads:
                    solve(system, rhs, solver, max_iter=quiet - 1, tol=1e-12,
                          check_every=quiet)
                assert reads.count == 0, (backend.row_step, solve, rhs.any())
            with HostReads() as reads:
                solve(system, x, solver, max_iter=9, tol=1e-12, check_every=4)
            assert reads.count == 2


def test_solve_history_and_stats():
    x, ei, w = make_graph("weighted", n=40, d=5)
    g = dk.build_graph(ei, x.size(0), w)
    wf, chi, kappa = g.fixed_laplacian("rw", x.dtype)
    _, delta = reference.dense_equilibrium(x, ei, w, laplacian="rw", mu=2.2)
    system = solvers.EquilibriumSystem(CPU, g.rowptr, g.col, wf, chi, kappa, 2.2)
    for solver in SOLVERS:
        out = solvers.solve_forward(system, x, solver, max_iter=300, tol=1e-8)
        k = int(out.sweeps)
        valid = torch.isfinite(out.history)
        assert valid.sum() == (k + 1 if solver == "cg" else k)
        assert out.history[0] <= 1.0 + 1e-9 and not bool(out.diverged)
        last = out.history[valid][-1]
        assert last <= 1e-8 < out.history[valid][-2]
        if solver != "fixed_point":  # the reported residual is the solution's, measured
            true = equation_residual(x, out.solution, delta, 2.2)
            assert true == pytest.approx(float(out.relative), rel=1e-3)


def test_layer_diagnostics_cg():
    x, ei, _ = make_graph("symmetric", n=40, d=8)
    layer = make_layer(8, "rw", mu=1.0, solver="cg", max_iter=200, tol=1e-8)
    xr = x.clone().requires_grad_()
    z = layer(xr, ei)
    _, delta = reference.dense_equilibrium(x, ei, laplacian="rw", mu=1.0)
    assert 2 < layer.iterations < 200
    assert layer.relative_residual <= 1e-8
    assert equation_residual(x, z, delta, 1.0) == pytest.approx(layer.relative_residual,
                                                                rel=1e-3)
    assert layer.residual == pytest.approx(layer.relative_residual * float(x.norm()))
    assert layer.backward_iterations is None
    g = torch.randn_like(z)
    z.backward(g)
    assert 2 < layer.backward_iterations < 200
    assert layer.backward_residual <= 1e-8 * float(g.norm()) * (1 + 1e-9)


# ------------------------------------------------------ backends, compile, opcheck --

@pytest.mark.parametrize("kind", ["self_loops", "directed"])  # self-loops: rho = 0, the kink
def test_torch_passes_match_compiled_ops(kind):
    x, ei, w = make_graph(kind, n=25, d=5)
    g = dk.build_graph(ei, x.size(0), w)
    gen = torch.Generator().manual_seed(3)
    p = 0.5 * torch.randn(25, 4, generator=gen, dtype=torch.float64)
    q = 0.5 * torch.randn(25, 4, generator=gen, dtype=torch.float64)
    a, _ = g.values(torch.float64)
    z, v = torch.randn_like(x), torch.randn_like(x)
    cy, rs = torch.randn(25, dtype=torch.float64), torch.randn(25, dtype=torch.float64)
    for got, want in [
        (torch_passes.neural_edge_weights(g.rowptr, g.col, a, p, q, 1e-6),
         ops.neural_edge_weights(g.rowptr, g.col, a, p, q, 1e-6)),
        ((torch_passes.csr_fma(g.rowptr, g.col, a, z, x, cy, rs),),
         (ops.csr_fma(g.rowptr, g.col, a, z, x, cy, rs),)),
        (torch_passes.neural_weight_grad(g.rowptr, g.col, a, p, q, z, v, 1e-6),
         ops.neural_weight_grad(g.rowptr, g.col, a, p, q, z, v, 1e-6,
                                *(dk.graph.transpose_csr(g.rowptr, g.col, 25)))),
    ]:
        for s, t in zip(got, want):
            assert rel_err(s, t) < 1e-13


@pytest.mark.parametrize("laplacian", ["neural", "rw"])
@pytest.mark.parametrize("solver", ["cg", "anderson"])
def test_torch_backend_agrees(solver, laplacian):
    x, ei, w = make_graph("weighted", n=30, d=6)
    fused = make_layer(6, laplacian, solver=solver, max_iter=50, tol=1e-12)
    plain = make_layer(6, laplacian, solver=solver, max_iter=50, tol=1e-12, backend="torch")
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    za, zb = fused(xa, ei, w), plain(xb, ei, w)
    assert plain.backend_used == "torch" and plain.solver_used == solver
    assert rel_err(za, zb) < 1e-12
    g = torch.randn_like(za)
    ga = torch.autograd.grad(za, [xa] + list(fused.parameters()), g)
    gb = torch.autograd.grad(zb, [xb] + list(plain.parameters()), g)
    for a, b in zip(ga, gb):
        assert rel_err(a, b) < 1e-10


def test_torch_compile():
    """The cg/anderson solve is one custom op (dignn::implicit_solve, opaque to the
    compiler, with a fake kernel and a registered backward)."""
    x, ei, w = make_graph("weighted", n=30, d=6, dtype=torch.float32)
    w = w.float()
    layer = make_layer(6, dtype=torch.float32, max_iter=30, solver="cg")
    want = layer(x, ei, w)
    compiled = torch.compile(layer)
    assert rel_err(compiled(x, ei, w), want) < 1e-6
    xr, xe = x.clone().requires_grad_(), x.clone().requires_grad_()
    compiled(xr, ei, w).sum().backward()
    layer(xe, ei, w).sum().backward()
    assert rel_err(xr.grad, xe.grad) < 1e-5


def test_opcheck():
    x, ei, w = make_graph("symmetric", n=20, d=5)
    g = dk.build_graph(ei, x.size(0), w)
    gen = torch.Generator().manual_seed(1)
    p = 0.5 * torch.randn(20, 4, generator=gen, dtype=torch.float64)
    q = 0.5 * torch.randn(20, 4, generator=gen, dtype=torch.float64)
    a, degree = g.values(torch.float64)
    chi = degree * torch.tanh(p.norm(dim=1))
    wf, chif, kappa = g.fixed_laplacian("rw", torch.float64)
    req = lambda *ts: [t.clone().requires_grad_() for t in ts]  # noqa: E731
    tail = (3.0, 1e-6, 30, 1e-8)
    for args in [
        (g.rowptr, g.col, a, *req(x, chi, p, q), None, None, None, None, g.diagonal_index(),
         *tail, "cg", "cpu", 1, 5),
        (g.rowptr, g.col, a, x, chi, p, q, None, None, None, None, None, *tail, "fixed_point",
         "cpu", 0, 5),
        (g.rowptr, g.col, wf, *req(x), chif, None, None, kappa, None, None, None, None, *tail,
         "anderson", "cpu", 2, 3),
    ]:
        torch.library.opcheck(torch.ops.dignn.implicit_solve.default, args)
    z = torch.randn_like(x)
    w_n, kappa_n = ops.neural_edge_weights(g.rowptr, g.col, a, p, q)
    torch.library.opcheck(torch.ops.dignn.implicit_solve_backward.default,
                          (g.rowptr, g.col, a, w_n, kappa_n, None, None, None, None, x, chi, p,
                           q, z, torch.randn_like(x), *tail, "cg", "cpu", 1, 5))


# ------------------------------------------------------------------- bad input --

def test_cg_on_directed_graph_falls_back_with_a_message():
    x, ei, w = make_graph("directed")
    layer = make_layer(x.size(1), "rw", solver="cg", **EXACT)
    with pytest.warns(UserWarning, match=r"solver='cg' needs a symmetric W.*to_undirected"):
        z = layer(x, ei, w)
    assert layer.solver_used == "anderson"
    assert rel_err(z, dense(layer, x, ei, w)[0]) < 1e-12
    g = dk.build_graph(ei, x.size(0), w)
    wf, chi, kappa = g.fixed_laplacian("rw", x.dtype)
    t_rowptr, t_col, t_perm = g.transposed()
    with pytest.raises(ValueError, match="needs a symmetric W"):  # the op itself refuses
        torch.ops.dignn.implicit_solve(g.rowptr, g.col, wf, x, chi, None, None, kappa,
                                       t_rowptr, t_col, t_perm, None, 2.2, 1e-6, 10, 1e-6,
                                       "cg", "cpu", 1, 5)


def test_bad_arguments():
    with pytest.raises(ValueError, match=r"solver must be one of .*'cg'.*got 'gmres'"):
        dk.FusedImplicitDiffusion(4, solver="gmres")
    with pytest.raises(ValueError, match="check_every must be an integer >= 0"):
        dk.FusedImplicitDiffusion(4, solver="cg", check_every=-1)
    x, ei, _ = make_graph("symmetric")
    g = dk.build_graph(ei, x.size(0))
    wf, chi, kappa = g.fixed_laplacian("rw", x.dtype)
    args = (g.rowptr, g.col, wf, x, chi, None, None, kappa)
    for kw, match in [(dict(max_iter=0), "max_iter must be an integer >= 1"),
                      (dict(tol=-1.0), "tol must be a finite number >= 0"),
                      (dict(mu=0.0), "mu must be a finite number > 0"),
                      (dict(window=0), "window must be an integer >= 1"),
                      (dict(check_every=1.5), "check_every must be an integer >= 0"),
                      (dict(backend="tpu"), "backend must be one of")]:
        base = dict(mu=2.2, solver="anderson")
        base.update(kw)
        with pytest.raises(ValueError, match=match):
            solvers.implicit_diffusion(*args, **base)


def test_diagonal_index():
    x, ei, _ = make_graph("self_loops")
    g = dk.build_graph(ei, x.size(0))
    index = g.diagonal_index()
    rows = g.rows()
    loops = torch.arange(0, x.size(0), 3)
    assert torch.equal(index >= 0, torch.isin(torch.arange(x.size(0)), loops))
    assert torch.equal(rows[index[loops]], loops) and torch.equal(g.col[index[loops]].long(),
                                                                  loops)
