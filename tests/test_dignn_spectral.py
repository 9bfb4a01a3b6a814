"""dignn.spectral: lambda_max(Delta) by power iteration on the fused op against a dense
eigenvalue solve, the mu warning, and the residual curve of the fixed-point iteration."""
import warnings

import pytest
import torch

import dignn_kernels as dk
from conftest import make_graph, make_layer, thetas
from dignn_kernels import reference
from dignn.spectral import (MuBelowSpectrumWarning, apply_laplacian, check_mu,
                            estimate_lambda_max, fixed_point_residuals, laplacian_operator)


def dense_delta(layer, x, ei, w=None):
    return reference.dense_laplacian(x.double(), ei, w, laplacian=layer.laplacian,
                                     eps=layer.eps, **{k: v.detach().double() for k, v in
                                                       thetas(layer).items()})


@pytest.mark.parametrize("laplacian", ["neural", "rw"])
@pytest.mark.parametrize("kind", ["symmetric", "weighted", "isolated", "zero_rows"])
def test_apply_laplacian_matches_dense(kind, laplacian):
    x, ei, w = make_graph(kind, n=30, d=5)
    layer = make_layer(5, laplacian, scale=1.0)
    v = torch.randn(30, 3, dtype=torch.float64)
    op = laplacian_operator(layer, x, ei, w)
    torch.testing.assert_close(apply_laplacian(op, v), dense_delta(layer, x, ei, w) @ v,
                               rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("laplacian", ["neural", "rw"])
def test_laplacian_operator_follows_the_layers_flow(laplacian):
    """A layer with flow="target_to_source" solves on the graph read at edge_index[0]: the
    spectral checks must measure that Delta, the default one's on edge_index.flip(0)."""
    x, ei, w = make_graph("weighted", n=30, d=5)
    directed = ei[:, ei[0] < ei[1]]  # one direction of each edge: a directed graph
    w = w[ei[0] < ei[1]]
    layer = make_layer(5, laplacian, scale=1.0)
    layer.flow = "target_to_source"
    v = torch.randn(30, 3, dtype=torch.float64)
    got = apply_laplacian(laplacian_operator(layer, x, directed, w), v)
    torch.testing.assert_close(got, dense_delta(layer, x, directed.flip(0), w) @ v,
                               rtol=1e-10, atol=1e-12)
    assert (got - dense_delta(layer, x, directed, w) @ v).abs().max() > 1e-3


@pytest.mark.parametrize("laplacian, scale", [("neural", 0.4), ("neural", 1.5),
                                              ("neural", 4.0), ("rw", 1.0)])
@pytest.mark.parametrize("kind", ["symmetric", "weighted", "isolated"])
def test_lambda_max_matches_dense_eigenvalue(kind, laplacian, scale):
    x, ei, w = make_graph(kind, n=40, d=6, seed=1)
    layer = make_layer(6, laplacian, scale=scale)
    eig = torch.linalg.eigvals(dense_delta(layer, x, ei, w))
    assert eig.imag.abs().max() < 1e-8  # similar to a symmetric matrix: real spectrum
    exact = float(eig.real.max())
    est = estimate_lambda_max(laplacian_operator(layer, x, ei, w), num_iter=200)
    assert est.symmetric
    assert est.lambda_max <= exact * (1 + 1e-9)  # a Rayleigh quotient: a lower bound
    assert est.lambda_max == pytest.approx(exact, rel=1e-3)


def test_lambda_max_directed_graph():
    x, ei, w = make_graph("directed", n=40, d=6)
    layer = make_layer(6, "neural", scale=1.5)
    radius = float(torch.linalg.eigvals(dense_delta(layer, x, ei)).abs().max())
    est = estimate_lambda_max(laplacian_operator(layer, x, ei), num_iter=300)
    assert not est.symmetric
    assert est.lambda_max == pytest.approx(radius, rel=0.1)


def test_lambda_max_of_empty_and_edgeless_graphs():
    layer = make_layer(3, "neural")
    x = torch.randn(5, 3, dtype=torch.float64)
    est = estimate_lambda_max(laplacian_operator(layer, x, torch.empty(2, 0, dtype=torch.long)))
    assert est.lambda_max == 0.0
    with pytest.raises(ValueError, match="num_iter"):
        estimate_lambda_max(laplacian_operator(layer, x, torch.empty(2, 0, dtype=torch.long)),
                            num_iter=0)


def _bipartite_rw():
    """A 6-cycle: bipartite, so the random-walk Laplacian's lambda_max is exactly 2."""
    src = torch.arange(6)
    ei = torch.stack([src, (src + 1) % 6])
    return torch.randn(6, 3), torch.cat([ei, ei.flip(0)], 1)


def test_warns_when_mu_at_most_lambda_max():
    x, ei = _bipartite_rw()
    layer = dk.FusedImplicitDiffusion(3, mu=1.5, laplacian="rw")
    with pytest.warns(MuBelowSpectrumWarning, match=r"mu = 1.5 <= lambda_max.*~ 2"):
        est = check_mu(layer, x, ei, where="unit test")
    assert est.lambda_max == pytest.approx(2.0, rel=1e-4)
    # and with mu above lambda_max: silent
    layer = dk.FusedImplicitDiffusion(3, mu=2.2, laplacian="rw")
    with warnings.catch_warnings():
        warnings.simplefilter("error", MuBelowSpectrumWarning)
        check_mu(layer, x, ei)


def test_warning_is_not_a_false_alarm_on_divergence():
    """When the warning fires, the iteration really does not settle; when it does not fire,
    the residuals fall like (lambda_max / mu)^t."""
    x, ei, w = make_graph("symmetric", n=40, d=6, seed=2)
    layer = make_layer(6, "neural", scale=4.0)
    lam = estimate_lambda_max(laplacian_operator(layer, x, ei), num_iter=200).lambda_max
    assert lam > 0.1
    layer.mu = 0.5 * lam
    with pytest.warns(MuBelowSpectrumWarning):
        check_mu(layer, x, ei)
    diverging = fixed_point_residuals(layer, x, ei, 60)
    assert diverging[-1] > diverging[0]
    layer.mu = 2.0 * lam
    converging = fixed_point_residuals(layer, x, ei, 30)
    ratio = (converging[-1] / converging[-11]) ** (1 / 10)
    assert ratio == pytest.approx(0.5, rel=0.05)  # the rate lambda_max / mu


def test_residuals_match_the_layer():
    x, ei, w = make_graph("weighted", n=30, d=5)
    layer = make_layer(5, "neural", max_iter=7, tol=0.0)
    curve = fixed_point_residuals(layer, x, ei, 7, edge_weight=w)
    layer(x, ei, w)
    assert layer.iterations == 7
    assert curve[-1] == pytest.approx(layer.residual, rel=1e-8)
    assert curve[0] == pytest.approx(float(x.norm()), rel=1e-12)  # Z_1 = X from Z_0 = 0


class _NoCompiledOps:
    """Stands for a device the compiled extension has no kernels for (a GPU with a CPU-only
    build): every torch.ops.dignn call fails, as the dispatcher's would."""

    def __getattr__(self, name):
        raise RuntimeError(f"no kernel for dignn::{name} on this device")


@pytest.mark.parametrize("laplacian", ["neural", "rw"])
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_spectral_checks_run_on_the_layers_backend(monkeypatch, laplacian, backend):
    """lambda_max and the residual curve are computed with the passes of the backend the layer
    runs on, never with the compiled ops behind its back."""
    if backend not in dk.available_backends(torch.device("cpu")):
        pytest.skip(f"{backend} does not run here")
    x, ei, w = make_graph("weighted", n=30, d=5)
    layer = make_layer(5, laplacian, scale=1.0, backend=backend)
    want_op = laplacian_operator(make_layer(5, laplacian, scale=1.0), x, ei, w)
    want = estimate_lambda_max(want_op).lambda_max
    monkeypatch.setattr(dk.ops, "_ops", _NoCompiledOps())
    op = laplacian_operator(layer, x, ei, w)
    assert op.backend == backend
    assert estimate_lambda_max(op).lambda_max == pytest.approx(want, rel=1e-9)
    assert len(fixed_point_residuals(layer, x, ei, 3, w)) == 3
