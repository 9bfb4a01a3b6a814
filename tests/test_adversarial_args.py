"""Adversarial arguments (issue 32 B): every argument of the public ops, the solve entry,
build_graph, CSRGraph and the layer, given the wrong type, device, shape, dtype or range, must
raise an error naming it, on every backend (the compiled CPU ops, backend="torch", the Triton
kernels in their interpreter); and random corruptions of a CSR and its transpose must be
refused naming the corrupted argument, or, where the corruption leaves a valid CSR, give the
dense float64 answer (dignn_kernels.reference).

Each case raises before any kernel runs, so the whole file takes a few seconds; the valid
cases run on graphs of a few nodes (the Triton interpreter is slow).
"""
import math
import re

import pytest
import torch

import dignn_kernels as dk
from dignn_kernels import ops, reference
from dignn_kernels.backends import triton as tb
from dignn_kernels.graph import CSRGraph, transpose_csr
from bad_graphs import EPS, MU, N, inputs
from test_cuda_emulated import emu  # noqa: F401 (the fixture: the CUDA ops' host emulator)

BACKENDS = ["cpu", "torch"] + (["triton"] if tb.available("cpu") else [])
ERRORS = (RuntimeError, TypeError, ValueError, IndexError)


def first_line(err: BaseException) -> str:
    return str(err).splitlines()[0] if str(err) else ""


def assert_names(call, name: str, errors=ERRORS) -> str:
    """call() raises one of ``errors`` whose first line names ``name`` (a whole word)."""
    with pytest.raises(errors) as info:
        call()
    line = first_line(info.value)
    assert re.search(rf"(?<![\w.]){re.escape(name)}(?!\w)", line), \
        f"{type(info.value).__name__}: {line!r} does not name {name!r}"
    return line


# ----------------------------------------------------------------- the op table --
# op -> its arguments in order: (name in the messages, field of bad_graphs.Inputs or a
# maker of the value); "=" marks a scalar. The ops with backend= take it as a keyword.

def _out(s):
    return torch.empty_like(s.z)


def _done(s):
    return torch.zeros(1, dtype=torch.float64)


OPS = {
    "neural_edge_weights": [("rowptr", "rowptr"), ("col", "col"), ("a", "a"), ("p", "p"),
                            ("q", "q"), ("=eps", EPS)],
    "neural_edge_weights_backward": [("rowptr", "rowptr"), ("col", "col"), ("a", "a"),
                                     ("p", "p"), ("q", "q"), ("=eps", EPS),
                                     ("grad_w", "grad_w"), ("t_rowptr", "t_rowptr"),
                                     ("t_col", "t_col"), ("t_perm", "t_perm")],
    "diffusion_step": [("rowptr", "rowptr"), ("col", "col"), ("w", "w"), ("chi", "chi"),
                       ("kappa", "kappa"), ("x", "x"), ("z", "z"), ("=mu", MU)],
    "csr_fma": [("rowptr", "rowptr"), ("col", "col"), ("w", "w"), ("y", "z"), ("b", "x"),
                ("cy", "cy"), ("rs", "rs")],
    "row_product": [("rowptr", "rowptr"), ("col", "col"), ("w", "w"), ("cy", "cy"),
                    ("rs", "rs"), ("=schedule", []), ("y", "z"), ("out", _out),
                    ("done", _done)],
    "neural_weight_grad": [("rowptr", "rowptr"), ("col", "col"), ("a", "a"), ("p", "p"),
                           ("q", "q"), ("z", "z"), ("v", "v"), ("=eps", EPS),
                           ("t_rowptr", "t_rowptr"), ("t_col", "t_col"), ("t_perm", "t_perm")],
    # the solve entry: (rowptr, col, edge_value, x, chi, p, q, kappa, *, mu, ...)
    "implicit_diffusion": [("rowptr", "rowptr"), ("col", "col"), ("edge_value", "a"),
                           ("x", "x"), ("chi", "chi"), ("p", "p"), ("q", "q"),
                           ("t_rowptr", "t_rowptr"), ("t_col", "t_col"), ("t_perm", "t_perm")],
}
WITH_BACKEND = {"neural_edge_weights", "diffusion_step", "csr_fma", "neural_weight_grad",
                "implicit_diffusion"}
# the arguments each op may take in 16 bits (with the others in the compute dtype)
STORAGE16 = {"neural_edge_weights": {"p", "q"}, "csr_fma": {"y", "b"},
             "neural_weight_grad": {"p", "q", "z", "v"}}
INDEX = {"rowptr", "col", "t_rowptr", "t_col", "t_perm"}
TRITON_OPS = {"neural_edge_weights", "neural_edge_weights_backward", "csr_fma",
              "neural_weight_grad"}


def arguments(op, s, **changes):
    """(positional tensors, scalars) of ``op`` on the inputs ``s``, with ``changes`` by name."""
    args = {}
    for name, source in OPS[op]:
        key = name.lstrip("=")
        if key in changes:
            args[key] = changes[key]
        elif callable(source):
            args[key] = source(s)
        elif isinstance(source, str):
            args[key] = getattr(s, source)
        else:
            args[key] = source
    return args


