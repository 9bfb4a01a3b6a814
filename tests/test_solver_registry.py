"""The solver registry (dignn_kernels.solvers.registry): a solver written here, in a few lines,
registered by name, runs everywhere the built-in ones do (the layer forward and backward, the
op, a partitioned graph's solve) and gives the dense float64 equilibrium; the registry's
lookups and checks. What docs/internals/adding-a-solver.md says a new solver takes: one file
(here, the solver below) and its tests."""
import math

import pytest
import torch

import dignn_kernels as dk
from dignn_kernels import reference
from dignn_kernels.distributed import DistributedGraph, partition
from dignn_kernels.solvers import SOLVERS, SolveResult, get_solver, register_solver
from dignn_kernels.solvers.common import global_norm
from dignn_kernels.solvers.registry import check_solver_storage, solver_names
from conftest import make_graph, make_layer, rel_err, thetas

OMEGA = 0.5  # damping: converges while lambda_max(Delta) / mu < 2 / OMEGA - 1 = 3


@register_solver("damped_richardson")
def damped_richardson(system, rhs, *, adjoint, max_iter, tol, check_every, window, callback,
                      storage_dtype):
    """z <- z + OMEGA (step(z) - z) from z = 0: Richardson's iteration on (I + Delta/mu) z =
    rhs (or its adjoint), whose residual step(z) - z = rhs - z - Delta z / mu is the
    equation's; until ||residual|| <= tol ||rhs|| (the norms over every process's rows)."""
    step = system.adjoint_step if adjoint else system.step
    ref = global_norm(rhs, system.reduce)
    ref_safe = ref.clamp_min(torch.finfo(torch.float64).tiny)
    history = torch.full((max_iter + 1,), math.nan, dtype=torch.float64)
    z, f, res, sweeps = torch.zeros_like(rhs), rhs, ref, 0
    history[0] = res / ref_safe
    while sweeps < max_iter and not bool(res <= tol * ref):
        z = z + OMEGA * f
        f = step(z, rhs) - z
        res = global_norm(f, system.reduce)
        sweeps += 1
        history[sweeps] = res / ref_safe
        if callback is not None:
            callback(sweeps)
    return SolveResult(z, history, torch.tensor(sweeps), res, res / ref_safe,
                       ~torch.isfinite(res))


def test_the_built_in_solvers_come_from_the_registry():
    assert SOLVERS == ("fixed_point", "cg", "anderson") == dk.SOLVERS
    assert solver_names()[:3] == SOLVERS and "damped_richardson" in solver_names()
    assert get_solver("cg").spd and not get_solver("anderson").spd
    assert get_solver("fixed_point").storage_dtype and not get_solver("cg").storage_dtype
    assert get_solver("damped_richardson").solve is damped_richardson


@pytest.mark.parametrize("laplacian", ["neural", "rw"])
@pytest.mark.parametrize("kind", ["symmetric", "directed", "zero_rows"])
def test_a_registered_solver_runs_the_layer_forward_and_backward(kind, laplacian):
    """The layer with solver="damped_richardson": z and every gradient (x and the Θ
    matrices: the adjoint solve, the chi and gradient-pass terms) against autograd through
    the dense float64 solve."""
    x, ei, w = make_graph(kind)
    layer = make_layer(x.size(1), laplacian, solver="damped_richardson", max_iter=400,
                       tol=1e-13)
    weight = torch.randn(x.shape, generator=torch.Generator().manual_seed(1),
                         dtype=torch.float64)
    xr = x.clone().requires_grad_()
    z = layer(xr, ei, w)
    (z * weight).sum().backward()
    assert layer.solver_used == "damped_richardson"
    assert 0 < layer.iterations < 400 and 0 < layer.backward_iterations < 400
    assert layer.relative_residual <= 1e-13

    xd = x.clone().requires_grad_()
    params = {k: v.detach().clone().requires_grad_() for k, v in thetas(layer).items()}
    want, _ = reference.dense_equilibrium(xd, ei, w, laplacian=laplacian, mu=layer.mu,
                                          eps=layer.eps, **params)
    (want * weight).sum().backward()
    assert rel_err(z, want) < 1e-11
    assert rel_err(xr.grad, xd.grad) < 1e-10
    for name, p in params.items():
        assert rel_err(getattr(layer, name).weight.grad, p.grad) < 1e-10, name


