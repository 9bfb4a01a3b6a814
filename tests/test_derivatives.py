"""Derivatives of the layer beyond its first-order backward (issue 43), in float64 on small
graphs, against the dense float64 solve of :mod:`dignn_kernels.reference` (differentiated by
torch itself, in any mode and order) and against finite differences:

- forward-mode AD: ``torch.func.jvp`` and ``torch.autograd.forward_ad`` give the tangent of Z
  (one more solve, dZ = (I + Delta/mu)^-1 (dX - (1/mu) dDelta Z)), in x, in the neural
  weights, in the fixed edge values and kappa; never zeros, never no tangent;
- second derivatives: double backward (``create_graph=True``) through the solve, the neural
  edge weights (eq. 13-14) and chi: ``gradgradcheck`` of the layer in x and the Θs for every
  Laplacian, solver and backend run here, Hessian-vector products and a gradient-penalty
  step against the dense solve;
- the torch.func transforms: ``jacrev``, ``jacfwd``, ``hessian`` of the layer and ``vmap`` of
  the solve over right-hand sides;
- the ops under them: ``ops.neural_edge_weights`` twice differentiable and in forward mode,
  the solve differentiable in fixed edge values and kappa.

Before the fix (main at afe555f) every case here failed: jvp returned zeros, forward_ad no
tangent or torch's NotImplementedError, every double backward torch's "no autograd formula was
registered" for dignn::implicit_solve_backward.
"""
import pytest
import torch
import torch.autograd.forward_ad as fwAD

import dignn_kernels as dk
from dignn_kernels import ops, reference
from conftest import make_graph, make_layer, rel_err, thetas

EXACT = dict(max_iter=400, tol=1e-13)
SOLVERS = ["fixed_point", "cg", "anderson"]
MU = 8.0
LAPLACIANS = ["neural", "rw", "sym", "unnormalized"]


def _layer(laplacian, solver="fixed_point", backend="cpu", d=3, **kwargs):
    """A float64 layer solving to 1e-13 (mu well above lambda_max(Delta): few sweeps)."""
    kwargs.setdefault("mu", 120.0 if laplacian == "unnormalized" else 8.0)
    return make_layer(d, laplacian, h=2, solver=solver, backend=backend, **EXACT, **kwargs)


def _graph(kind, n=8, d=3, seed=0):
    """(x, edge_index, edge_weight, CSRGraph) of a small float64 graph."""
    x, ei, w = make_graph(kind, n=n, d=d, seed=seed)
    return x, ei, w, dk.build_graph(ei, x.size(0), w)


def _dense(layer, ei, w, params=None):
    """u -> Z* of the dense float64 solve with the layer's (or ``params``') weights, which
    torch differentiates in every mode and order."""
    weights = thetas(layer) if params is None else \
        {k.replace(".weight", ""): v for k, v in params.items()}

    def f(u):
        return reference.dense_equilibrium(u, ei, w, laplacian=layer.laplacian, mu=layer.mu,
                                           eps=layer.eps, **weights)[0]
    return f


def _cases(kinds=("symmetric",), backends=("cpu",), laplacians=LAPLACIANS, solvers=SOLVERS,
           slow=False):
    """(kind, laplacian, solver, backend) with cg on symmetric graphs only; ``slow``: marked
    slow (the full matrix; the core cases run unmarked)."""
    marks = [pytest.mark.slow] if slow else []
    return [pytest.param(k, lap, s, b, id=f"{k}-{lap}-{s}-{b}", marks=marks)
            for k in kinds for lap in laplacians for s in solvers for b in backends
            if not (s == "cg" and k == "directed")]


OTHER_KINDS = ("isolated", "self_loops", "weighted")
# every Laplacian x solver on the compiled CPU passes, directed graphs with anderson, one
# Triton case; the rest of the matrix slow
CORE = _cases() + _cases(kinds=("directed",), solvers=("anderson",))
FULL = _cases(backends=("torch",), slow=True) + \
    _cases(kinds=("directed",), solvers=("fixed_point",), slow=True) + \
    _cases(kinds=OTHER_KINDS, solvers=("fixed_point", "anderson"), slow=True)