def call(op, backend, s, trusted=False, **changes):
    """``op`` through the public face on ``backend`` ("cpu": the compiled ops)."""
    a = arguments(op, s, **changes)
    if op == "implicit_diffusion":
        return dk.implicit_diffusion(
            a["rowptr"], a["col"], a["edge_value"], a["x"], a["chi"], a["p"], a["q"], None,
            mu=changes.get("mu", MU), eps=changes.get("eps", EPS), max_iter=3, tol=0.0,
            t_rowptr=a["t_rowptr"], t_col=a["t_col"], t_perm=a["t_perm"], backend=backend,
            trusted=trusted, solver="fixed_point")
    kwargs = {"trusted": trusted}
    if op in WITH_BACKEND:
        kwargs["backend"] = None if backend == "cpu" else backend
    return getattr(ops, op)(*a.values(), **kwargs)


def raw(namespace, op, s, **changes):
    """``op`` called directly on the registered op (torch.ops.dignn or dignn_triton)."""
    return getattr(namespace, op)(*arguments(op, s, **changes).values())


def face_params(ops_=None):
    """(op, backend) of every op on every backend that has it."""
    out = []
    for op in ops_ or OPS:
        for backend in BACKENDS:
            if backend == "cpu" or op in WITH_BACKEND:
                out.append(pytest.param(op, backend, id=f"{op}-{backend}"))
    return out


@pytest.fixture(scope="module")
def valid():
    return inputs()


def _tensor_args(op):
    return [name for name, source in OPS[op] if not name.startswith("=")
            and name not in ("out", "done")]


# --------------------------------------------- issue 32 B.1: a stray meta tensor --

@pytest.mark.parametrize("op,backend", face_params())
def test_one_meta_tensor_is_refused_naming_it(valid, op, backend):
    """One argument on the meta device (the rest on the CPU): the dispatcher picked the fake
    kernel, whose uninitialized outputs came back as results (neural_edge_weights gave
    5.08e-36 for 0.186). Every tensor argument, every backend."""
    for name in _tensor_args(op) + (["out", "done"] if op == "row_product" else []):
        value = arguments(op, valid)[name]
        line = assert_names(lambda: call(op, backend, valid, **{name: value.to("meta")}),
                            name)
        assert "meta" in line, line


@pytest.mark.parametrize("op", list(OPS)[:-1])
def test_one_meta_tensor_direct_op(valid, op):
    """The registered ops called directly: their fake kernels check the devices (also what
    torch.compile's fake tensors go through)."""
    spaces = [torch.ops.dignn] + ([torch.ops.dignn_triton] if op in TRITON_OPS else [])
    for namespace in spaces:
        for name in _tensor_args(op):
            value = arguments(op, valid)[name]
            line = assert_names(lambda: raw(namespace, op, valid, **{name: value.to("meta")}),
                                name, RuntimeError)
            assert "meta" in line, line


def test_one_meta_tensor_direct_solve_op(valid):
    """The differentiable solve op called directly (its fake kernel picked for a stray meta
    tensor returned empty results)."""
    s = valid
    args = dict(rowptr=s.rowptr, col=s.col, edge_value=s.a, x=s.x, chi=s.chi, p=s.p, q=s.q,
                kappa=None, t_rowptr=s.t_rowptr, t_col=s.t_col, t_perm=s.t_perm,
                diag_index=None)
    for name in ("col", "edge_value", "chi", "q", "t_perm"):
        bad = dict(args, **{name: args[name].to("meta")})
        line = assert_names(lambda: torch.ops.dignn.implicit_solve(
            *bad.values(), MU, EPS, 3, 0.0, "fixed_point", "cpu", -1, 5), name, RuntimeError)
        assert "meta" in line, line


@pytest.mark.parametrize("op", list(OPS)[:-1])
def test_none_tensor_direct_op(valid, op):
    """None for a Tensor argument reaches the compiled ops as an undefined tensor: it read as
    shape [0] ("p must be 2-D ..., got shape [0]") or failed in device() without a name."""
    for name in _tensor_args(op) + (["out", "done"] if op == "row_product" else []):
        if op == "neural_weight_grad" and name.startswith("t_"):
            continue  # optional: None is a symmetric graph ("go together" names all three)
        line = assert_names(lambda: raw(torch.ops.dignn, op, valid, **{name: None}), name,
                            RuntimeError)
        assert line.startswith(f"{name} must be a tensor, got None"), line


def test_check_graph_on_meta_names_rowptr(valid):
    """Cannot copy out of meta tensor: the data check now says why and what to do."""
    s = valid
    line = assert_names(lambda: ops.check_graph(s.rowptr.to("meta"), s.col.to("meta"), N),
                        "rowptr", RuntimeError)
    assert "meta device" in line and "trusted=True" in line
    with pytest.raises(RuntimeError, match="col is on meta but rowptr is on cpu"):
        torch.ops.dignn.check_graph(s.rowptr, s.col.to("meta"), N)
    for name in ("t_rowptr", "t_col", "t_perm"):
        t = {k: getattr(s, k) for k in ("t_rowptr", "t_col", "t_perm")}
        t[name] = t[name].to("meta")
        assert_names(lambda: ops.check_graph(s.rowptr, s.col, N, **t), name, RuntimeError)
        assert_names(lambda: torch.ops.dignn.check_graph(s.rowptr, s.col, N, **t), name,
                     RuntimeError)
    # all on meta with trusted=True: shape inference, no values to check
    w, kappa = ops.neural_edge_weights(*(t.to("meta") for t in (s.rowptr, s.col, s.a, s.p,
                                                                s.q)), trusted=True)
    assert w.device.type == "meta" and w.shape == s.a.shape and kappa.shape == (N,)


