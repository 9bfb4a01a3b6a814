"""The graph cache is never stale, inference tensors work, 16-bit edge weights are summed in
float32, and every torch sparse layout is read (issue 43).

- never stale: every write path that bumps no version counter (``.data``, numpy, a
  ``from_numpy`` alias, DLPack, a ``set_()`` alias, the untyped storage, raw memory) on every
  tensor a graph is made of (edge_index, edge_weight, a COO tensor's indices and values, a CSR
  tensor's columns and values), through :func:`dignn_kernels.cached_graph` and through the
  layer: the result equals a fresh build exactly, and the layer's output the float64 dense
  solve of the written graph;
- the cache still hits (the same object, no build) while nothing changed, for every kind of
  graph, and for a copy of the same graph;
- the fingerprint: a change of any single entry always changes it (host and device paths), and
  the device path's int64 arithmetic wraps as the formula says;
- inference tensors (edge_index, edge_weight, sparse tensors, x) inside and after
  ``torch.inference_mode``, and a graph first used there then trained on;
- 16-bit edge weights: degrees and parallel edges summed in float32 (a hub of 600 unit edges
  has degree 600), the same graph and layer output as the same weights in float32;
- the sparse layouts CSC, BSR and BSC read as PyG's adj_t, equal to the COO read;
- a :class:`~dignn_kernels.CSRGraph` is a snapshot: it shares no memory with its inputs;
- under CUDA graph capture (no host reads) the graph last seen for the same tensors is reused,
  and a graph never seen is refused with the fix.
"""
import ctypes

import pytest
import torch

import dignn_kernels as dk
from dignn_kernels import graph as graph_module
from dignn_kernels import reference
from conftest import make_layer, rel_err, thetas

N, D = 12, 3
CONVERGED = dict(max_iter=400, tol=1e-14)
CHECKED = dict(check_invariants=True)  # (torch warns when sparse tensors are not)


def _edges(seed=3, n=N, m=40):
    """(edge_index, edge_weight float64) of a small directed graph without parallel edges."""
    g = torch.Generator().manual_seed(seed)
    src, dst = torch.randint(0, n, (2, m), generator=g)
    pairs = torch.unique(torch.stack([src, dst])[:, src != dst], dim=1)
    w = torch.rand(pairs.size(1), generator=g, dtype=torch.float64) + 0.5
    return pairs.contiguous(), w


def _adj_t(ei, w, n=N):
    """The sparse COO adj_t of (edge_index, w): entry (target, source)."""
    return torch.sparse_coo_tensor(ei.flip(0), w, (n, n), **CHECKED)


def _as_edges(edge, weight):
    """(edge_index, edge_weight) that the graph ``edge`` (+ ``weight``) stands for now: what
    the float64 oracle takes."""
    if isinstance(edge, torch.Tensor) and edge.layout != torch.strided:
        coo = edge.to_sparse_coo() if edge.layout != torch.sparse_coo else \
            torch.sparse_coo_tensor(edge._indices(), edge._values(), edge.shape, **CHECKED)
        coo = coo.coalesce()
        return coo.indices().flip(0), coo.values().double()
    return edge, weight


def same_graph(a: dk.CSRGraph, b: dk.CSRGraph) -> bool:
    return (a.num_nodes == b.num_nodes and a.symmetric == b.symmetric and a.flow == b.flow
            and all(torch.equal(getattr(a, f), getattr(b, f))
                    and getattr(a, f).dtype == getattr(b, f).dtype
                    for f in ("rowptr", "col", "value", "degree")))


# ------------------------------------------------------------------- write paths --
# Each changes entry ``index`` of tensor ``t`` to ``value`` without an in-place op on ``t``
# itself, so that ``t._version`` does not move.

def _write_data(t, index, value):
    t.data[index] = value


def _write_numpy(t, index, value):
    t.numpy()[index] = value


def _write_from_numpy(t, index, value):
    torch.from_numpy(t.numpy())[index] = value


def _write_dlpack(t, index, value):
    torch.from_dlpack(t)[index] = value


def _write_set_alias(t, index, value):
    alias = torch.empty(0, dtype=t.dtype).set_(t.untyped_storage(), t.storage_offset(),
                                               t.shape, t.stride())
    alias[index] = value


def _write_storage(t, index, value):
    changed = t.untyped_storage().clone()
    torch.empty(0, dtype=t.dtype).set_(changed, t.storage_offset(), t.shape,
                                       t.stride())[index] = value
    t.untyped_storage().copy_(changed)