# ------------------------------------------------------------------- forward mode --

JVP_CASES = CORE + _cases(backends=("triton",), laplacians=("neural",),
                          solvers=("fixed_point",)) + FULL


@pytest.mark.parametrize("kind,laplacian,solver,backend", JVP_CASES)
def test_jvp_in_x_matches_dense(kind, laplacian, solver, backend):
    """torch.func.jvp of the layer in x: the tangent of the dense solve (was all zeros)."""
    x, ei, w, g = _graph(kind)
    layer = _layer(laplacian, solver, backend)
    t = torch.randn(x.shape, dtype=x.dtype, generator=torch.Generator().manual_seed(1))
    z, dz = torch.func.jvp(lambda u: layer(u, g), (x,), (t,))
    z_want, dz_want = torch.func.jvp(_dense(layer, ei, w), (x,), (t,))
    assert rel_err(z, z_want) < 1e-10
    assert rel_err(dz, dz_want) < 1e-9, rel_err(dz, dz_want)


@pytest.mark.parametrize("laplacian", LAPLACIANS)
@pytest.mark.parametrize("kind", ["symmetric", "directed", "isolated"])
def test_forward_ad_matches_dense(kind, laplacian):
    """torch.autograd.forward_ad through the layer called with edge_index, as users call it:
    the dense tangent (was no tangent for the fixed Laplacians, torch's NotImplementedError
    for the neural one)."""
    x, ei, w, _ = _graph(kind)
    layer = _layer(laplacian, "fixed_point")
    t = torch.randn(x.shape, dtype=x.dtype, generator=torch.Generator().manual_seed(2))
    with fwAD.dual_level():
        tangent = fwAD.unpack_dual(layer(fwAD.make_dual(x, t), ei, w)).tangent
    assert tangent is not None
    _, want = torch.func.jvp(_dense(layer, ei, w), (x,), (t,))
    assert rel_err(tangent, want) < 1e-9


@pytest.mark.parametrize("solver", ["fixed_point", "anderson"])
def test_jvp_matches_finite_differences(solver):
    """The tangent against central differences of the layer itself (no reference)."""
    x, ei, w, g = _graph("weighted")
    layer = _layer("neural", solver)
    t = torch.randn(x.shape, dtype=x.dtype, generator=torch.Generator().manual_seed(3))
    _, dz = torch.func.jvp(lambda u: layer(u, g), (x,), (t,))
    h = 1e-6
    with torch.no_grad():
        fd = (layer(x + h * t, g) - layer(x - h * t, g)) / (2 * h)
    assert rel_err(dz, fd) < 1e-7


@pytest.mark.parametrize("backend", ["cpu", "torch"])
@pytest.mark.parametrize("kind", ["symmetric", "directed"])
def test_jvp_in_the_neural_weights(kind, backend):
    """The tangent in Θχ, Θφ, Θϕ (through chi, p and q: eq. 12-14), by torch.func.jvp over
    functional_call, against the dense solve's."""
    x, ei, w, g = _graph(kind)
    layer = _layer("neural", "anderson", backend)
    params = {k: v.detach() for k, v in layer.named_parameters()}
    gen = torch.Generator().manual_seed(4)
    tangents = {k: torch.randn(v.shape, dtype=v.dtype, generator=gen) for k, v in
                params.items()}
    _, dz = torch.func.jvp(lambda p: torch.func.functional_call(layer, p, (x, g)),
                           (params,), (tangents,))
    _, want = torch.func.jvp(lambda p: _dense(layer, ei, w, p)(x), (params,), (tangents,))
    assert rel_err(dz, want) < 1e-9


def _fixed_system(kind):
    x, ei, w, g = _graph(kind)
    wf, chi, kappa = g.fixed_laplacian("rw", x.dtype)
    t = g.transposed()
    t_args = dict(zip(("t_rowptr", "t_col", "t_perm"), t)) if t is not None else {}
    return x, g, wf.clone(), chi, kappa.clone(), t_args