# ------------------------------------ issue 32 B.1: t_perm that is not the transpose --

@pytest.mark.parametrize("backend", BACKENDS)
def test_permutation_not_the_transpose(valid, backend):
    """A valid permutation that is not the transpose's gave gradients 0.81 off without an
    error; every backend, and the op the compiled backward takes it in."""
    s = valid
    bad = s.t_perm.clone()
    bad[[0, -1]] = bad[[-1, 0]]
    for op in ("neural_weight_grad", "implicit_diffusion") + (
            ("neural_edge_weights_backward",) if backend == "cpu" else ()):
        line = assert_names(lambda: call(op, backend, s, t_perm=bad), "t_perm", RuntimeError)
        assert "transpose_csr" in line and "CSRGraph.transposed()" in line
    # and the transposed CSR's own arrays, each consistent with the others but not with col
    t_rowptr, t_col, t_perm = transpose_csr(s.rowptr, torch.roll(s.col, 1), N)
    assert_names(lambda: call("neural_weight_grad", backend, s, t_rowptr=t_rowptr, t_col=t_col,
                              t_perm=t_perm), "t_perm", RuntimeError)


# -------------------------------------------------- issue 32 B.1: scalar arguments --

BAD_POSITIVE = [0, 0.0, -1, math.nan, math.inf, -math.inf, True, False, None, "1e-6", [1e-6],
                torch.tensor(1e-6), 1j]


@pytest.mark.parametrize("op,backend", face_params(["neural_edge_weights",
                                                    "neural_edge_weights_backward",
                                                    "neural_weight_grad", "diffusion_step",
                                                    "implicit_diffusion"]))
def test_bad_scalars(valid, op, backend):
    """eps (mu for diffusion_step, both for the solve) must be a finite number > 0: 0, -1,
    nan, inf, True, None were accepted by neural_weight_grad (inf and True by the backward),
    or failed in float() without naming it."""
    names = {"diffusion_step": ["mu"], "implicit_diffusion": ["mu", "eps"]}.get(op, ["eps"])
    for name in names:
        for value in BAD_POSITIVE:
            assert_names(lambda: call(op, backend, valid, **{name: value}), name, ValueError)


def test_bad_solve_scalars(valid):
    s = valid
    base = dict(mu=MU, eps=EPS, max_iter=3, tol=0.0)
    bad = {"tol": [-1e-3, math.nan, math.inf, True, None, "0"],
           "max_iter": [0, -1, 2.5, True, None, "3", 2**64],
           "check_every": [-1, 1.5, True, "1"], "window": [0, 2.5, True],
           "trusted": ["no", 1, None], "host_checks": ["no", 1],
           "solver": ["gmres", None], "backend": ["gpu", 3],
           "storage_dtype": ["bfloat16", torch.int8]}
    for name, values in bad.items():
        for value in values:
            kwargs = dict(base, **{name: value})
            assert_names(lambda: dk.implicit_diffusion(s.rowptr, s.col, s.a, s.x, s.chi, s.p,
                                                       s.q, **kwargs), name)


@pytest.mark.parametrize("value", [0.0, -1.0, math.nan, math.inf, -math.inf])
def test_cpp_scalars_finite(valid, value):
    """The C++ checks for direct callers of torch.ops.dignn: eps > 0 and finite everywhere it
    is taken (neural_weight_grad checked none), mu likewise, tol >= 0 and finite."""
    s = valid
    t = (s.t_rowptr, s.t_col, s.t_perm)
    calls = {
        "eps": [lambda: torch.ops.dignn.neural_edge_weights(s.rowptr, s.col, s.a, s.p, s.q, value),
                lambda: torch.ops.dignn.neural_weight_grad(s.rowptr, s.col, s.a, s.p, s.q, s.z,
                                                           s.v, value, *t),
                lambda: torch.ops.dignn.neural_edge_weights_backward(
                    s.rowptr, s.col, s.a, s.p, s.q, value, s.grad_w, *t),
                lambda: torch.ops.dignn.implicit_diffusion(
                    s.rowptr, s.col, s.a, s.x, s.chi, s.p, s.q, None, MU, value, 3, 0.0, *t)],
        "mu": [lambda: torch.ops.dignn.diffusion_step(s.rowptr, s.col, s.w, s.chi, s.kappa,
                                                      s.x, s.z, value),
               lambda: torch.ops.dignn.implicit_diffusion(
                   s.rowptr, s.col, s.a, s.x, s.chi, s.p, s.q, None, value, EPS, 3, 0.0, *t)],
    }
    if value < 0 or math.isinf(value) or math.isnan(value):
        calls["tol"] = [lambda: torch.ops.dignn.implicit_diffusion(
            s.rowptr, s.col, s.a, s.x, s.chi, s.p, s.q, None, MU, EPS, 3, value, *t)]
    if tb.available("cpu"):
        calls["eps"] += [
            lambda: torch.ops.dignn_triton.neural_edge_weights(s.rowptr, s.col, s.a, s.p, s.q,
                                                               value),
            lambda: torch.ops.dignn_triton.neural_weight_grad(s.rowptr, s.col, s.a, s.p, s.q,
                                                              s.z, s.v, value, *t)]
    for name, fns in calls.items():
        for fn in fns:
            line = assert_names(fn, name, RuntimeError)
            assert "finite" in line, line


