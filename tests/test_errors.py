"""Bad input gets a clear exception that names the argument and the fix."""
import math

import pytest
import torch

import dignn_kernels as dk
from conftest import make_graph


@pytest.fixture
def graph():
    x, ei, w = make_graph("weighted", n=20, d=4, dtype=torch.float32)
    return x, ei, w


def layer4(**kw):
    return dk.FusedImplicitDiffusion(4, **kw)


@pytest.mark.parametrize("kwargs,match", [
    (dict(mu=0.0), "mu must be a finite number > 0"),
    (dict(mu=-1.0), "mu must be a finite number > 0"),
    (dict(mu=math.inf), "mu must be a finite number > 0"),
    (dict(mu=math.nan), "mu must be a finite number > 0"),
    (dict(max_iter=0), "max_iter must be an integer >= 1"),
    (dict(max_iter=2.5), "max_iter must be an integer >= 1"),
    (dict(tol=-1e-3), "tol must be a finite number >= 0"),
    (dict(eps=0.0), "eps must be a finite number > 0"),
    (dict(laplacian="normalized"), "laplacian must be one of"),
    (dict(backend="gpu"), "backend must be one of"),
    (dict(metric_channels=0), "metric_channels must be an integer >= 1"),
])
def test_constructor_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        layer4(**kwargs)


def test_in_channels_must_be_positive():
    with pytest.raises(ValueError, match="in_channels must be an integer >= 1"):
        dk.FusedImplicitDiffusion(0)


def test_index_out_of_range(graph):
    x, ei, w = graph
    bad = ei.clone()
    bad[1, 3] = 20
    with pytest.raises(IndexError, match=r"edge_index holds node index 20 but x has 20 nodes "
                                         r"\(valid indices are 0..19\)"):
        layer4()(x, bad, w)
    bad[1, 3] = -1
    with pytest.raises(IndexError, match="node index -1"):
        layer4()(x, bad, w)


@pytest.mark.parametrize("mutate,exc,match", [
    (lambda x, ei, w: (x[:, :3], ei, w), ValueError, r"x must have shape \[num_nodes, 4\]"),
    (lambda x, ei, w: (x[0], ei, w), ValueError, r"x must have shape"),
    (lambda x, ei, w: (x.long(), ei, w), TypeError, "x must be a floating tensor"),
    (lambda x, ei, w: (x.tolist(), ei, w), TypeError, "x must be a torch.Tensor"),
    (lambda x, ei, w: (x, ei.t(), w), ValueError, r"edge_index must have shape \[2, num_edges\]"),
    (lambda x, ei, w: (x, ei.float(), w), TypeError, "edge_index must hold int64"),
    (lambda x, ei, w: (x, ei.tolist(), w), TypeError, "edge_index must be a torch.Tensor"),
    (lambda x, ei, w: (x, ei, w[:-1]), ValueError, r"edge_weight must have shape \["),
    (lambda x, ei, w: (x, ei, w.long()), TypeError, "edge_weight must be a floating tensor"),
])
def test_wrong_shapes_and_dtypes(graph, mutate, exc, match):
    with pytest.raises(exc, match=match):
        layer4()(*mutate(*graph))


def test_negative_edge_weights(graph):
    x, ei, w = graph
    w = w.clone()
    w[5] = -0.5
    with pytest.raises(ValueError, match="edge_weight must be >= 0"):
        layer4()(x, ei, w)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_features(graph, value):
    x, ei, w = graph
    x = x.clone()
    x[2, 1] = value
    with pytest.raises(ValueError, match="x contains NaN or Inf"):
        layer4()(x, ei, w)


def test_non_finite_edge_weights(graph):
    x, ei, w = graph
    w = w.clone()
    w[0] = math.nan
    with pytest.raises(ValueError, match="edge_weight contains NaN or Inf"):
        layer4()(x, ei, w)


def test_edge_weight_requiring_grad(graph):
    x, ei, w = graph
    with pytest.raises(ValueError, match=r"pass edge_weight.detach\(\)"):
        layer4()(x, ei, w.clone().requires_grad_())


def test_tensors_on_different_devices(graph):
    x, ei, w = graph
    with pytest.raises(ValueError, match="x is on cpu but the graph is on meta"):
        layer4()(x, ei.to("meta"), w)
    with pytest.raises(ValueError, match="edge_weight is on meta but edge_index is on cpu"):
        layer4()(x, ei, w.to("meta"))
    with pytest.raises(ValueError, match=r"layer's parameters are on meta.*layer.to\('cpu'\)"):
        layer4().to("meta")(x, ei, w)


def test_unavailable_backend(graph):
    x, ei, w = graph
    with pytest.raises(RuntimeError, match="backend='cuda' cannot run on cpu"):
        layer4(backend="cuda")(x, ei, w)


def test_sparse_adjacency_mismatch(graph):
    x, ei, w = graph
    adj = torch.sparse_coo_tensor(ei.flip(0), w, (21, 21), check_invariants=True)
    with pytest.raises(ValueError, match=r"the sparse adjacency has shape \[21, 21\] but x has 20"):
        layer4()(x, adj)
    adj = torch.sparse_coo_tensor(ei.flip(0), w, (20, 20), check_invariants=True)
    with pytest.raises(ValueError, match="edge_weight must be None when the graph is a sparse"):
        layer4()(x, adj, w)