def _dense_fixed(g, wf, kappa, chi, x, mu):
    """Z* of (I + Delta/mu) Z = X, Delta = C^-1 (K - W), densely from the CSR."""
    n = x.size(0)
    rows = torch.repeat_interleave(torch.arange(n), g.rowptr[1:] - g.rowptr[:-1])
    dense_w = torch.zeros(n, n, dtype=x.dtype).index_put((rows, g.col.long()), wf,
                                                        accumulate=True)
    inv_chi = torch.where(chi > 0, 1.0 / chi.clamp_min(1e-300), torch.zeros_like(chi))
    delta = inv_chi.unsqueeze(1) * (torch.diag(kappa) - dense_w)
    return torch.linalg.solve(torch.eye(n, dtype=x.dtype) + delta / mu, x)


@pytest.mark.parametrize("solver", ["fixed_point", "anderson"])
@pytest.mark.parametrize("kind", ["symmetric", "directed"])
def test_op_tangents_in_edge_values_and_kappa(kind, solver):
    """dk.implicit_diffusion with fixed weights: tangents in W, kappa, chi and x at once
    against the dense solve (were zeros)."""
    x, g, wf, chi, kappa, t_args = _fixed_system(kind)
    gen = torch.Generator().manual_seed(5)
    prim = (wf, kappa, chi, x)
    tans = tuple(torch.randn(p.shape, dtype=p.dtype, generator=gen) for p in prim)

    def f(wf_, kappa_, chi_, x_):
        return dk.implicit_diffusion(g.rowptr, g.col, wf_, x_, chi_, kappa=kappa_, mu=MU,
                                     solver=solver, **t_args, **EXACT)[0]

    _, dz = torch.func.jvp(f, prim, tans)
    _, want = torch.func.jvp(lambda *a: _dense_fixed(g, *a, MU), prim, tans)
    assert rel_err(dz, want) < 1e-9


def test_neural_edge_weights_op_forward_mode():
    """ops.neural_edge_weights (the compiled op) under forward_ad and torch.func.jvp: the
    tangent of the torch composition of eq. 13-14 (was none / zeros)."""
    x, ei, w, g = _graph("weighted")
    gen = torch.Generator().manual_seed(6)
    a, _ = g.values(torch.float64)
    p, q, dp, dq = (torch.randn(x.size(0), 2, dtype=torch.float64, generator=gen)
                    for _ in range(4))
    da = torch.rand(a.shape, dtype=torch.float64, generator=gen)

    def f(a_, p_, q_):
        return ops.neural_edge_weights(g.rowptr, g.col, a_, p_, q_, trusted=True)

    def plain(a_, p_, q_):
        rows = g.rows()
        cols = g.col.long()
        pi = (p_[rows] * p_[cols]).sum(1)
        rho = (q_[rows] - q_[cols]).norm(dim=1)
        w_ = a_ * torch.tanh(1.0 / (rho + 1e-6)) * torch.tanh(pi.abs())
        return w_, torch.zeros_like(p_[:, 0]).index_add(0, rows, w_)

    (_, _), (dw, dkappa) = torch.func.jvp(f, (a, p, q), (da, dp, dq))
    (_, _), (dw_want, dkappa_want) = torch.func.jvp(plain, (a, p, q), (da, dp, dq))
    assert rel_err(dw, dw_want) < 1e-12 and rel_err(dkappa, dkappa_want) < 1e-12
    with fwAD.dual_level():
        out = f(a, fwAD.make_dual(p, dp), q)
        tangent = fwAD.unpack_dual(out[0]).tangent
    _, (dw_p, _) = torch.func.jvp(plain, (a, p, q), (torch.zeros_like(a), dp,
                                                      torch.zeros_like(q)))
    assert tangent is not None and rel_err(tangent, dw_p) < 1e-12


# ------------------------------------------------------------- second derivatives --