# -------------------------------- issue 32 B.1/B.2: shapes on every backend, named --

def _bad_tensors(op, name, t):
    """(label, value) of wrong values of the tensor argument ``name`` (valid: ``t``)."""
    out = [("None", None), ("list", t.tolist()), ("ndim", t.unsqueeze(0)),
           ("short", t[:-1]), ("long", torch.cat([t, t[-1:]])), ("empty", t[:0])]
    if name in INDEX:
        out += [("float", t.double()), ("bool", t.bool()), ("int16", t.to(torch.int16))]
        if name == "rowptr":
            out.append(("int32", t.int()))
    else:
        out += [("int", t.long()), ("bool", t.bool()), ("complex", t.to(torch.complex128))]
        if name not in STORAGE16.get(op, ()):
            out.append(("float16", t.half()))
    if name in ("out", "done"):
        out = [(label, v) for label, v in out if label not in ("long", "short", "ndim")
               or name == "out"]
    return out


@pytest.mark.parametrize("op,backend", face_params())
def test_bad_tensors_named(valid, op, backend):
    """Every tensor argument of every op, replaced by None, a list, one of another ndim, too
    short, too long, empty, or of a wrong dtype: an error naming it on every backend (the
    torch backend used to skip the shape checks and fail inside torch.sparse)."""
    n_cases = 0
    for name in _tensor_args(op) + (["out", "done"] if op == "row_product" else []):
        valid_value = arguments(op, valid)[name]
        for label, value in _bad_tensors(op, name, valid_value):
            if op == "implicit_diffusion" and name in ("p", "q") and value is None:
                continue  # p and q None together is the fixed Laplacian: "go together" names both
            if op == "neural_weight_grad" and name.startswith("t_") and value is None:
                continue  # the transposed CSR is optional: "go together" names all three
            if name == "done" and label in ("long", "empty"):
                continue  # longer done is fine (its first element is the flag)
            try:
                assert_names(lambda: call(op, backend, valid, **{name: value}), name)
            except AssertionError as err:
                raise AssertionError(f"{op} {name} {label}: {err}") from None
            n_cases += 1
    assert n_cases > 10


def test_row_product_short_rowptr_names_rowptr(valid):
    """It blamed cy."""
    s = valid
    for fn in (ops.row_product, torch.ops.dignn.row_product):
        line = assert_names(lambda: fn(s.rowptr[:-1], s.col, s.w, s.cy, s.rs, [], s.z,
                                       torch.empty_like(s.z), _done(s)), "rowptr", RuntimeError)
        assert line.startswith("rowptr has 19 + 1 entries for 19 rows but y has 20 rows"), line


@pytest.mark.parametrize("op,backend", face_params(["neural_edge_weights", "csr_fma",
                                                    "diffusion_step", "neural_weight_grad"]))
def test_non_contiguous_arguments(valid, op, backend):
    """Each tensor argument as a strided view: the result of the contiguous call."""
    want = call(op, backend, valid)
    want = want if isinstance(want, tuple) else (want,)
    for name in _tensor_args(op):
        t = arguments(op, valid)[name]
        view = torch.stack([t, t], dim=-1)[..., 0]
        assert not view.is_contiguous()
        got = call(op, backend, valid, **{name: view})
        for a, b in zip(want, got if isinstance(got, tuple) else (got,)):
            assert torch.allclose(a, b, rtol=1e-12, atol=1e-14), (op, name)


def test_backend_on_another_device(valid):
    """backend="cuda" on CPU tensors ran the CPU kernels under the name."""
    s = valid
    with pytest.raises(RuntimeError, match="backend='cuda' cannot run on cpu"):
        ops.csr_fma(s.rowptr, s.col, s.w, s.z, s.x, s.cy, s.rs, backend="cuda")
    with pytest.raises(RuntimeError, match="backend='cuda' cannot run on cpu"):
        dk.implicit_diffusion(s.rowptr, s.col, s.a, s.x, s.chi, s.p, s.q, mu=MU,
                              backend="cuda")
    with pytest.raises(ValueError, match="backend must be one of"):
        ops.csr_fma(s.rowptr, s.col, s.w, s.z, s.x, s.cy, s.rs, backend="gpu")


