"""Bad graphs raise, naming the argument, before any kernel reads them: on the CPU ops, the
triton backend (in Triton's interpreter on CPU tensors) and CUDA (marker ``cuda``); the GPU
host code is also run in the kernels' emulator by tests/test_cuda_emulated.py.

The O(edges) data checks (dignn_kernels.ops.check_graph) run before each op of the Python face
unless the caller passes trusted=True; the layer and the solvers pass it for the graphs that
dignn_kernels.graph built (valid by construction), so a forward never runs the check.
"""
import pytest
import torch

import dignn_kernels as dk
from dignn_kernels import checks, ops, solvers
from dignn_kernels.backends import triton as tb
from backend_faces import face
from dignn_kernels.graph import CSRGraph, transpose_csr
from bad_graphs import (N, OPS, all_cases, assert_raises_naming, first_line, inputs,
                        strided)
from conftest import GRAPH_KINDS, make_graph, make_layer

HAS_CUDA = torch.cuda.is_available()
compiled, tk, torch_passes = face("cpu"), face("triton"), face("torch")
# neural_edge_weights_backward has a public face for the compiled ops only: the Triton op of
# that name runs inside its autograd formula, on a transposed CSR that formula builds.
FACE_OPS = [op for op in OPS if hasattr(tk, op)]
assert FACE_OPS == [op for op in OPS if hasattr(torch_passes, op)]
assert set(OPS) - set(FACE_OPS) == {"neural_edge_weights_backward"}


def face_cases():
    """all_cases() of the ops the triton and torch faces have."""
    return [case for case in all_cases() if case.values[0] in FACE_OPS]


@pytest.fixture(scope="module")
def valid():
    return inputs()


# ------------------------------------------------------------------------ the CPU ops --

@pytest.mark.parametrize("op,changes,regex", all_cases())
def test_cpu_ops(valid, op, changes, regex):
    call = OPS[op][0]
    assert_raises_naming(lambda: call(compiled, valid.replace(**changes)), regex)


@pytest.mark.parametrize("op", list(OPS))
def test_valid_inputs_pass(valid, op):
    OPS[op][0](compiled, valid)


@pytest.mark.parametrize("op", list(OPS))
def test_strided_graph_tensors(valid, op):
    """A CSR of strided views passes the check and reads as the contiguous one (the CPU
    kernels take raw pointers: they used to read a strided rowptr's memory as if packed)."""
    s = strided(valid)
    assert not s.rowptr.is_contiguous()
    want, got = OPS[op][0](compiled, valid), OPS[op][0](compiled, s)
    for a, b in zip(want if isinstance(want, tuple) else (want,),
                    got if isinstance(got, tuple) else (got,)):
        assert torch.equal(a, b), op


@pytest.mark.parametrize("kind", GRAPH_KINDS)
def test_check_graph_accepts_built_graphs(kind):
    x, ei, w = make_graph(kind)
    g = dk.build_graph(ei, x.size(0), w)
    t_rowptr, t_col, t_perm = transpose_csr(g.rowptr, g.col, g.num_nodes)
    assert ops.check_graph(g.rowptr, g.col, g.num_nodes) is None
    ops.check_graph(g.rowptr, g.col.long(), g.num_nodes, t_rowptr, t_col, t_perm)
    torch.ops.dignn.check_graph(g.rowptr, g.col, g.num_nodes, t_rowptr, t_col, t_perm.int())


def test_check_graph_op_arguments(valid):
    s = valid
    check = torch.ops.dignn.check_graph
    with pytest.raises(RuntimeError, match=r"rowptr has 20 \+ 1 entries for 20 rows but "
                                           r"num_nodes = 21"):
        check(s.rowptr, s.col, N + 1)
    with pytest.raises(RuntimeError, match="rowptr must be int64"):
        check(s.rowptr.int(), s.col, N)
    with pytest.raises(RuntimeError, match="col must be int32 or int64"):
        check(s.rowptr, s.col.float(), N)
    with pytest.raises(RuntimeError, match="t_rowptr, t_col and t_perm go together"):
        check(s.rowptr, s.col, N, s.t_rowptr)
    with pytest.raises(RuntimeError, match=r"t_col and t_perm must hold one entry per edge"):
        check(s.rowptr, s.col, N, s.t_rowptr, s.t_col, s.t_perm[:-1])
    with pytest.raises(RuntimeError, match="t_perm must be a 1-D int64"):
        check(s.rowptr, s.col, N, s.t_rowptr, s.t_col, s.t_perm.double())
    # an empty graph, and one with no nodes
    check(torch.zeros(4, dtype=torch.long), torch.zeros(0, dtype=torch.int32), 3)
    check(torch.zeros(1, dtype=torch.long), torch.zeros(0, dtype=torch.int32), 0)
    with pytest.raises(RuntimeError, match=r"col holds node index 1 at position 0, outside "
                                           r"0\.\.0 \(the graph has 1 nodes\)"):
        ops.check_graph(torch.tensor([0, 1]), torch.tensor([1], dtype=torch.int32), 1)