def _write_memory(t, index, value):
    offset = sum(i * s for i, s in zip(index, t.stride())) * t.element_size()
    data = torch.tensor([value], dtype=t.dtype).numpy().tobytes()
    ctypes.memmove(t.data_ptr() + offset, data, len(data))


WRITES = {"data": _write_data, "numpy": _write_numpy, "from_numpy": _write_from_numpy,
          "dlpack": _write_dlpack, "set_alias": _write_set_alias, "storage": _write_storage,
          "memory": _write_memory}


def _target(name):
    """(edge, edge_weight, the tensor written, index, new value) of a graph ``name``."""
    ei, w = _edges()
    if name == "edge_index":
        ei = ei.clone()
        return ei, None, ei, (0, 0), int(ei[0, 0] + 1) % N
    if name == "edge_weight":
        w = w.clone()
        return ei, w, w, (0,), float(w[0]) + 1.5
    coo = _adj_t(ei, w)
    if name == "coo_indices":  # the column of entry 0 (its source) moves
        t = coo._indices()
        return coo, None, t, (1, 0), int(t[1, 0] + 1) % N
    if name == "coo_values":
        t = coo._values()
        return coo, None, t, (0,), float(t[0]) + 1.5
    csr = coo.coalesce().to_sparse_csr()
    if name == "csr_col":
        t = csr.col_indices()
        return csr, None, t, (0,), int(t[0] + 1) % N
    if name == "csr_values":
        t = csr.values()
        return csr, None, t, (0,), float(t[0]) + 1.5
    raise ValueError(name)


TARGETS = ["edge_index", "edge_weight", "coo_indices", "coo_values", "csr_col", "csr_values"]


# ------------------------------------------------------------------- never stale --

@pytest.mark.parametrize("write", WRITES)
@pytest.mark.parametrize("target", TARGETS)
def test_cached_graph_is_never_stale(target, write):
    edge, weight, written, index, value = _target(target)
    before = dk.cached_graph(edge, N, weight)
    version = written._version
    WRITES[write](written, index, value)
    assert written._version == version  # a write no version counter sees
    after = dk.cached_graph(edge, N, weight)
    dk.clear_graph_cache()
    fresh = dk.build_graph(edge, N, weight)
    assert same_graph(after, fresh)
    assert not same_graph(after, before)  # (the write changed the graph)