def test_diag_index(valid):
    """The solve entry's diag_index: shape, dtype and (untrusted) its values."""
    x, ei, _ = __import__("conftest").make_graph("self_loops", n=12)
    g = dk.build_graph(ei, 12)
    a, deg = g.values(torch.float64)
    args = (g.rowptr, g.col, a, x, deg, None, None, deg)
    good = g.diagonal_index()
    dk.implicit_diffusion(*args, mu=MU, solver="cg", diag_index=good)
    for bad, match in [(good[:-1], r"diag_index must be an int64 tensor of shape \[12\]"),
                       (good.int(), "diag_index must be an int64"),
                       (torch.roll(good, 1), r"diag_index\[0\] = .* but row 0's self-loop"),
                       ([0] * 12, "diag_index must be a torch.Tensor or None")]:
        with pytest.raises(ERRORS, match=match):
            dk.implicit_diffusion(*args, mu=MU, solver="cg", diag_index=bad)


def test_trusted_must_be_a_bool(valid):
    """trusted="no" is truthy: it skipped the data check."""
    s = valid
    bad_col = s.col.clone().fill_(N)
    for value in ("no", 1, None, "False"):
        assert_names(lambda: ops.csr_fma(s.rowptr, bad_col, s.w, s.z, s.x, s.cy, s.rs,
                                         trusted=value), "trusted", TypeError)


def test_anderson_record_arguments():
    v = torch.zeros(6, 4)
    w = torch.zeros(3, 6, 4)
    args = dict(gy_new=v, y_new=v.clone(), f=v.clone(), gy=v.clone(), d_f=w, d_g=w.clone(),
                slot=0, count=1)
    for name in ("gy_new", "f", "d_g"):
        assert_names(lambda: ops.anderson_record(**dict(args, **{name: None})), name)
        assert_names(lambda: ops.anderson_record(**dict(args, **{name: args[name].to("meta")})),
                     name, RuntimeError)
    for name, value in (("slot", 0.0), ("count", True), ("slot", None)):
        assert_names(lambda: ops.anderson_record(**dict(args, **{name: value})), name)


# ---------------------------------------------------- build_graph, CSRGraph, layer --

@pytest.mark.parametrize("num_nodes,exc", [(-1, ValueError), (2.5, TypeError), ("20", TypeError),
                                           (True, TypeError), (None, TypeError),
                                           (torch.tensor(20), TypeError),
                                           (2**40, ValueError)])
def test_build_graph_num_nodes(num_nodes, exc):
    """They ended in IndexError, 'negative dimension', bincount's minlength or a '>='
    TypeError; 2**40 nodes overflow the build's int64 edge keys."""
    ei = torch.tensor([[0, 1], [1, 0]])
    assert_names(lambda: dk.build_graph(ei, num_nodes), "num_nodes", exc)
    adj = torch.sparse_coo_tensor(ei, torch.ones(2), (2, 2), check_invariants=True)
    assert_names(lambda: dk.build_graph(adj, num_nodes), "num_nodes", exc)


def test_build_graph_other_arguments():
    ei = torch.tensor([[0, 1, 2], [1, 2, 0]])
    for edge, name in [(None, "edge_index"), (ei.tolist(), "edge_index"),
                       (ei.to("meta"), "edge_index"), (ei.double(), "edge_index"),
                       (ei[0], "edge_index"), (ei.t(), "edge_index")]:
        assert_names(lambda: dk.build_graph(edge, 3), name)
    for weight in (torch.ones(2), torch.ones(3).to("meta"), torch.ones(3, dtype=torch.long),
                   [1.0, 1.0, 1.0], torch.tensor([1.0, math.nan, 1.0]),
                   torch.tensor([1.0, -1.0, 1.0]), torch.ones(3, 1),
                   torch.ones(3, dtype=torch.complex64)):
        assert_names(lambda: dk.build_graph(ei, 3, weight), "edge_weight")
    assert_names(lambda: dk.build_graph(ei, 3, reorder="fast"), "reorder")


def test_csr_graph_methods():
    x, ei, w = __import__("conftest").make_graph("weighted", n=10)
    g = dk.build_graph(ei, 10, w, reorder="rcm")
    for bad in (torch.int64, "float32", None, torch.bool):
        assert_names(lambda: g.values(bad), "dtype", TypeError)
        assert_names(lambda: g.fixed_laplacian("rw", bad), "dtype", TypeError)
    assert_names(lambda: g.fixed_laplacian("neural", torch.float64), "laplacian", ValueError)
    for fn, name in ((g.to_graph_order, "x"), (g.to_user_order, "z")):
        for bad in (x[:-1], torch.cat([x, x[:1]]), x.tolist(), None):
            assert_names(lambda: fn(bad), name)
    hand = CSRGraph(num_nodes=11, rowptr=g.rowptr, col=g.col, value=g.value, degree=g.degree,
                    symmetric=g.symmetric)
    assert_names(lambda: hand.check(), "num_nodes", RuntimeError)


@pytest.mark.parametrize("name,values", [
    ("mu", [None, True, "2", math.inf, 0]), ("eps", [None, True, -1e-6, math.nan]),
    ("tol", [None, True, -1.0, math.inf]), ("max_iter", [None, True, 0, 2.0, 2**64]),
    ("in_channels", [None, True, 0, 4.0]), ("metric_channels", [True, 0, 2.5]),
    ("check_every", [True, -1, 1.0]), ("laplacian", [None, "normalized"]),
    ("backend", [None, "gpu"]), ("solver", [None, "gmres"]), ("sync_checks", ["yes", 1]),
    ("storage_dtype", ["bfloat16", torch.int8]), ("reorder", [3, "fast"])])
