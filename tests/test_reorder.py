"""Locality reordering (``reorder=``): every order is a permutation, it finds the structure the
ids hide, and it is transparent: outputs and gradients equal the unreordered layer's and the
dense float64 solve, in the caller's node order."""
import pytest
import torch

import dignn_kernels as dk
from dignn_kernels import reference
from dignn_kernels.reorder import REORDERINGS, locality_cost, node_order
from dignn_kernels.synthetic import block_model_graph
from conftest import make_graph, make_layer, rel_err, thetas

ORDERS = [r for r in REORDERINGS if r != "none"]


def _band(graph):
    rows = dk.graph.csr_rows(graph.rowptr, graph.num_edges)
    return int((rows - graph.col.long()).abs().max())


@pytest.mark.parametrize("reorder", ORDERS)
@pytest.mark.parametrize("kind", ["symmetric", "directed", "isolated", "self_loops", "batch",
                                  "single_node", "empty"])
def test_order_is_a_permutation_and_the_graph_is_relabelled(kind, reorder):
    x, ei, w = make_graph(kind, n=30)
    n = x.size(0)
    plain = dk.build_graph(ei, n, w)
    graph = dk.build_graph(ei, n, w, reorder=reorder)
    if graph.order is None:
        assert graph.reorder == "none" and graph.position is None
        return
    assert torch.equal(torch.sort(graph.order).values, torch.arange(n))
    assert torch.equal(graph.position[graph.order], torch.arange(n))
    # entry (i, j) of the new CSR is entry (order[i], order[j]) of the old one, same value
    dense = torch.zeros(n, n, dtype=plain.value.dtype)
    dense[dk.graph.csr_rows(plain.rowptr, plain.num_edges), plain.col.long()] = plain.value
    new = torch.zeros_like(dense)
    new[dk.graph.csr_rows(graph.rowptr, graph.num_edges), graph.col.long()] = graph.value
    assert torch.equal(new, dense[graph.order][:, graph.order])
    assert graph.symmetric == plain.symmetric
    assert torch.equal(graph.degree, plain.degree[graph.order])


def test_rcm_recovers_a_shuffled_path():
    n = 200
    path = torch.stack([torch.arange(n - 1), torch.arange(1, n)])
    path = torch.cat([path, path.flip(0)], dim=1)
    shuffled = torch.randperm(n, generator=torch.Generator().manual_seed(0))[path]
    assert _band(dk.build_graph(shuffled, n)) > 50
    assert _band(dk.build_graph(shuffled, n, reorder="rcm")) == 1


def test_community_order_recovers_hidden_blocks_and_auto_takes_it():
    n = 4000
    ei = block_model_graph(n, 40_000, block_size=200, inside=0.95, seed=3)
    shuffled_cost = locality_cost(*_csr(ei, n))
    ordered = dk.build_graph(ei, n, reorder="community")
    assert locality_cost(ordered.rowptr, ordered.col) < 0.6 * shuffled_cost
    unshuffled = block_model_graph(n, 40_000, block_size=200, inside=0.95, seed=3,
                                   shuffle=False)
    planted = locality_cost(*_csr(unshuffled, n))
    assert locality_cost(ordered.rowptr, ordered.col) < 1.15 * planted
    auto = dk.build_graph(ei, n, reorder="auto")
    assert auto.reorder != "none"
    assert locality_cost(auto.rowptr, auto.col) <= locality_cost(ordered.rowptr, ordered.col)


def test_auto_keeps_ids_that_are_already_local():
    n = 4000
    ei = block_model_graph(n, 40_000, block_size=200, inside=0.95, seed=3, shuffle=False)
    order, method = node_order(*_csr(ei, n), n, "auto")
    assert order is None and method == "none"
    assert dk.build_graph(ei, n, reorder="auto").order is None


def _csr(ei, n):
    g = dk.build_graph(ei, n)
    return g.rowptr, g.col


CASES = [("neural", "symmetric", "fixed_point", "cpu"), ("neural", "directed", "anderson", "cpu"),
         ("neural", "isolated", "cg", "cpu"), ("rw", "weighted", "fixed_point", "cpu"),
         ("sym", "self_loops", "cg", "torch"), ("neural", "zero_rows", "fixed_point", "torch"),
         ("neural", "batch", "fixed_point", "torch")]


@pytest.mark.parametrize("reorder", ORDERS)
@pytest.mark.parametrize("laplacian,kind,solver,backend", CASES)
def test_reordered_layer_equals_the_plain_one(laplacian, kind, solver, backend, reorder):
    x, ei, w = make_graph(kind, n=36, d=4)
    x.requires_grad_()
    g = torch.randn(x.shape, generator=torch.Generator().manual_seed(1), dtype=x.dtype)
    results = []
    for r in ("none", reorder):
        layer = make_layer(4, laplacian, max_iter=300, tol=1e-13, solver=solver,
                           backend=backend, reorder=r)
        z = layer(x, ei, w)
        grads = torch.autograd.grad(z, [x] + list(layer.parameters()), g)
        results.append((z, grads))
    (z0, g0), (z1, g1) = results
    assert rel_err(z1, z0) < 1e-10
    for a, b in zip(g1, g0):
        assert rel_err(a, b) < 1e-9
    # and both are the equilibrium, in the caller's order
    dense, _ = reference.dense_equilibrium(x.detach(), ei, w, laplacian=laplacian,
                                           mu=layer.mu, eps=layer.eps, **thetas(layer))
    assert rel_err(z1, dense) < 1e-9


def test_reordered_gradcheck():
    x, ei, w = make_graph("directed", n=14, d=3)
    layer = make_layer(3, "neural", h=3, max_iter=400, tol=1e-14, solver="anderson",
                       reorder="rcm")
    x.requires_grad_()
    assert torch.autograd.gradcheck(lambda x, *p: layer(x, ei, w), (x, *layer.parameters()),
                                    eps=1e-6, atol=1e-6, rtol=1e-5)


def test_cache_keeps_one_graph_per_order():
    x, ei, _ = make_graph("symmetric", n=30)
    a = dk.cached_graph(ei, 30, reorder="rcm")
    assert dk.cached_graph(ei, 30, reorder="rcm") is a
    b = dk.cached_graph(ei, 30)
    assert b is not a and b.order is None and a.reorder == "rcm"


def test_prebuilt_graph_carries_its_order():
    x, ei, _ = make_graph("symmetric", n=30, d=4)
    layer = make_layer(4, max_iter=200, tol=1e-13)
    graph = dk.build_graph(ei, 30, reorder="degree")
    assert rel_err(layer(x, graph), layer(x, ei)) < 1e-10
    assert torch.equal(graph.to_user_order(graph.to_graph_order(x)), x)


@pytest.mark.parametrize("bad", ["RCM", "metis", 3, True])
def test_bad_reorder_is_named(bad):
    x, ei, _ = make_graph("symmetric", n=10)
    with pytest.raises(ValueError, match="reorder must be one of"):
        dk.FusedImplicitDiffusion(5, reorder=bad)
    with pytest.raises(ValueError, match="reorder must be one of"):
        dk.build_graph(ei, 10, reorder=bad)
    with pytest.raises(ValueError, match="reorder must be one of"):
        dk.cached_graph(ei, 10, reorder=bad)