@pytest.mark.parametrize("write", WRITES)
@pytest.mark.parametrize("target", TARGETS)
def test_layer_is_never_stale(target, write):
    edge, weight, written, index, value = _target(target)
    x = torch.randn(N, D, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    layer = make_layer(D, h=3, **CONVERGED)
    first = layer(x, edge, weight)
    WRITES[write](written, index, value)
    got = layer(x, edge, weight)
    dk.clear_graph_cache()
    assert torch.equal(got, layer(x, edge, weight))  # the fresh build's answer, bit for bit
    assert not torch.equal(got, first)
    ei, w = _as_edges(edge, weight)
    want, _ = reference.dense_equilibrium(x, ei, w, laplacian="neural", mu=layer.mu,
                                          eps=layer.eps, **thetas(layer))
    assert rel_err(got, want) < 1e-10


@pytest.mark.parametrize("target", ["edge_index", "edge_weight"])
def test_view_written_through_its_base(target):
    """A graph that is a view into a larger tensor, written through the base's numpy
    array."""
    ei, w = _edges()
    base = torch.cat([ei, ei], dim=1) if target == "edge_index" else torch.cat([w, w])
    view = base[:, : ei.size(1)] if target == "edge_index" else base[: w.numel()]
    edge, weight = (view, None) if target == "edge_index" else (ei, view)
    before = dk.cached_graph(edge, N, weight)
    arr = base.numpy()
    if target == "edge_index":
        arr[0, 0] = (arr[0, 0] + 1) % N
    else:
        arr[0] += 1.5
    after = dk.cached_graph(edge, N, weight)
    assert not same_graph(after, before)
    dk.clear_graph_cache()
    assert same_graph(after, dk.build_graph(edge, N, weight))


def test_a_new_tensor_at_a_freed_address():
    """A graph freed, and another graph made in the same memory by a new tensor object
    (CPython hands the freed object's id to the next one as a rule): the new graph."""
    ei, _ = _edges()
    memory = ei.clone().untyped_storage()

    def tensor_on_memory():
        return torch.empty(0, dtype=ei.dtype).set_(memory, 0, ei.shape, ei.stride())
    first = tensor_on_memory()
    before = dk.cached_graph(first, N)
    address = first.data_ptr()
    del first
    second = tensor_on_memory()
    second[0, 0] = (second[0, 0] + 1) % N  # (its own version counter, as the first had)
    assert second.data_ptr() == address
    after = dk.cached_graph(second, N)
    assert not same_graph(after, before)
    assert same_graph(after, dk.build_graph(second.clone(), N))


def test_num_nodes_is_part_of_the_key():
    ei, _ = _edges()
    assert dk.cached_graph(ei, N).num_nodes == N
    assert dk.cached_graph(ei, N + 3).num_nodes == N + 3
    with pytest.raises(TypeError, match="num_nodes must be an int"):
        dk.cached_graph(ei, float(N))  # not the cached graph of N nodes


def test_requires_grad_is_refused_on_a_hit():
    """The same weights, now requiring grad: refused as a fresh build refuses them, not
    silently served from the cache (the gradient would never reach them)."""
    ei, w = _edges()
    dk.cached_graph(ei, N, w)
    with pytest.raises(ValueError, match="edge_weight requires grad"):
        dk.cached_graph(ei, N, w.clone().requires_grad_())


# ------------------------------------------------------------------ still cached --

def _graphs():
    ei, w = _edges()
    coo = _adj_t(ei, w)
    return {"edge_index": (ei, None), "edge_weight": (ei, w), "coo": (coo, None),
            "csr": (coo.coalesce().to_sparse_csr(), None),
            "csc": (coo.coalesce().to_sparse_csc(), None),
            "bsr": (coo.coalesce().to_sparse_bsr((3, 2)), None),
            "bsc": (coo.coalesce().to_sparse_bsc((2, 3)), None)}


@pytest.fixture
def builds(monkeypatch):
    """The calls of build_graph made through the cache."""
    calls = []
    real = graph_module.build_graph

    def counted(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)
    monkeypatch.setattr(graph_module, "build_graph", counted)
    return calls


@pytest.mark.parametrize("kind", list(_graphs()))
def test_cache_hits_while_nothing_changed(kind, builds):
    edge, weight = _graphs()[kind]
    g = dk.cached_graph(edge, N, weight)
    assert dk.cached_graph(edge, N, weight) is g
    layer = dk.FusedImplicitDiffusion(D, laplacian="rw")
    x = torch.randn(N, D)
    layer(x, edge, weight)
    layer(x, edge, weight)
    assert len(builds) == 1


@pytest.mark.parametrize("kind", list(_graphs()))
def test_cache_hits_for_a_copy_of_the_graph(kind, builds):
    """A new tensor with the same graph (a copy, a reload, a DataLoader's batch) is the same
    graph: no second build."""
    edge, weight = _graphs()[kind]
    g = dk.cached_graph(edge, N, weight)
    copy = edge.clone()
    assert dk.cached_graph(copy, N, None if weight is None else weight.clone()) is g
    assert len(builds) == 1


def test_a_non_contiguous_edge_index():
    ei, w = _edges()
    strided = ei.t().contiguous().t()  # [2, m] with strides (1, 2)
    assert not strided.is_contiguous()
    g = dk.cached_graph(strided, N, w)
    assert g is dk.cached_graph(ei, N, w)
    strided.numpy()[1, 0] = (strided[1, 0] + 1) % N
    assert same_graph(dk.cached_graph(strided, N, w), dk.build_graph(strided, N, w))


# ------------------------------------------------------------------- fingerprint --

DTYPES = [torch.int64, torch.int32, torch.float64, torch.float32, torch.bfloat16,
          torch.float16, torch.uint8, torch.bool]


def _small(dtype, n=9):
    g = torch.Generator().manual_seed(0)
    if dtype == torch.bool:
        return torch.rand(n, generator=g) > 0.5
    if dtype.is_floating_point:
        return (torch.rand(n, generator=g) * 4).to(dtype)
    return torch.randint(0, 100, (n,), generator=g).to(dtype)


def _alternatives(t, k):
    """Values entry k can take other than its own (bit patterns of the dtype)."""
    bits = t.view(graph_module._INT_OF_SIZE[t.element_size()])
    old = int(bits[k])
    width = 8 * t.element_size()
    candidates = {old ^ (1 << b) for b in range(width)} | {old + 1, old - 1, 0, 1}
    signed = t.element_size() > 1
    low, high = (-(1 << (width - 1)), (1 << (width - 1)) - 1) if signed else (0, 255)
    out = []
    for c in sorted(candidates):
        if c != old:
            c = (c - low) % (high - low + 1) + low  # wrap into the type's range
            if c != old:
                out.append(c)
    return out, bits


@pytest.mark.parametrize("path", ["host", "device"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_any_single_entry_change_changes_the_fingerprint(dtype, path):
    fingerprint = graph_module._host_fingerprint if path == "host" else \
        (lambda t: tuple(graph_module._device_fingerprint(t).tolist()))
    t = _small(dtype)
    if dtype == torch.bool:
        t = t.view(torch.uint8).clone()
    base = fingerprint(t)
    for k in range(t.numel()):
        values, bits = _alternatives(t, k)
        for v in values:
            changed = bits.clone()
            changed[k] = v
            assert fingerprint(changed.view(t.dtype)) != base, (k, v)
    swapped = t.flip(0)
    if not torch.equal(swapped, t):
        assert fingerprint(swapped) != base  # (positions count: a permutation is a change)


def _splitmix_reference(words):
    """The device fingerprint in Python integers modulo 2**64."""
    mask = (1 << 64) - 1
    golden, m1, m2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
    mixed = total = 0
    for k, w in enumerate(words):
        w &= mask
        z = w ^ ((k * golden) & mask)
        z = ((z ^ (z >> 30)) * m1) & mask
        z = ((z ^ (z >> 27)) * m2) & mask
        z ^= z >> 31
        mixed, total = (mixed + z) & mask, (total + w) & mask

    def signed(v):
        return v - (1 << 64) if v >= 1 << 63 else v
    return [signed(mixed), signed(total)]


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.float32, torch.bfloat16])
def test_device_fingerprint_wraps_as_the_formula(dtype):
    t = _small(dtype, n=257)
    if dtype == torch.int64:
        t = t * (2**61 + 12345)  # products beyond 2**63: the wrap must be modulo 2**64
    words = t.view(graph_module._INT_OF_SIZE[t.element_size()]).tolist()
    assert graph_module._device_fingerprint(t).tolist() == _splitmix_reference(words)


@pytest.mark.parametrize("target", TARGETS)
def test_device_path_through_the_cache(target, monkeypatch):
    """The fingerprint a GPU computes (torch ops, one read back), run on the CPU's tensors."""
    monkeypatch.setattr(graph_module, "_on_host", lambda t: False)
    edge, weight, written, index, value = _target(target)
    before = dk.cached_graph(edge, N, weight)
    assert dk.cached_graph(edge, N, weight) is before
    _write_numpy(written, index, value)
    after = dk.cached_graph(edge, N, weight)
    dk.clear_graph_cache()
    assert same_graph(after, dk.build_graph(edge, N, weight))
    assert not same_graph(after, before)


# ------------------------------------------------------------- inference tensors --

def _inference(make):
    with torch.inference_mode():
        return make()


@pytest.mark.parametrize("kind", ["edge_index", "edge_weight", "coo", "csr", "csc"])
@pytest.mark.parametrize("where", ["inside", "after"])
def test_inference_tensors(kind, where):
    """A graph made under torch.inference_mode (tensors without a version counter), read
    inside inference mode and after it: the same graph as from normal tensors."""
    edge, weight = _graphs()[kind]
    want = dk.build_graph(edge, N, weight)
    edge_i, weight_i = _inference(lambda: (edge.clone(),
                                           None if weight is None else weight.clone()))
    assert edge_i.is_inference()
    if where == "inside":
        with torch.inference_mode():
            got = dk.cached_graph(edge_i, N, weight_i)
    else:
        got = dk.cached_graph(edge_i, N, weight_i)
    assert same_graph(got, want)
    assert not any(t.is_inference() for t in (got.rowptr, got.col, got.value, got.degree))


def test_inference_edge_index_written_inside_inference_mode():
    ei = _inference(lambda: _edges()[0].clone())
    before = dk.cached_graph(ei, N)
    with torch.inference_mode():
        ei[0, 0] = (ei[0, 0] + 1) % N
    after = dk.cached_graph(ei, N)
    assert not same_graph(after, before)
    assert same_graph(after, dk.build_graph(ei.clone(), N))


@pytest.mark.parametrize("laplacian", ["neural", "rw"])
def test_layer_inside_inference_mode(laplacian):
    """x, edge_index and edge_weight all inference tensors, end to end through the layer."""
    ei, w = _edges()
    x = torch.randn(N, D, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    layer = make_layer(D, laplacian, h=3, **CONVERGED)
    with torch.no_grad():
        want = layer(x, ei, w)
    dk.clear_graph_cache()
    with torch.inference_mode():
        xi, eii, wi = x.clone(), ei.clone(), w.clone()
        got = layer(xi, eii, wi)
    assert got.is_inference() and torch.equal(got, want)
    with torch.no_grad():  # inference x after inference mode, with the graph it cached
        assert torch.equal(layer(xi, eii, wi), want)


@pytest.mark.parametrize("graph_kind", ["edge_index", "csr_graph"])
@pytest.mark.parametrize("laplacian", ["neural", "rw", "sym"])
def test_graph_first_used_in_inference_mode_then_trained(graph_kind, laplacian):
    """An evaluation under torch.inference_mode first (the graph and what it derives made
    there), then a training step on the same graph: the gradients of a fresh graph (tensors
    made in inference mode cannot be saved for backward)."""
    ei, w = _edges()
    edge = ei if graph_kind == "edge_index" else dk.build_graph(ei, N, w)
    weight = w if graph_kind == "edge_index" else None
    x = torch.randn(N, D, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    layer = make_layer(D, laplacian, h=3, **CONVERGED)
    with torch.inference_mode():
        layer(x, edge, weight)
    xr = x.clone().requires_grad_()
    got = torch.autograd.grad(layer(xr, edge, weight).square().sum(), xr)[0]
    dk.clear_graph_cache()
    xr = x.clone().requires_grad_()
    want = torch.autograd.grad(layer(xr, dk.build_graph(ei, N, w)).square().sum(), xr)[0]
    assert torch.equal(got, want)


# ------------------------------------------------------------ 16-bit edge weights --

SIXTEEN = [torch.bfloat16, torch.float16]


def _hub(count, weight, dtype):
    """Node 0 aggregates from ``count`` nodes, each edge of ``weight`` in ``dtype``."""
    src = torch.arange(1, count + 1)
    ei = torch.stack([src, torch.zeros_like(src)])
    return ei, torch.full((count,), weight, dtype=dtype)


@pytest.mark.parametrize("count", [600, 3000])
@pytest.mark.parametrize("weight", [1.0, 0.1])
@pytest.mark.parametrize("dtype", SIXTEEN)
def test_hub_degree_of_16_bit_weights(dtype, weight, count):
    ei, w = _hub(count, weight, dtype)
    g = dk.build_graph(ei, count + 1, w)
    exact = count * float(w[0].double())  # every partial sum is exact in float32 here
    assert g.degree.dtype == torch.float32 and g.value.dtype == torch.float32
    assert float(g.degree[0]) == exact
    assert torch.equal(g.degree[1:], torch.zeros(count))


@pytest.mark.parametrize("dtype", SIXTEEN)
def test_rw_keeps_a_constant_signal_with_16_bit_weights(dtype):
    """Delta^rw 1 = 0 needs D_i to be the sum of the a_ij the kernels read."""
    ei, w = _hub(600, 1.0, dtype)
    ei = torch.cat([ei, ei.flip(0)], dim=1)
    w = torch.cat([w, w])
    x = torch.ones(601, 2)
    z = dk.FusedImplicitDiffusion(2, laplacian="rw", mu=2.2)(x, ei, w)
    assert torch.allclose(z, x, rtol=0, atol=1e-6)


def _parallel(dtype, copies=600):
    """Edge 1 -> 0 ``copies`` times and 2 -> 0 once, weights 1 and 0.1 in ``dtype``."""
    ei = torch.tensor([[1] * copies + [2], [0] * copies + [0]])
    w = torch.tensor([1.0] * copies + [0.1]).to(dtype)
    return ei, w


@pytest.mark.parametrize("form", ["edge_index", "coo"])
@pytest.mark.parametrize("dtype", SIXTEEN)
def test_parallel_16_bit_edges_are_summed_in_float32(dtype, form):
    ei, w = _parallel(dtype)
    if form == "edge_index":
        g = dk.build_graph(ei, 3, w)
    else:  # an uncoalesced COO tensor: its parallel entries are summed by the build
        g = dk.build_graph(torch.sparse_coo_tensor(ei.flip(0), w, (3, 3), **CHECKED), 3)
    assert g.value.dtype == torch.float32
    assert g.value.tolist() == [600.0, float(w[-1].float())]
    assert float(g.degree[0]) == 600.0 + float(w[-1].float())


@pytest.mark.parametrize("layout", ["csr", "csc", "bsr"])
@pytest.mark.parametrize("dtype", SIXTEEN)
def test_hub_degree_of_a_16_bit_sparse_adjacency(dtype, layout):
    ei, w = _hub(600, 1.0, dtype)
    coo = torch.sparse_coo_tensor(ei.flip(0), w, (601, 601), **CHECKED).coalesce()
    sparse = {"csr": coo.to_sparse_csr, "csc": coo.to_sparse_csc,
              "bsr": lambda: coo.to_sparse_bsr(1)}[layout]()
    g = dk.build_graph(sparse, 601)
    assert g.degree.dtype == torch.float32 and float(g.degree[0]) == 600.0


@pytest.mark.parametrize("laplacian", ["neural", "rw", "sym", "unnormalized"])
@pytest.mark.parametrize("dtype", SIXTEEN)
def test_16_bit_weights_are_the_float32_graph(dtype, laplacian):
    """Weights in 16 bits and the same numbers in float32: the same graph, the same layer
    output, bit for bit (parallel edges and a hub included), and the float64 oracle's."""
    ei, w = _edges(m=60)
    hub_ei, hub_w = _parallel(torch.float64, copies=300)
    ei, w = torch.cat([ei, hub_ei], dim=1), torch.cat([w, hub_w])
    w16 = w.to(dtype)
    g16, g32 = dk.build_graph(ei, N, w16), dk.build_graph(ei, N, w16.float())
    assert same_graph(g16, g32)
    x = torch.randn(N, D, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    # (the hub's degree 300: the unnormalized Laplacian's fixed point needs mu beyond its
    # lambda_max <= 2 max D_i)
    layer = make_layer(D, laplacian, h=3, mu=1500.0 if laplacian == "unnormalized" else None,
                       **CONVERGED)
    z16 = layer(x, ei, w16)
    assert torch.equal(z16, layer(x, ei, w16.float()))
    want, _ = reference.dense_equilibrium(x, ei, w16.double(), laplacian=laplacian,
                                          mu=layer.mu, eps=layer.eps, **thetas(layer))
    assert rel_err(z16, want) < 1e-6


def test_gradcheck_with_16_bit_weights():
    ei, w = _edges()
    x = torch.randn(N, D, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    layer = make_layer(D, h=3, **CONVERGED)
    w16 = w.to(torch.bfloat16)
    inputs = (x.requires_grad_(),) + tuple(layer.parameters())
    assert torch.autograd.gradcheck(lambda x, *p: layer(x, ei, w16), inputs, eps=1e-6,
                                    atol=1e-6, rtol=1e-5)


# ------------------------------------------------------------------ sparse layouts --

LAYOUTS = {"csc": lambda c: c.to_sparse_csc(), "bsr_3x2": lambda c: c.to_sparse_bsr((3, 2)),
           "bsr_4x4": lambda c: c.to_sparse_bsr((4, 4)), "bsr_1x1": lambda c: c.to_sparse_bsr(1),
           "bsc_2x3": lambda c: c.to_sparse_bsc((2, 3)), "bsc_6x6": lambda c: c.to_sparse_bsc(6)}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_sparse_layouts_read_as_the_coo(layout):
    ei, w = _edges()
    coo = _adj_t(ei, w).coalesce()
    sparse = LAYOUTS[layout](coo)
    want = dk.build_graph(coo, N)
    assert same_graph(dk.build_graph(sparse, N), want)
    assert same_graph(dk.build_graph(ei, N, w), want)  # adj_t: rows are the targets
    x = torch.randn(N, D, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    layer = make_layer(D, h=3, **CONVERGED)
    z = layer(x, sparse)
    assert torch.equal(z, layer(x, ei, w))
    oracle, _ = reference.dense_equilibrium(x, ei, w, laplacian="neural", mu=layer.mu,
                                            eps=layer.eps, **thetas(layer))
    assert rel_err(z, oracle) < 1e-10


@pytest.mark.parametrize("layout", ["bsr", "bsc"])
def test_zeros_inside_blocks_are_not_edges(layout):
    """A block stores its zeros: the graph is that of to_dense(), whose zeros are no edges
    (else the symmetric graph here would read as directed)."""
    ei = torch.tensor([[0, 1, 2, 3], [1, 0, 3, 2]])
    dense = torch.zeros(4, 4, dtype=torch.float64)
    dense[ei[1], ei[0]] = 1.0
    sparse = dense.to_sparse_bsr((2, 2)) if layout == "bsr" else dense.to_sparse_bsc((2, 2))
    assert sparse.values().numel() > ei.size(1)  # (the blocks do hold zeros)
    g = dk.build_graph(sparse, 4)
    assert g.num_edges == 4 and g.symmetric
    assert same_graph(g, dk.build_graph(ei, 4, torch.ones(4, dtype=torch.float64)))


@pytest.mark.parametrize("layout", ["csc", "bsr_3x2", "bsc_2x3"])
def test_gradcheck_of_sparse_layouts(layout):
    ei, w = _edges()
    sparse = LAYOUTS[layout](_adj_t(ei, w).coalesce())
    x = torch.randn(N, D, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    layer = make_layer(D, h=3, **CONVERGED)
    inputs = (x.requires_grad_(),) + tuple(layer.parameters())
    assert torch.autograd.gradcheck(lambda x, *p: layer(x, sparse), inputs, eps=1e-6,
                                    atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("layout", ["csc", "bsr_3x2", "bsc_2x3"])
def test_sparse_layout_written_is_never_stale(layout):
    ei, w = _edges()
    sparse = LAYOUTS[layout](_adj_t(ei, w).coalesce())
    before = dk.cached_graph(sparse, N)
    values = sparse.values()
    nonzero = int(torch.nonzero(values.reshape(-1))[0, 0])
    values.numpy().reshape(-1)[nonzero] += 1.5
    after = dk.cached_graph(sparse, N)
    assert not same_graph(after, before)
    dk.clear_graph_cache()
    assert same_graph(after, dk.build_graph(sparse, N))


# ------------------------------------------------------------------------ snapshots --

@pytest.mark.parametrize("kind", list(_graphs()))
def test_a_built_graph_shares_no_memory_with_its_inputs(kind):
    edge, weight = _graphs()[kind]
    if edge.layout == torch.strided:
        inputs = [edge] + ([weight] if weight is not None else [])
    elif edge.layout == torch.sparse_coo:
        inputs = [edge._indices(), edge._values()]
    elif edge.layout in (torch.sparse_csr, torch.sparse_bsr):
        inputs = [edge.crow_indices(), edge.col_indices(), edge.values()]
    else:
        inputs = [edge.ccol_indices(), edge.row_indices(), edge.values()]
    g = dk.build_graph(edge, N, weight)
    ours = [g.rowptr, g.col, g.value, g.degree]

    def span(t):
        start = t.untyped_storage().data_ptr()
        return start, start + t.untyped_storage().nbytes()
    for t in inputs:
        for o in ours:
            (a, b), (c, d) = span(t), span(o)
            assert b <= c or d <= a or min(b - a, d - c) == 0


def test_a_prebuilt_graph_is_a_snapshot():
    ei, w = _edges()
    g = dk.build_graph(ei, N, w)
    want = dk.build_graph(ei.clone(), N, w.clone())
    ei.numpy()[0, 0] = (ei[0, 0] + 1) % N
    w.numpy()[:] = 7.0
    assert same_graph(g, want)


# ------------------------------------------------------------ CUDA graph capture --

def _start_capture(monkeypatch):
    """As while a CUDA graph is being captured: no host read allowed, so no fingerprint."""
    monkeypatch.setattr(graph_module, "host_reads_allowed", lambda t: False)

    def no_fingerprint(tensors):
        raise AssertionError("a fingerprint read values during a capture")
    monkeypatch.setattr(graph_module, "_fingerprints", no_fingerprint)


def test_capture_reuses_the_graph_seen_before(monkeypatch):
    ei, w = _edges()
    warm = dk.cached_graph(ei, N, w)  # the warm-up a capture needs
    _start_capture(monkeypatch)
    assert dk.cached_graph(ei, N, w) is warm


def test_capture_refuses_a_graph_never_seen(monkeypatch):
    ei, w = _edges()
    dk.cached_graph(ei, N, w.clone())  # (other objects: not these)
    _start_capture(monkeypatch)
    with pytest.raises(RuntimeError, match="while a CUDA graph is being captured.*warm-up"):
        dk.cached_graph(ei, N, w)


def test_capture_refuses_a_graph_changed_since(monkeypatch):
    ei, w = _edges()
    dk.cached_graph(ei, N, w)
    w.mul_(2.0)
    _start_capture(monkeypatch)
    with pytest.raises(RuntimeError, match="while a CUDA graph is being captured"):
        dk.cached_graph(ei, N, w)


# ------------------------------------------------------------------- torch_sparse --

def test_sparse_tensor_written_is_never_stale():
    torch_sparse = pytest.importorskip("torch_sparse")
    ei, w = _edges()
    adj = torch_sparse.SparseTensor(row=ei[1], col=ei[0], value=w, sparse_sizes=(N, N))
    before = dk.cached_graph(adj, N)
    assert dk.cached_graph(adj, N) is before
    adj.storage.value().numpy()[0] += 1.5
    after = dk.cached_graph(adj, N)
    assert not same_graph(after, before)
    dk.clear_graph_cache()
    assert same_graph(after, dk.build_graph(adj, N))


# ------------------------------------------------------------------- cached=True --

@pytest.fixture
def fingerprints(monkeypatch):
    """The tensors whose contents the cache read."""
    read = []
    real = graph_module._fingerprints

    def counted(tensors):
        read.extend(tensors)
        return real(tensors)
    monkeypatch.setattr(graph_module, "_fingerprints", counted)
    return read


@pytest.mark.parametrize("kind", list(_graphs()))
def test_cached_layer_reads_the_graph_once(kind, fingerprints):
    """PyG's cached=True: the same objects come back, the graph is neither built nor read
    again (no host sync per step on a GPU), and the output is that of the uncached layer."""
    edge, weight = _graphs()[kind]
    torch.manual_seed(0)
    layer = dk.FusedImplicitDiffusion(D, laplacian="neural", cached=True).double()
    plain = dk.FusedImplicitDiffusion(D, laplacian="neural").double()
    plain.load_state_dict(layer.state_dict())
    x = torch.randn(N, D, dtype=torch.float64)
    z = layer(x, edge, weight)
    reads = len(fingerprints)
    assert reads >= 1
    for _ in range(3):
        assert torch.equal(layer(x, edge, weight), z)
    assert len(fingerprints) == reads
    assert torch.equal(plain(x, edge, weight), z)


def test_cached_layer_builds_again_for_another_object_or_size(fingerprints):
    ei, w = _edges()
    layer = dk.FusedImplicitDiffusion(D, laplacian="rw", cached=True).double()
    x = torch.randn(N, D, dtype=torch.float64)
    layer(x, ei, w)
    reads = len(fingerprints)
    other = torch.stack([ei[1], ei[0]])  # another graph in another object: built and read
    got = layer(x, other, w)
    assert len(fingerprints) > reads
    want, _ = reference.dense_equilibrium(x, other, w, laplacian="rw", mu=layer.mu)
    assert rel_err(got, want) < 1e-6  # (the default tol)
    reads = len(fingerprints)
    layer(x, other)  # the same edge_index without its weights: read again
    assert len(fingerprints) > reads
    bigger = torch.randn(N + 2, D, dtype=torch.float64)
    reads = len(fingerprints)
    layer(bigger, other)  # another node count
    assert len(fingerprints) > reads


def test_cached_layer_copies_and_pickles_without_its_graph(tmp_path):
    import copy
    import pickle
    ei, w = _edges()
    layer = dk.FusedImplicitDiffusion(D, laplacian="rw", cached=True)
    layer(torch.randn(N, D), ei, w)
    assert layer._held is not None
    for twin in (copy.deepcopy(layer), pickle.loads(pickle.dumps(layer))):
        assert twin.cached and twin._held is None
    path = tmp_path / "layer.pt"
    torch.save(layer, path)
    assert torch.load(path, weights_only=False)._held is None
    assert "cached=True" in repr(layer) and "cached" not in repr(
        dk.FusedImplicitDiffusion(D, laplacian="rw"))


@pytest.mark.parametrize("bad", [1, "yes", None])
def test_cached_must_be_a_bool(bad):
    with pytest.raises(ValueError, match="cached must be True or False"):
        dk.FusedImplicitDiffusion(D, cached=bad)