# fast mode (random projections of the Jacobians) over the matrix, every entry of the
# Jacobians on the core cases (slow)
GRADGRAD_CASES = [pytest.param(*c.values, False, id=c.id + "-fast", marks=c.marks)
                  for c in CORE + _cases(kinds=("isolated", "self_loops"),
                                         laplacians=("neural",), solvers=("fixed_point",))
                  + FULL + _cases(backends=("triton",), laplacians=("neural", "rw"),
                                  solvers=("fixed_point",), slow=True)] + \
    [pytest.param(*c.values, True, id=c.id, marks=[pytest.mark.slow]) for c in CORE]


@pytest.mark.parametrize("kind,laplacian,solver,backend,full", GRADGRAD_CASES)
def test_gradgradcheck_layer(kind, laplacian, solver, backend, full):
    """gradgradcheck of the layer in x and the Θs (float64, exact solves): second
    derivatives through the solve and eq. 12-14 (was torch's "no autograd formula was
    registered" for dignn::implicit_solve_backward). Unmarked: torch's fast mode (random
    projections of the Jacobians); slow: every entry."""
    x, ei, w, g = _graph(kind, n=6, d=2)
    layer = _layer(laplacian, solver, backend, d=2)
    params = list(layer.parameters())
    xr = x.clone().requires_grad_()

    def f(u, *_):
        return layer(u, g)

    assert torch.autograd.gradgradcheck(f, (xr, *params), eps=1e-6, atol=1e-6, rtol=1e-5,
                                        fast_mode=not full)


def _hvp_case(kind, laplacian, solver, backend="cpu"):
    x, ei, w, g = _graph(kind, n=8, d=3)
    layer = _layer(laplacian, solver, backend)
    gen = torch.Generator().manual_seed(7)
    c = torch.randn(x.shape, dtype=x.dtype, generator=gen)
    v = torch.randn(x.shape, dtype=x.dtype, generator=gen)

    def loss(z):  # a scalar loss with a nonzero Hessian in z
        return (c * z).sum() + 0.5 * (z * z).sum() + z.pow(3).sum() / 6.0
    return x, ei, w, g, layer, loss, v


@pytest.mark.parametrize("kind,laplacian,solver,backend",
                         _cases(solvers=("cg",)) +
                         _cases(kinds=("directed",), laplacians=("neural", "rw"),
                                solvers=("anderson",)) +
                         _cases(solvers=("fixed_point", "anderson"), slow=True) +
                         _cases(kinds=("directed",), laplacians=("sym", "unnormalized"),
                                solvers=("anderson",), slow=True))
def test_hessian_vector_product_matches_dense(kind, laplacian, solver, backend):
    """H v of a scalar loss of Z in x by double backward (the Pearlmutter trick: the
    gradient of <dl/dx, v>) against the dense solve's, and the Θ-part of the mixed second
    derivative d/dΘ <dl/dx, v>."""
    x, ei, w, g, layer, loss, v = _hvp_case(kind, laplacian, solver, backend)
    params = list(layer.parameters())
    xr = x.clone().requires_grad_()
    (gx,) = torch.autograd.grad(loss(layer(xr, g)), xr, create_graph=True)
    hv = torch.autograd.grad((gx * v).sum(), [xr] + params)
    xd = x.clone().requires_grad_()
    dense_params = [p.detach().clone().requires_grad_() for p in params]
    named = dict(zip([k for k, _ in layer.named_parameters()], dense_params))
    (gd,) = torch.autograd.grad(loss(_dense(layer, ei, w, named)(xd)), xd, create_graph=True)
    want = torch.autograd.grad((gd * v).sum(), [xd] + dense_params)
    for got, ref in zip(hv, want):
        assert rel_err(got, ref) < 1e-8, (rel_err(got, ref))


