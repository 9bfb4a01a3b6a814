"""dignn models: shapes, forward and backward of every input unit and Laplacian, batched graph
classification, and clear errors on bad input."""
import pytest
import torch

from dignn.data import csbm
from dignn.models import DIGNNGraphClassifier, DIGNNNodeClassifier, adjacency_matrix


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def small():
    return csbm(num_nodes=120, num_classes=3, num_features=10, avg_degree=6, num_splits=2)


def _node_model(data, unit, laplacian, **kw):
    torch.manual_seed(0)
    return DIGNNNodeClassifier(data.num_features, 16, data.num_classes, input_unit=unit,
                               num_nodes=data.num_nodes, laplacian=laplacian, mu=2.2,
                               max_iter=8, dropout=0.3, **kw)


@pytest.mark.parametrize("laplacian", ["neural", "rw"])
@pytest.mark.parametrize("unit", ["mlp", "adj", "linkx"])
def test_node_forward_backward(small, unit, laplacian):
    model = _node_model(small, unit, laplacian)
    logits = model(small.x, small.edge_index)
    assert logits.shape == (small.num_nodes, small.num_classes)
    assert torch.isfinite(logits).all()
    loss = torch.nn.functional.cross_entropy(logits, small.y)
    loss.backward()
    grads = {name: p.grad for name, p in model.named_parameters()}
    assert all(g is not None and torch.isfinite(g).all() for g in grads.values()), \
        [n for n, g in grads.items() if g is None]
    # the implicit layer really ran and was differentiated through
    assert model.diffusion.iterations >= 1
    assert model.diffusion.backward_iterations >= 1
    if laplacian == "neural":
        assert grads["diffusion.theta_chi.weight"].abs().sum() > 0
    assert grads["lin_in.weight"].abs().sum() > 0
    if unit == "linkx":
        assert grads["linkx.lin_a.weight"].abs().sum() > 0


@pytest.mark.parametrize("unit", ["mlp", "linkx"])
def test_sparse_features_match_dense(small, unit):
    """One-hot facebook100 features are kept sparse; the model must give the same logits."""
    model = _node_model(small, unit, "neural").eval()
    x_dense = (small.x > 1.0).float()  # a mostly-zero 0/1 matrix
    with torch.no_grad():
        dense = model(x_dense, small.edge_index)
        sparse = model(x_dense.to_sparse(), small.edge_index)
    torch.testing.assert_close(sparse, dense, rtol=1e-5, atol=1e-5)