def test_gradient_of_cached_weights_is_refused(graph):
    """w and kappa come out of the op as caches, marked non-differentiable."""
    x, ei, w = graph
    g = dk.build_graph(ei, 20, w)
    a, deg = g.values(torch.float32)
    p = torch.randn(20, 3, requires_grad=True)
    chi = deg.clone()
    _, w_out, _, _ = torch.ops.dignn.implicit_solve(
        g.rowptr, g.col, a, x, chi, p, p, None, None, None, None, None, 2.0, 1e-6, 3, 0.0,
        "fixed_point", "cpu", -1, 5)
    assert not w_out.requires_grad


def test_non_contiguous_inputs_just_work(graph):
    x, ei, w = graph
    layer = layer4()
    want = layer(x, ei, w)
    x_nc = torch.cat([x, x], dim=1)[:, :4]
    ei_nc = torch.stack([ei[0], ei[1]], dim=1).t()
    w_nc = torch.stack([w, w], dim=1)[:, 0]
    assert not (x_nc.is_contiguous() or ei_nc.is_contiguous() or w_nc.is_contiguous())
    assert torch.equal(layer(x_nc, ei_nc, w_nc), want)


def _adjacency(layout, values=None, n=4):
    """The adj_t of a 4-cycle (entry (target, source)) in ``layout``, its values ``values``."""
    dense = torch.zeros(n, n)
    dense[[1, 2, 3, 0], [0, 1, 2, 3]] = 1.0
    if values is not None:
        dense[dense != 0] = values
    return {"coo": dense.to_sparse, "csr": dense.to_sparse_csr, "csc": dense.to_sparse_csc,
            "bsr": lambda: dense.to_sparse_bsr(2), "bsc": lambda: dense.to_sparse_bsc(2)}[layout]()


SPARSE = ["coo", "csr", "csc", "bsr", "bsc"]


@pytest.mark.parametrize("layout", SPARSE)
@pytest.mark.parametrize("bad,exc,match", [
    (math.nan, ValueError, r"the sparse adjacency's values contains NaN or Inf"),
    (-1.0, ValueError, r"the sparse adjacency's values must be >= 0"),
    ("nodes", ValueError, r"the sparse adjacency has shape \[4, 4\] but x has 6 nodes"),
    ("flow", ValueError, r"flow='target_to_source' is invalid for a torch sparse tensor"),
    ("weight", ValueError, "edge_weight must be None when the graph is a sparse tensor"),
])
def test_sparse_layouts_refused(layout, bad, exc, match):
    """Every sparse layout is checked as the COO one is, naming its values and the fix."""
    n = 6 if bad == "nodes" else 4
    adj = _adjacency(layout, bad if isinstance(bad, float) else None)
    x = torch.randn(n, 4)
    layer = layer4(flow="target_to_source") if bad == "flow" else layer4()
    with pytest.raises(exc, match=match):
        layer(x, adj, torch.ones(4) if bad == "weight" else None)


@pytest.mark.parametrize("make,exc,match", [
    (lambda: torch.zeros(4, 4).to_mkldnn(), TypeError,
     r"tensor of layout torch._mkldnn, which holds no graph: pass edge_index .* or a sparse "
     r"adjacency of one of the layouts"),
    (lambda: torch.sparse_csr_tensor(torch.tensor([[0, 1, 2, 3, 4]] * 2),
                                     torch.tensor([[1, 2, 3, 0]] * 2), torch.ones(2, 4),
                                     (2, 4, 4), check_invariants=True), ValueError,
     r"the sparse adjacency \(torch.sparse_csr\) must be 2-D \[num_nodes, num_nodes\], got "
     r"shape \[2, 4, 4\]"),
    (lambda: torch.stack([_adjacency("coo")] * 2), ValueError,
     r"the sparse adjacency \(torch.sparse_coo\) must be 2-D"),
    (lambda: torch.sparse_coo_tensor(torch.tensor([[1, 2], [0, 1]]), torch.ones(2, 3),
                                     (4, 4, 3), check_invariants=True), ValueError,
     r"must hold one scalar per edge, but it has 1 dense dimension"),
    (lambda: torch.sparse_csr_tensor(torch.tensor([0, 2, 1, 3, 4]),
                                     torch.tensor([1, 2, 0, 3]), torch.ones(4), (4, 4),
                                     check_invariants=False), ValueError,
     r"the sparse adjacency's crow_indices must be non-decreasing offsets from 0 to its 4 "
     r"entries"),
    (lambda: torch.sparse_csc_tensor(torch.tensor([0, 1, 2, 3, 5]),
                                     torch.tensor([1, 2, 3, 0]), torch.ones(4), (4, 4),
                                     check_invariants=False), ValueError,
     r"the sparse adjacency's ccol_indices must be non-decreasing offsets from 0 to its 4"),
    (lambda: torch.sparse_csc_tensor(torch.tensor([0, 1, 2, 3, 4]),
                                     torch.tensor([1, 2, 9, 0]), torch.ones(4), (4, 4),
                                     check_invariants=False), IndexError,
     r"the sparse adjacency holds row index 9 but x has 4 nodes"),
    (lambda: _adjacency("bsc").requires_grad_(), ValueError,
     r"the sparse adjacency's values requires grad.*adj.detach\(\)"),
])
def test_sparse_adjacency_malformed(make, exc, match):
    """A sparse tensor that holds no graph, a batch, dense dimensions, malformed compressed
    indices (torch checks none of them unless asked), or values requiring grad: an error
    naming what is wrong, never another graph or a kernel's index error."""
    with pytest.raises(exc, match=match):
        layer4()(torch.randn(4, 4), make())