def test_layer_constructor(name, values):
    for value in values:
        kwargs = dict(in_channels=4, **{name: value}) if name != "in_channels" else \
            dict(in_channels=value)
        assert_names(lambda: dk.FusedImplicitDiffusion(**kwargs), name, ValueError)


def test_layer_forward_arguments():
    x, ei, w = __import__("conftest").make_graph("weighted", n=12, d=4, dtype=torch.float32)
    layer = dk.FusedImplicitDiffusion(4)
    cases = [((None, ei, w), "x"), ((x.tolist(), ei, w), "x"), ((x.long(), ei, w), "x"),
             ((x.to(torch.complex64), ei, w), "x"), ((x[:, :3], ei, w), "x"), ((x[0], ei, w), "x"),
             ((x.to("meta"), ei, w), "x"), ((x, None, w), "edge_index"),
             ((x, ei.float(), w), "edge_index"), ((x, ei[:1], w), "edge_index"),
             ((x, ei, w[:-1]), "edge_weight"), ((x, ei, w.long()), "edge_weight"),
             ((x, ei, w.tolist()), "edge_weight"), ((x, ei, w.to("meta")), "edge_weight")]
    bad = ei.clone()
    bad[0, 0] = 12
    cases.append(((x, bad, w), "edge_index"))
    for args, name in cases:
        assert_names(lambda: layer(*args), name)


# ------------------------------------------------ random corruptions of a CSR --

def _random_graph(gen, n, m):
    """A coalesced CSR of n nodes and about m random edges, with its transpose."""
    keys = torch.unique(torch.randint(0, n * n, (m,), generator=gen))
    rows, cols = keys // n, keys % n
    rowptr = torch.zeros(n + 1, dtype=torch.long)
    rowptr[1:] = torch.cumsum(torch.bincount(rows, minlength=n), 0)
    col = cols.to(torch.int32)
    return rowptr, col, transpose_csr(rowptr, col, n)


def _corrupt(kind, gen, rowptr, col, t):
    """(changes, the argument the error must name; None: still a valid CSR and transpose)."""
    n, m = rowptr.numel() - 1, col.numel()
    t_rowptr, t_col, t_perm = (x.clone() for x in t)
    rowptr, col = rowptr.clone(), col.clone()
    r = lambda hi: int(torch.randint(0, max(hi, 1), (1,), generator=gen))  # noqa: E731
    if kind == "rowptr_first":
        rowptr[0] = 1 + r(3)
        return dict(rowptr=rowptr), "rowptr"
    if kind == "rowptr_decreasing":
        i = r(n)
        rowptr[i + 1] = rowptr[i] - 1 - r(2)
        return dict(rowptr=rowptr), "rowptr"
    if kind == "rowptr_last":
        rowptr[n] = m + 1 + r(4) if r(2) else max(m - 1 - r(2), -1)
        return dict(rowptr=rowptr), "rowptr"
    if kind == "col_range":
        col[r(m)] = n + r(5) if r(2) else -1 - r(5)
        return dict(col=col), "col"
    if kind == "col_huge":
        col = col.long()
        col[r(m)] = 2**33 + r(5)
        return dict(col=col), "col"
    if kind == "t_perm_range":
        t_perm[r(m)] = m + r(3) if r(2) else -1
        return dict(t_perm=t_perm), "t_perm"
    if kind == "t_perm_duplicate":
        i, j = r(m), r(m)
        j = (i + 1 + j % (m - 1)) % m
        t_perm[j] = t_perm[i]
        return dict(t_perm=t_perm), "t_perm"
    if kind == "t_perm_swap":
        i, j = r(m), r(m)
        j = (i + 1 + j % (m - 1)) % m
        t_perm[[i, j]] = t_perm[[j, i]]
        return dict(t_perm=t_perm), "t_perm"
    if kind == "t_col":
        k = r(m)
        t_col[k] = (int(t_col[k]) + 1 + r(n - 1)) % n if r(4) else n + r(3)
        return dict(t_col=t_col), "t_col"
    if kind == "t_rowptr":
        # an interior offset moved, still non-decreasing: the rows no longer match col
        movable = [j for j in range(1, n) if t_rowptr[j - 1] < t_rowptr[j + 1]]
        if movable:
            j = movable[r(len(movable))]
            lo, hi = int(t_rowptr[j - 1]), int(t_rowptr[j + 1])
            choices = [v for v in range(lo, hi + 1) if v != int(t_rowptr[j])]
            t_rowptr[j] = choices[r(len(choices))]
        else:
            t_rowptr[n] = m + 1
        return dict(t_rowptr=t_rowptr), "t_rowptr"
    if kind == "rowptr_moved":
        # valid: an interior offset moved (edges change rows), with the transpose rebuilt
        movable = [i for i in range(1, n) if rowptr[i - 1] < rowptr[i + 1]]
        if movable:
            i = movable[r(len(movable))]
            rowptr[i] = int(rowptr[i - 1]) + r(int(rowptr[i + 1] - rowptr[i - 1]) + 1)
    elif kind == "col_moved":
        if m:  # valid: a column changed to another node (may duplicate an entry)
            col[r(m)] = r(n)
    t_rowptr, t_col, t_perm = transpose_csr(rowptr, col, n)
    return dict(rowptr=rowptr, col=col, t_rowptr=t_rowptr, t_col=t_col, t_perm=t_perm), None