@pytest.mark.parametrize("laplacian", ["neural", "sym"])
def test_gradient_penalty_step(laplacian):
    """A training step with a gradient penalty, ||dl/dx||^2 added to the loss (the plain PyG
    composition supports it): the parameter gradients of the penalized loss against the dense
    solve's."""
    x, ei, w, g, layer, loss, _ = _hvp_case("symmetric", laplacian, "cg")
    params = list(layer.parameters())

    def penalized(f, u, ps):
        (gx,) = torch.autograd.grad(loss(f(u)), u, create_graph=True)
        return loss(f(u)) + (gx * gx).sum()

    xr = x.clone().requires_grad_()
    got = torch.autograd.grad(penalized(lambda u: layer(u, g), xr, params),
                              [xr] + params)
    xd = x.clone().requires_grad_()
    dense_params = [p.detach().clone().requires_grad_() for p in params]
    named = dict(zip([k for k, _ in layer.named_parameters()], dense_params))
    want = torch.autograd.grad(penalized(_dense(layer, ei, w, named), xd, dense_params),
                               [xd] + dense_params)
    for a, b in zip(got, want):
        assert rel_err(a, b) < 1e-8


@pytest.mark.parametrize("kind,solver,full", [
    ("symmetric", "fixed_point", False), ("directed", "fixed_point", False),
    pytest.param("symmetric", "anderson", True, marks=pytest.mark.slow),
    pytest.param("directed", "anderson", True, marks=pytest.mark.slow)])
def test_op_gradgradcheck_in_edge_values_and_kappa(kind, solver, full):
    """dk.implicit_diffusion with fixed weights, first and second derivatives in W, kappa,
    chi and x (W and kappa had no gradient before, and no second derivative anything)."""
    x, g, wf, chi, kappa, t_args = _fixed_system(kind)
    x = x[:, :2]
    inputs = tuple(t.clone().requires_grad_() for t in (wf, kappa, chi, x))

    def f(wf_, kappa_, chi_, x_):
        return dk.implicit_diffusion(g.rowptr, g.col, wf_, x_, chi_, kappa=kappa_, mu=MU,
                                     solver=solver, **t_args, **EXACT)[0]

    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-6, rtol=1e-5,
                                    fast_mode=not full)
    assert torch.autograd.gradgradcheck(f, inputs, eps=1e-6, atol=1e-6, rtol=1e-5,
                                        fast_mode=not full)


@pytest.mark.parametrize("backend,full", [
    (None, False), pytest.param(None, True, marks=pytest.mark.slow),
    pytest.param("triton", True, marks=pytest.mark.slow)])
def test_neural_edge_weights_op_second_derivatives(backend, full):
    """gradgradcheck of ops.neural_edge_weights in a, p and q (its backward was the
    compiled backward op, not differentiable; a had no gradient)."""
    x, ei, w, g = _graph("weighted", n=6)
    gen = torch.Generator().manual_seed(8)
    a, _ = g.values(torch.float64)
    p, q = (torch.randn(x.size(0), 2, dtype=torch.float64, generator=gen) for _ in range(2))
    inputs = tuple(t.clone().requires_grad_() for t in (a, p, q))

    def f(a_, p_, q_):
        return ops.neural_edge_weights(g.rowptr, g.col, a_, p_, q_, trusted=True,
                                       backend=backend)

    assert torch.autograd.gradcheck(f, inputs, fast_mode=not full)
    assert torch.autograd.gradgradcheck(f, inputs, fast_mode=not full)


# ------------------------------------------------------------- torch.func transforms --

@pytest.mark.parametrize("kind,laplacian,solver,backend",
                         _cases(laplacians=("neural",), solvers=("cg",)) +
                         _cases(kinds=("directed",), laplacians=("rw",),
                                solvers=("fixed_point",)) +
                         _cases(laplacians=("rw", "sym", "unnormalized"), solvers=("cg",),
                                slow=True) +
                         _cases(kinds=("directed",), laplacians=("neural", "sym"),
                                solvers=("fixed_point", "anderson"), slow=True))