def test_int64_columns(valid):
    s = valid.replace(col=valid.col.long(), t_col=valid.t_col.long())
    OPS["neural_weight_grad"][0](compiled, s)
    assert_raises_naming(lambda: OPS["csr_fma"][0](compiled, s.replace(col=s.col.clone().fill_(N))),
                         rf"^col holds node index {N} at position 0")
    big = s.col.clone()
    big[5] = 2**40  # would wrap to a valid int32 index
    assert_raises_naming(lambda: OPS["csr_fma"][0](compiled, s.replace(col=big)),
                         rf"^col holds node index {2**40} at position 5")


# --------------------------------------------------------------------- the triton ops --

@pytest.fixture
def triton_api():
    if not tb.available("cpu"):
        pytest.skip("the Triton kernels run on CPU tensors only in the interpreter "
                    "(TRITON_INTERPRET=1; tests/conftest.py sets it when there is no GPU)")
    return tk


@pytest.mark.parametrize("op,changes,regex", face_cases())
def test_triton_ops(triton_api, valid, op, changes, regex):
    call = OPS[op][0]
    assert_raises_naming(lambda: call(triton_api, valid.replace(**changes)), regex)


@pytest.mark.parametrize("op,changes,regex", face_cases())
def test_torch_ops(valid, op, changes, regex):
    """backend="torch" runs the compiled ops' shape checks too (a rowptr one entry too long
    was accepted, one too short ended in torch.sparse's 'mat1 and mat2 shapes cannot be
    multiplied')."""
    call = OPS[op][0]
    assert_raises_naming(lambda: call(torch_passes, valid.replace(**changes)), regex)


def test_torch_passes(valid):
    """backend="torch": the same shared check before its passes (a bad col would otherwise
    reach torch.sparse with check_invariants=False)."""
    bad = valid.replace(col=valid.col.clone().index_fill_(0, torch.tensor([3]), 57))
    for op in ("neural_edge_weights", "csr_fma", "neural_weight_grad"):
        assert_raises_naming(lambda: OPS[op][0](torch_passes, bad),
                             r"^col holds node index 57 at position 3")
    assert_raises_naming(lambda: torch_passes.implicit_diffusion(
        bad.rowptr, bad.col, bad.a, bad.x, bad.chi, bad.p, bad.q, None, mu=3.0, max_iter=3),
        r"^col holds node index 57 at position 3")


def test_solvers_entry(valid):
    bad = valid.replace(rowptr=valid.rowptr.clone().index_fill_(0, torch.tensor([N]), 999))
    for solver in ("fixed_point", "anderson"):
        assert_raises_naming(lambda: solvers.implicit_diffusion(
            bad.rowptr, bad.col, bad.a, bad.x, bad.chi, bad.p, bad.q, mu=3.0, solver=solver,
            t_rowptr=bad.t_rowptr, t_col=bad.t_col, t_perm=bad.t_perm),
            rf"^rowptr\[-1\] = 999 but col has {bad.m} entries")


# ------------------------------------------------------------------------------ CUDA --

@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("op,changes,regex", all_cases())
def test_cuda_ops(valid, op, changes, regex):
    """The same bad graphs on CUDA tensors: an exception, not an illegal memory access (which
    would also break every later CUDA test)."""
    dev = torch.device("cuda")
    s = valid.replace(**changes).to(dev)
    assert_raises_naming(lambda: OPS[op][0](face("cuda"), s), regex)
    torch.cuda.synchronize()  # the context is still usable
    OPS[op][0](face("cuda"), valid.to(dev))
    torch.cuda.synchronize()


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("op,changes,regex", face_cases())
def test_cuda_triton_ops(valid, op, changes, regex):
    if not tb.available("cuda"):
        pytest.skip("the triton package is not installed")
    s = valid.replace(**changes).to("cuda")
    assert_raises_naming(lambda: OPS[op][0](tk, s), regex)


# ------------------------------------------------------------------- trusted=True --

@pytest.fixture
def spy(monkeypatch):
    """Counts the calls of the O(edges) check (every backend's Python face goes through
    dignn_kernels.ops.check_graph)."""
    calls = []
    real = checks.check_graph

    def counting(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)
    monkeypatch.setattr(checks, "check_graph", counting)
    return calls