KINDS = ["rowptr_first", "rowptr_decreasing", "rowptr_last", "col_range", "col_huge",
         "t_perm_range", "t_perm_duplicate", "t_perm_swap", "t_col", "t_rowptr",
         "rowptr_moved", "col_moved"]
SEEDS = 240  # 20 of each kind


def _oracle_weight_grad(rowptr, col, a, p, q, z, v, eps):
    """dl/dp, dl/dq of sum over edges of G_ij W_ij, G_ij = v_i . (z_j - z_i), by autograd of
    the float64 formula over the edge list (reference.graph_neural_laplacian's eq. 13-14 with
    the projections given)."""
    n = rowptr.numel() - 1
    rows = torch.repeat_interleave(torch.arange(n), rowptr[1:] - rowptr[:-1])
    cols = col.long()
    p, q = p.double().requires_grad_(), q.double().requires_grad_()
    phi = torch.tanh(torch.abs((p[rows] * p[cols]).sum(1)))
    dist = torch.linalg.vector_norm(q[rows] - q[cols], dim=1)
    w = a.double() * torch.tanh(1.0 / (dist + eps)) * phi
    g = (v[rows] * (z[cols] - z[rows])).sum(1)
    return torch.autograd.grad((g * w).sum(), (p, q))


@pytest.mark.parametrize("seed", range(SEEDS))
def test_random_corruptions(seed):
    """A random small CSR (3 to 7 nodes) and its transpose, corrupted one way (KINDS, in
    turn): a RuntimeError naming the corrupted argument from every backend's gradient pass
    and row pass, and from the check itself; where the corruption leaves a valid graph (the
    transpose rebuilt), every backend's answer is the dense float64 one."""
    gen = torch.Generator().manual_seed(seed)
    n = 3 + seed % 5
    rowptr, col, t = _random_graph(gen, n, 2 * n + 2)
    kind = KINDS[seed % len(KINDS)]
    changes, name = _corrupt(kind, gen, rowptr, col, t)
    graph = dict(rowptr=rowptr, col=col, t_rowptr=t[0], t_col=t[1], t_perm=t[2])
    graph.update(changes)
    m = graph["col"].numel()
    d, h = 2, 2
    a = torch.rand(m, generator=gen, dtype=torch.float64) + 0.1
    p, q, z, v, x = (torch.randn(n, k, generator=gen, dtype=torch.float64)
                     for k in (h, h, d, d, d))
    cy, rs = (torch.randn(n, generator=gen, dtype=torch.float64) for _ in range(2))
    grad = lambda backend: ops.neural_weight_grad(  # noqa: E731
        graph["rowptr"], graph["col"], a, p, q, z, v, EPS, graph["t_rowptr"], graph["t_col"],
        graph["t_perm"], backend=backend)
    fma = lambda backend: ops.csr_fma(graph["rowptr"], graph["col"], a, z, x, cy, rs,  # noqa
                                      backend=backend)
    backends = [None, "torch"] + (["triton"] if "triton" in BACKENDS else [])
    if name is not None:
        for backend in backends:
            assert_names(lambda: grad(backend), name, RuntimeError)
            if not name.startswith("t_"):
                assert_names(lambda: fma(backend), name, RuntimeError)
        with pytest.raises(RuntimeError) as info:
            torch.ops.dignn.check_graph(graph["rowptr"], graph["col"], n, graph["t_rowptr"],
                                        graph["t_col"], graph["t_perm"])
        assert re.search(rf"(?<![\w.]){name}(?!\w)", first_line(info.value))
        return
    want_grad = _oracle_weight_grad(graph["rowptr"], graph["col"], a, p, q, z, v, EPS)
    rows = torch.repeat_interleave(torch.arange(n), graph["rowptr"][1:] - graph["rowptr"][:-1])
    edge_index = torch.stack([graph["col"].long(), rows])
    dense = torch.zeros(n, n, dtype=torch.float64).index_put((rows, graph["col"].long()), a,
                                                             accumulate=True)
    want_fma = x + cy[:, None] * z + rs[:, None] * (dense @ z)
    # diffusion_step against the dense Laplacian of the reference (rw: chi = kappa = degree)
    deg = dense.sum(1)
    delta = reference.dense_laplacian(x, edge_index, a, laplacian="rw")
    want_step = x - delta @ z / MU
    for backend in backends:
        for got, want in zip(grad(backend), want_grad):
            assert torch.allclose(got, want, rtol=1e-9, atol=1e-12), (kind, backend)
        assert torch.allclose(fma(backend), want_fma, rtol=1e-12, atol=1e-12), (kind, backend)
        step = ops.diffusion_step(graph["rowptr"], graph["col"], a, deg, deg, x, z, MU,
                                  backend=backend)
        assert torch.allclose(step, want_step, rtol=1e-12, atol=1e-12), (kind, backend)