def test_a_registered_solver_converges_where_the_fixed_point_diverges():
    """At mu = 1 on a 6-cycle (rw: lambda_max(Delta) = 2 > mu) the paper's iteration diverges;
    the damped one converges (rate 1/2) to the dense solve."""
    n = 6
    ring = torch.arange(n)
    ei = torch.stack([torch.cat([ring, (ring + 1) % n]), torch.cat([(ring + 1) % n, ring])])
    x = torch.randn(n, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    with pytest.warns(dk.DivergenceWarning):
        dk.FusedImplicitDiffusion(3, mu=1.0, laplacian="rw", solver="fixed_point",
                                  max_iter=200)(x, ei)
    layer = dk.FusedImplicitDiffusion(3, mu=1.0, laplacian="rw", solver="damped_richardson",
                                      max_iter=200, tol=1e-12)
    want, _ = reference.dense_equilibrium(x, ei, laplacian="rw", mu=1.0)
    assert rel_err(layer(x, ei), want) < 1e-11


def test_a_registered_solver_runs_through_the_op():
    """implicit_diffusion (the custom op and its autograd) with the registered solver."""
    x, ei, w = make_graph("weighted")
    g = dk.build_graph(ei, x.size(0), w)
    wf, chi, kappa = g.fixed_laplacian("rw", x.dtype)
    xr = x.clone().requires_grad_()
    z, stats = dk.solvers.implicit_diffusion(g.rowptr, g.col, wf, xr, chi, None, None, kappa,
                                             mu=2.2, max_iter=300, tol=1e-13,
                                             solver="damped_richardson")
    z.sum().backward()
    want, delta = reference.dense_equilibrium(x, ei, w, laplacian="rw", mu=2.2)
    assert rel_err(z, want) < 1e-11 and float(stats[3]) == 0.0
    # dl/dx = (I + Delta/mu)^-T 1
    eye = torch.eye(x.size(0), dtype=torch.float64)
    grad = torch.linalg.solve((eye + delta / 2.2).T, torch.ones_like(x))
    assert rel_err(xr.grad, grad) < 1e-10


def test_a_registered_solver_runs_on_a_partitioned_graph(world_of_one):
    """On a DistributedGraph the solver's norms go through the system's reduce (here the
    all-reduce of a world of one): forward and backward equal the whole graph's."""
    x, ei, w = make_graph("weighted", n=30, d=4)
    layer = make_layer(4, "neural", solver="damped_richardson", max_iter=300, tol=1e-13)
    graph = DistributedGraph(partition(ei, 30, 1, edge_weight=w))
    xr = x[graph.owned].clone().requires_grad_()
    z = layer(xr, graph)
    z.square().sum().backward()
    grads = [p.grad.clone() for p in layer.parameters()]
    layer.zero_grad()
    xw = x.clone().requires_grad_()
    zw = layer(xw, ei, w)
    zw.square().sum().backward()
    assert rel_err(z, zw[graph.owned]) < 1e-12
    assert rel_err(xr.grad, xw.grad[graph.owned]) < 1e-10
    for got, p in zip(grads, layer.parameters()):
        assert rel_err(got, p.grad) < 1e-10


def test_the_registry_refuses_bad_names_and_storage():
    with pytest.raises(ValueError, match=r"solver must be one of .*'damped_richardson'.*"
                                         r"got 'gmres'"):
        get_solver("gmres")
    with pytest.raises(ValueError, match=r"solver must be one of .*got 'gmres'"):
        dk.FusedImplicitDiffusion(4, solver="gmres")
    with pytest.raises(ValueError, match="'damped_richardson' is registered already"):
        register_solver("damped_richardson")
    for bad in ("", None, 3):
        with pytest.raises(ValueError, match="non-empty string"):
            register_solver(bad)
    with pytest.raises(ValueError, match="device_check_every must be an integer >= 1"):
        register_solver("another", device_check_every=0)
    assert "another" not in solver_names()
    # storage_dtype: the solvers registered with storage_dtype=True only, one check for the
    # layer, the op and the solvers' entry
    check_solver_storage("damped_richardson", None)
    check_solver_storage("fixed_point", torch.bfloat16)
    message = r"storage_dtype=torch.bfloat16 runs with solver='fixed_point' only"
    with pytest.raises(ValueError, match=message):
        dk.FusedImplicitDiffusion(4, solver="damped_richardson", storage_dtype=torch.bfloat16)
    x, ei, w = make_graph("weighted")
    g = dk.build_graph(ei, x.size(0), w)
    wf, chi, kappa = g.fixed_laplacian("rw", x.dtype)
    with pytest.raises(ValueError, match=message):
        dk.solvers.implicit_diffusion(g.rowptr, g.col, wf, x.float(), chi.float(), None, None,
                                      kappa.float(), mu=2.2, solver="damped_richardson",
                                      storage_dtype=torch.bfloat16)
    system = dk.solvers.EquilibriumSystem(dk.backends.get_backend("torch"), g.rowptr, g.col,
                                          wf, chi, kappa, 2.2)
    with pytest.raises(ValueError, match=message):
        dk.solvers.solve_forward(system, x, "damped_richardson", max_iter=3, tol=0.0,
                                 storage_dtype=torch.bfloat16)