@pytest.mark.parametrize("api,op", [("ops", op) for op in OPS] +
                         [(api, op) for api in ("triton", "torch") for op in FACE_OPS])
def test_trusted_skips_the_check(valid, spy, api, op):
    module = {"ops": compiled, "triton": tk, "torch": torch_passes}[api]
    if api == "triton" and not tb.available("cpu"):
        pytest.skip("the Triton kernels run on CPU tensors only in the interpreter")
    call = OPS[op][0]
    call(module, valid, trusted=True)
    assert spy == []
    call(module, valid)
    assert len(spy) == 1


def test_trusted_op_reaches_the_kernel_unchecked(valid, spy):
    """trusted=True really skips the data check: a graph with rowptr[0] = 1 (harmless here:
    it only drops row 0's first edge) is not refused."""
    s = valid.replace(rowptr=valid.rowptr.clone().index_fill_(0, torch.tensor([0]), 1))
    OPS["csr_fma"][0](compiled, s, trusted=True)
    assert spy == []
    with pytest.raises(RuntimeError, match=r"rowptr\[0\] = 1 but must be 0"):
        OPS["csr_fma"][0](compiled, s)


@pytest.mark.parametrize("solver", ["fixed_point", "cg", "anderson"])
def test_solvers_check_once(valid, spy, solver):
    """solvers.implicit_diffusion checks its graph once, never per sweep; forward and
    backward."""
    x, ei, _ = make_graph("symmetric", n=N)
    g = dk.build_graph(ei, N)
    a, deg = g.values(torch.float64)
    x = x.double().requires_grad_()
    p = torch.randn(N, 2, dtype=torch.float64) * 0.3
    z, _ = solvers.implicit_diffusion(g.rowptr, g.col, a, x, deg, p, p.clone(), mu=3.0,
                                      max_iter=30, tol=1e-10, solver=solver)
    z.sum().backward()
    assert len(spy) == 1
    solvers.implicit_diffusion(g.rowptr, g.col, a, x, deg, p, p.clone(), mu=3.0, max_iter=30,
                               solver=solver, trusted=True)[0].sum().backward()
    assert len(spy) == 1


def _backends():
    out = ["cpu", "torch"]
    if tb.available("cpu"):
        out.append("triton")
    return out


@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("solver", ["fixed_point", "cg"])
@pytest.mark.parametrize("laplacian", ["neural", "rw"])
def test_layer_never_checks_a_cached_graph(spy, backend, solver, laplacian):
    """The layer's graphs come from build_graph (node indices checked there, once per graph):
    no forward or backward runs the O(edges) check, on the first call or on a cache hit."""
    x, ei, w = make_graph("weighted", n=N)
    layer = make_layer(x.size(1), laplacian=laplacian, backend=backend, solver=solver)
    for _ in range(2):
        xr = x.clone().requires_grad_()
        layer(xr, ei, w).sum().backward()
    assert spy == []


def test_layer_checks_a_hand_made_graph_once(spy):
    x, ei, w = make_graph("symmetric", n=N)
    built = dk.build_graph(ei, N)
    layer = make_layer(x.size(1))
    layer(x, built)
    assert spy == []  # built by build_graph: valid by construction
    hand = CSRGraph(num_nodes=N, rowptr=built.rowptr.clone(), col=built.col.clone(),
                    value=built.value, degree=built.degree, symmetric=True)
    layer(x, hand)
    layer(x, hand)
    assert len(spy) == 1
    broken = CSRGraph(num_nodes=N, rowptr=built.rowptr, col=built.col.clone().fill_(N),
                      value=built.value, degree=built.degree, symmetric=True)
    with pytest.raises(RuntimeError, match=rf"^col holds node index {N} at position 0"):
        layer(x, broken)


def test_sparse_adjacency_indices_checked_once():
    x, ei, w = make_graph("weighted", n=N, dtype=torch.float32)
    adj = torch.sparse_coo_tensor(ei.flip(0), w, (N, N), check_invariants=True)
    layer = make_layer(x.size(1), dtype=torch.float32)
    layer(x, adj)
    bad = torch.sparse_coo_tensor(torch.tensor([[0, 1], [1, N + 5]]), torch.ones(2), (N, N),
                                  check_invariants=False)
    with pytest.raises(IndexError, match=rf"the sparse adjacency holds column index {N + 5} "
                                         rf"but x has {N} nodes"):
        layer(x, bad)


def test_message_is_one_line(valid):
    with pytest.raises(RuntimeError) as info:
        OPS["csr_fma"][0](ops, valid.replace(col=valid.col.clone().fill_(-3)))
    assert first_line(info.value).startswith("col holds node index -3 at position 0")