def test_jacrev_jacfwd_hessian_match_dense(kind, laplacian, solver, backend):
    """torch.func.jacrev, jacfwd and hessian of the layer in x (vmap over the backward's
    and the tangent's solves, forward over reverse) against the dense solve's."""
    x, ei, w, g = _graph(kind, n=5, d=2)
    layer = _layer(laplacian, solver, backend, d=2)
    f, f_dense = (lambda u: layer(u, g)), _dense(layer, ei, w)
    for transform in (torch.func.jacrev, torch.func.jacfwd):
        assert rel_err(transform(f)(x), transform(f_dense)(x)) < 1e-9

    def scalar(fn):
        return lambda u: (fn(u) ** 3).sum()

    assert rel_err(torch.func.hessian(scalar(f))(x), torch.func.hessian(scalar(f_dense))(x)) \
        < 1e-8


@pytest.mark.parametrize("solver", ["fixed_point", "cg", "anderson"])
def test_vmap_over_right_hand_sides(solver):
    """torch.func.vmap of the solve over a batch of x: each entry its own solve (its own
    stopping test), equal to the unbatched calls; the stats are the worst entry's."""
    x, g, wf, chi, kappa, _ = _fixed_system("symmetric")
    xs = torch.stack([x, 2 * x.flip(0), -x])

    def f(u):
        return dk.implicit_diffusion(g.rowptr, g.col, wf, u, chi, kappa=kappa, mu=MU,
                                     solver=solver, host_checks=False, **EXACT)

    z, stats = torch.func.vmap(f, out_dims=(0, None))(xs)
    single = [f(u) for u in xs]
    assert torch.allclose(z, torch.stack([s[0] for s in single]), rtol=0, atol=1e-14)
    assert stats.shape == (4,) and stats[0] == max(float(s[1][0]) for s in single)


@pytest.mark.parametrize("laplacian", ["neural", "rw"])
def test_vmap_over_the_layer(laplacian):
    """torch.func.vmap of the layer over a batch of x, called with edge_index: the host
    checks stand aside for batched values (was torch's "data-dependent control flow" error
    from the check of x), and each entry is the layer's output for it."""
    x, ei, w, _ = _graph("directed")
    layer = _layer(laplacian, "anderson")
    xs = torch.stack([x, 2 * x.flip(0), -x])
    z = torch.func.vmap(lambda u: layer(u, ei, w))(xs)
    for u, zu in zip(xs, z):
        assert rel_err(zu, layer(u, ei, w)) < 1e-12


@pytest.mark.parametrize("laplacian", ["neural", "sym"])
def test_torch_func_on_the_user_path(laplacian):
    """torch.func.jvp and jacrev of ``layer(u, edge_index)`` exactly as the issue writes
    them (the graph built and cached from edge_index inside the transform)."""
    x, ei, w, _ = _graph("symmetric", n=5, d=2)
    layer = _layer(laplacian, "cg", d=2)
    t = torch.ones_like(x)
    _, dz = torch.func.jvp(lambda u: layer(u, ei, w), (x,), (t,))
    _, want = torch.func.jvp(_dense(layer, ei, w), (x,), (t,))
    assert rel_err(dz, want) < 1e-9
    assert rel_err(torch.func.jacrev(lambda u: layer(u, ei, w))(x),
                   torch.func.jacrev(_dense(layer, ei, w))(x)) < 1e-9


# ------------------------------------------------------------- the first-order path --

def test_plain_backward_runs_the_backward_op(monkeypatch):
    """A plain backward (create_graph=False) stays on the backward op: the differentiable
    composition of the second derivatives runs only when the backward is differentiated."""
    from dignn_kernels.solvers import op as solve_op
    x, ei, w, g = _graph("symmetric")
    layer = _layer("neural", "cg")
    calls = []
    real = solve_op._transposed_adjoint
    monkeypatch.setattr(solve_op, "_transposed_adjoint",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    xr = x.clone().requires_grad_()
    layer(xr, g).sum().backward()
    assert not calls and xr.grad is not None
    (gx,) = torch.autograd.grad(layer(xr, g).sum(), xr, create_graph=True)
    assert calls and gx.requires_grad