def test_adj_input_is_a_times_x(small):
    """The "adj" input unit feeds A X (row i sums the features of i's neighbours)."""
    model = _node_model(small, "adj", "rw", ).eval()
    with torch.no_grad():
        ax = model._graph_features(small.x, small.edge_index)
    expected = torch.zeros_like(small.x).index_add_(0, small.edge_index[1],
                                                    small.x[small.edge_index[0]])
    torch.testing.assert_close(ax, expected, rtol=1e-5, atol=1e-5)
    # cached while the same tensors come back, rebuilt for a new graph
    assert model._graph_features(small.x, small.edge_index) is ax
    other = small.edge_index[:, : small.edge_index.size(1) // 2].clone()
    assert model._graph_features(small.x, other) is not ax


def _write_data(t):
    t.data.view(-1)[0] += 1


def _write_numpy(t):
    t.numpy().reshape(-1)[0] += 1


def _write_set(t):
    alias = torch.empty(0, dtype=t.dtype).set_(t.untyped_storage(), t.storage_offset(),
                                                t.shape, t.stride())
    alias.view(-1)[0] += 1


@pytest.mark.parametrize("write", [_write_data, _write_numpy, _write_set])
@pytest.mark.parametrize("what", ["x", "edge_index"])
@pytest.mark.parametrize("unit", ["adj", "linkx"])
def test_graph_features_are_never_stale(small, unit, what, write):
    """A X / A is cached by the contents of x and edge_index: a write that no version counter
    sees still gives the logits of a fresh model on the new data."""
    x, ei = small.x.clone(), small.edge_index.clone()
    model = _node_model(small, unit, "rw").eval()
    with torch.no_grad():
        model(x, ei)
        write(x if what == "x" else ei)
        got = model(x, ei)
        fresh = _node_model(small, unit, "rw").eval()
        want = fresh(x, ei)
    assert torch.equal(got, want)


@pytest.mark.parametrize("unit", ["mlp", "adj", "linkx"])
def test_cached_model_reads_its_graph_once(small, unit, monkeypatch):
    """cached=True (what `dignn train` builds for one graph): the same x and edge_index
    objects are not read again, by the input unit or the layer, and the logits are those of
    the uncached model; another edge_index object is read and rebuilt."""
    from dignn_kernels import graph as graph_module
    reads = []
    real = graph_module._fingerprints
    monkeypatch.setattr(graph_module, "_fingerprints",
                        lambda tensors: reads.extend(tensors) or real(tensors))
    x, ei = small.x.clone(), small.edge_index.clone()
    model = _node_model(small, unit, "rw", cached=True).eval()
    plain = _node_model(small, unit, "rw").eval()
    assert model.diffusion.cached and not plain.diffusion.cached
    with torch.no_grad():
        first = model(x, ei)
        count = len(reads)
        assert torch.equal(model(x, ei), first) and len(reads) == count
        assert torch.equal(plain(x, ei), first)
        other = ei[:, : ei.size(1) // 2].clone()
        assert torch.equal(model(x, other), plain(x, other)) and len(reads) > count


def test_adjacency_matrix_counts_duplicates_once():
    ei = torch.tensor([[0, 0, 1, 2], [1, 1, 0, 1]])
    a = adjacency_matrix(ei, 3).to_dense()
    expected = torch.zeros(3, 3)
    expected[1, 0] = expected[0, 1] = expected[1, 2] = 1  # row = target
    torch.testing.assert_close(a, expected)


def test_eval_is_deterministic_and_train_uses_dropout(small):
    model = _node_model(small, "mlp", "neural")
    model.eval()
    with torch.no_grad():
        a, b = model(small.x, small.edge_index), model(small.x, small.edge_index)
    torch.testing.assert_close(a, b)
    model.train()
    with torch.no_grad():
        c = model(small.x, small.edge_index)
    assert not torch.allclose(a, c)


def test_graph_classifier_on_a_batch():
    from torch_geometric.data import Batch, Data
    gen = torch.Generator().manual_seed(0)
    graphs = []
    for k, n in enumerate((5, 7, 4, 6)):
        e = torch.randint(0, n, (2, 2 * n), generator=gen)
        e = e[:, e[0] != e[1]]
        graphs.append(Data(x=torch.randn(n, 3, generator=gen),
                           edge_index=torch.cat([e, e.flip(0)], 1), y=torch.tensor([k % 2])))
    batch = Batch.from_data_list(graphs)
    for pooling in ("add", "mean", "max"):
        torch.manual_seed(0)
        model = DIGNNGraphClassifier(3, 8, 2, mu=2.5, max_iter=6, pooling=pooling)
        out = model(batch.x, batch.edge_index, batch.batch, batch.num_graphs)
        assert out.shape == (4, 2)
        torch.nn.functional.cross_entropy(out, batch.y).backward()
        assert model.diffusion.theta_phi.weight.grad.abs().sum() > 0
    # each graph is classified on its own: the batch gives what the graphs give one by one
    model.eval()
    with torch.no_grad():
        together = model(batch.x, batch.edge_index, batch.batch, batch.num_graphs)
        alone = torch.cat([model(g.x, g.edge_index, torch.zeros(g.num_nodes, dtype=torch.long),
                                 1) for g in graphs])
    torch.testing.assert_close(together, alone, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kwargs, match", [
    (dict(input_unit="gcn"), "input_unit"),
    (dict(laplacian="sym"), "laplacian"),
    (dict(dropout=1.0), "dropout"),
    (dict(input_unit="linkx"), "num_nodes"),
    (dict(mu=-1.0), "mu"),
    (dict(input_dropout=1.5), "input_dropout"),
    (dict(solver="newton"), "solver"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DIGNNNodeClassifier(4, 8, 2, **kwargs)


def test_bad_inputs(small):
    model = _node_model(small, "linkx", "neural")
    with pytest.raises(ValueError, match="num_nodes"):
        model(small.x[:-1], small.edge_index)
    with pytest.raises(ValueError, match="edge_index"):
        model(small.x, small.edge_index.t())
    with pytest.raises(ValueError, match="pooling"):
        DIGNNGraphClassifier(3, 8, 2, pooling="sum")
    graph_model = DIGNNGraphClassifier(3, 8, 2)
    with pytest.raises(ValueError, match="batch"):
        graph_model(torch.randn(5, 3), torch.empty(2, 0, dtype=torch.long),
                    torch.zeros(4, dtype=torch.long))


def test_dropout_of_sparse_features():
    from dignn.models import _dropout_any
    torch.manual_seed(0)
    x = (torch.rand(200, 50) < 0.1).float()
    out = _dropout_any(x.to_sparse(), 0.5, True).to_dense()
    kept = out != 0
    assert (kept <= (x != 0)).all()  # only stored entries survive
    assert 0.35 < float(kept.sum() / (x != 0).sum()) < 0.65
    torch.testing.assert_close(out[kept], torch.full_like(out[kept], 2.0))  # scaled by 1/(1-p)
    assert _dropout_any(x.to_sparse(), 0.5, False).to_dense().equal(x)


def test_input_dropout_is_separate_from_dropout(small):
    """``input_dropout`` acts on the input alone: with it at 0 and the hidden dropout on, two
    training-mode passes still differ, and the input unit sees the features unchanged."""
    torch.manual_seed(0)
    model = DIGNNNodeClassifier(small.num_features, 8, small.num_classes, mu=2.5, max_iter=4,
                                dropout=0.5, input_dropout=0.0)
    assert model.input_dropout == 0.0
    assert DIGNNNodeClassifier(4, 8, 2, dropout=0.3).input_dropout == 0.3
    seen = []
    model.lin_in.register_forward_hook(lambda m, inp, out: seen.append(inp[0]))
    model.train()
    a = model(small.x, small.edge_index)
    b = model(small.x, small.edge_index)
    assert not torch.equal(a, b)
    torch.testing.assert_close(seen[0], small.x.float())