def test_hand_made_csr_graph_fields():
    """A CSRGraph assembled by hand: its check() covers the fields the layer trusts. A directed
    graph marked symmetric made the kernels read W^T as W (wrong gradients, no error)."""
    x, ei, _ = __import__("conftest").make_graph("directed", n=10, d=4)
    g = dk.build_graph(ei, 10)
    fields = dict(num_nodes=10, rowptr=g.rowptr, col=g.col, value=g.value, degree=g.degree,
                  symmetric=False)
    CSRGraph(**fields).check()
    bad = [(dict(symmetric=True), "symmetric"), (dict(symmetric=1), "symmetric"),
           (dict(value=g.value[:-1]), "value"), (dict(value=g.value.long()), "value"),
           (dict(degree=g.degree * 2), "degree"), (dict(degree=None), "degree"),
           (dict(order=torch.arange(10)), "order"),
           (dict(order=torch.arange(10), position=torch.arange(10).flip(0)), "order"),
           (dict(order=torch.arange(10) + 1, position=torch.arange(10)), "order")]
    for changes, name in bad:
        graph = CSRGraph(**dict(fields, **changes))
        assert_names(graph.check, f"CSRGraph.{name}", (ValueError, TypeError))
        layer = dk.FusedImplicitDiffusion(4, mu=3.0).double()
        assert_names(lambda: layer(x, CSRGraph(**dict(fields, **changes))), f"CSRGraph.{name}",
                     (ValueError, TypeError))


# ------------------------------------------- the CUDA side, in the kernels' emulator --

@pytest.mark.parametrize("seed", range(0, SEEDS, 2))
def test_random_corruptions_on_the_device_check(emu, seed):
    """The GPU version of check_graph (conditions as device ops, one flag read back, then the
    host check for the message) refuses what the CPU op refuses, with its message, and accepts
    what it accepts: the transpose's consistency included."""
    gen = torch.Generator().manual_seed(seed)
    n = 3 + seed % 5
    rowptr, col, t = _random_graph(gen, n, 2 * n + 2)
    changes, name = _corrupt(KINDS[seed % len(KINDS)], gen, rowptr, col, t)
    graph = dict(rowptr=rowptr, col=col, t_rowptr=t[0], t_col=t[1], t_perm=t[2])
    graph.update(changes)
    args = (graph["rowptr"], graph["col"], n, graph["t_rowptr"], graph["t_col"],
            graph["t_perm"])
    if name is None:
        emu.check_graph(*args)
        torch.ops.dignn.check_graph(*args)
        return
    with pytest.raises(RuntimeError) as device:
        emu.check_graph(*args)
    with pytest.raises(RuntimeError) as cpu:
        torch.ops.dignn.check_graph(*args)
    assert first_line(device.value) == first_line(cpu.value)


def test_emulated_scalar_and_shape_checks(emu):
    """The checks the CUDA ops share with the CPU ones (csrc/ops/checks.h), in the emulated
    build: eps, mu and tol finite, eps checked by the gradient pass, a short rowptr named by
    the row product."""
    s = inputs()
    t = (s.t_rowptr, s.t_col, s.t_perm)
    for value in (math.inf, math.nan, 0.0):
        with pytest.raises(RuntimeError, match="eps must be > 0 and finite"):
            emu.neural_weight_grad(s.rowptr, s.col, s.a, s.p, s.q, s.z, s.v, value, *t)
        with pytest.raises(RuntimeError, match="mu must be > 0 and finite"):
            emu.implicit_diffusion(s.rowptr, s.col, s.a, s.x, s.chi, s.p, s.q, None, value,
                                   EPS, 3, 0.0, *t, None)
        with pytest.raises(RuntimeError, match="eps must be > 0 and finite"):
            emu.implicit_diffusion_backward(s.rowptr, s.col, s.a, s.w, s.kappa, *t, s.x, s.chi,
                                            s.p, s.q, s.z, s.z, MU, value, 3, 0.0, None)
    with pytest.raises(RuntimeError, match="tol must be >= 0 and finite"):
        emu.implicit_diffusion(s.rowptr, s.col, s.a, s.x, s.chi, s.p, s.q, None, MU, EPS, 3,
                               math.inf, *t, None)
    with pytest.raises(RuntimeError, match="tol must be >= 0 and finite"):
        emu.implicit_diffusion_backward(s.rowptr, s.col, s.a, s.w, s.kappa, *t, s.x, s.chi,
                                        s.p, s.q, s.z, s.z, MU, EPS, 3, math.nan, None)
    with pytest.raises(RuntimeError, match="p and q go together"):
        emu.implicit_diffusion_backward(s.rowptr, s.col, s.a, s.w, s.kappa, *t, s.x, s.chi,
                                        s.p, None, s.z, s.z, MU, EPS, 3, 0.0, None)
    with pytest.raises(RuntimeError, match=r"^rowptr has 19 \+ 1 entries for 19 rows but y"):
        emu.row_product(s.rowptr[:-1], s.col, s.w, s.cy, s.rs, emu.csr_schedule(s.rowptr,
                                                                                s.col),
                        s.z, torch.empty_like(s.z), _done(s))
