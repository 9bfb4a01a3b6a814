"""Bad CSR graphs and the message each must raise, for every op that takes a CSR.

Shared by tests/test_op_validation.py (the CPU ops, the triton backend, CUDA) and
tests/test_cuda_emulated.py (the GPU host code in the kernels' emulator). An op is called
through a face ``api`` (tests/backend_faces.py: dignn_kernels.ops with ``backend=``, the solve
entry) with the signatures of dignn_kernels.ops; every case must raise RuntimeError naming
the argument.
"""
import dataclasses
import re

import torch

from gpu_op_cases import graph_case

N = 20  # nodes of the test graph
MU, EPS = 3.0, 1e-6


@dataclasses.dataclass
class Inputs:
    """Valid inputs of every op on one directed graph (so the transposed CSR is used)."""

    rowptr: torch.Tensor
    col: torch.Tensor
    t_rowptr: torch.Tensor
    t_col: torch.Tensor
    t_perm: torch.Tensor
    a: torch.Tensor
    w: torch.Tensor
    grad_w: torch.Tensor
    p: torch.Tensor
    q: torch.Tensor
    chi: torch.Tensor
    kappa: torch.Tensor
    x: torch.Tensor
    z: torch.Tensor
    v: torch.Tensor
    cy: torch.Tensor
    rs: torch.Tensor

    @property
    def m(self) -> int:
        return self.col.numel()

    def replace(self, **changes) -> "Inputs":
        return dataclasses.replace(self, **changes)

    def to(self, device) -> "Inputs":
        return dataclasses.replace(self, **{f.name: getattr(self, f.name).to(device)
                                            for f in dataclasses.fields(self)})


def inputs(dtype=torch.float64) -> Inputs:
    c = graph_case("directed", n=N, d=3, h=2, dtype=dtype)
    t_rowptr, t_col, t_perm = c.t
    return Inputs(rowptr=c.rowptr, col=c.col, t_rowptr=t_rowptr, t_col=t_col, t_perm=t_perm,
                  a=c.a, w=c.w, grad_w=c.grad_w, p=c.p, q=c.q, chi=c.chi, kappa=c.kappa,
                  x=c.x, z=c.z, v=c.v, cy=c.cy, rs=c.rs)


def strided(s: Inputs) -> Inputs:
    """The inputs with every CSR tensor a non-contiguous view."""
    view = lambda t: torch.stack([t, t], dim=1)[:, 0]  # noqa: E731
    return s.replace(**{k: view(getattr(s, k))
                        for k in ("rowptr", "col", "t_rowptr", "t_col", "t_perm")})


# op -> (call(api, s, **kw), its CSR's (rowptr, col) fields, its node signal's field, whether
# it takes the transposed CSR)
OPS = {
    "neural_edge_weights": (
        lambda api, s, **kw: api.neural_edge_weights(s.rowptr, s.col, s.a, s.p, s.q, EPS, **kw),
        ("rowptr", "col"), "p", False),
    "neural_edge_weights_backward": (
        lambda api, s, **kw: api.neural_edge_weights_backward(
            s.rowptr, s.col, s.a, s.p, s.q, EPS, s.grad_w, s.t_rowptr, s.t_col, s.t_perm, **kw),
        ("rowptr", "col"), "p", True),
    "diffusion_step": (
        lambda api, s, **kw: api.diffusion_step(s.rowptr, s.col, s.w, s.chi, s.kappa, s.x, s.z,
                                                MU, **kw),
        ("rowptr", "col"), "x", False),
    "csr_fma": (
        lambda api, s, **kw: api.csr_fma(s.rowptr, s.col, s.w, s.z, s.x, s.cy, s.rs, **kw),
        ("rowptr", "col"), "z", False),
    "neural_weight_grad": (
        lambda api, s, **kw: api.neural_weight_grad(s.rowptr, s.col, s.a, s.p, s.q, s.z, s.v,
                                                    EPS, s.t_rowptr, s.t_col, s.t_perm, **kw),
        ("rowptr", "col"), "z", True),
    "implicit_diffusion": (
        lambda api, s, **kw: api.implicit_diffusion(
            s.rowptr, s.col, s.a, s.x, s.chi, s.p, s.q, None, mu=MU, eps=EPS, max_iter=3,
            tol=0.0, t_rowptr=s.t_rowptr, t_col=s.t_col, t_perm=s.t_perm, **kw),
        ("rowptr", "col"), "x", True),
}

# The node signal's name in the messages (csr_fma's y is the tests' z).
NODE_NAME = {"csr_fma": "y"}


def _set(t: torch.Tensor, index: int, value) -> torch.Tensor:
    t = t.clone()
    t[index] = value
    return t


def _swapped(t: torch.Tensor, i: int, j: int) -> torch.Tensor:
    t = t.clone()
    t[[i, j]] = t[[j, i]]
    return t


def _decreasing(rp: torch.Tensor):
    """rowptr with rowptr[i] > rowptr[i + 1] at the first i where rowptr[i] > 0."""
    i = int(torch.nonzero(rp > 0)[0]) if bool((rp > 0).any()) else 1
    i = max(i, 1)
    bad = _set(rp, i + 1, int(rp[i]) - 1)
    return bad, i, int(rp[i]), int(rp[i]) - 1


def cases(op: str):
    """(id, changes to Inputs, regex of the message) of every bad graph for ``op``."""
    _, (rp, cl), node, transposed = OPS[op]
    node_name = NODE_NAME.get(op, node)
    s = inputs()
    rowptr, col, m = getattr(s, rp), getattr(s, cl), s.m
    out = [
        ("col_out_of_range", {cl: _set(col, 3, 57)},
         rf"^{cl} holds node index 57 at position 3, outside 0\.\.{N - 1} \(the graph has {N} "
         rf"nodes\)"),
        ("col_negative", {cl: _set(col, 0, -1)}, rf"^{cl} holds node index -1 at position 0,"),
        ("rowptr_last", {rp: _set(rowptr, -1, m + 1)},
         rf"^{rp}\[-1\] = {m + 1} but {cl} has {m} entries"),
        ("rowptr_first", {rp: _set(rowptr, 0, 1)}, rf"^{rp}\[0\] = 1 but must be 0"),
        ("rowptr_short", {rp: rowptr[:-1]},
         rf"^{rp} has {N - 1} \+ 1 entries for {N - 1} rows but {node_name} has {N} rows"),
        ("rowptr_long", {rp: torch.cat([rowptr, rowptr[-1:]])},
         rf"^{rp} has {N + 1} \+ 1 entries for {N + 1} rows but {node_name} has {N} rows"),
        ("node_rows", {node: getattr(s, node)[:-1]},
         rf"^{rp} has {N} \+ 1 entries for {N} rows but {node_name} has {N - 1} rows"),
    ]
    bad, i, hi, lo = _decreasing(rowptr)
    out.append(("rowptr_decreasing", {rp: bad},
                rf"^{rp} must be non-decreasing \({rp}\[{i}\] = {hi} > {rp}\[{i + 1}\] = {lo}\)"))
    if transposed:
        t_bad, i, hi, lo = _decreasing(s.t_rowptr)
        dup = int(s.t_perm[0])
        out += [
            ("t_col_out_of_range", {"t_col": _set(s.t_col, 2, N)},
             rf"^t_col holds node index {N} at position 2, outside 0\.\.{N - 1}"),
            ("t_rowptr_decreasing", {"t_rowptr": t_bad},
             rf"^t_rowptr must be non-decreasing \(t_rowptr\[{i}\] = {hi} > "
             rf"t_rowptr\[{i + 1}\] = {lo}\)"),
            ("t_rowptr_last", {"t_rowptr": _set(s.t_rowptr, -1, m + 1)},
             rf"^t_rowptr\[-1\] = {m + 1} but t_col has {m} entries"),
            ("t_rowptr_short", {"t_rowptr": s.t_rowptr[:-1]},
             rf"^t_rowptr has {N} entries but rowptr has {N + 1}"),
            ("t_perm_out_of_range", {"t_perm": _set(s.t_perm, 1, m)},
             rf"^t_perm holds edge index {m} at position 1, outside 0\.\.{m - 1} \(the graph "
             rf"has {m} edges\)"),
            ("t_perm_duplicate", {"t_perm": _set(s.t_perm, 1, dup)},
             rf"^t_perm must be a permutation of 0\.\.{m - 1}, but {dup} appears at positions 0 "
             rf"and 1"),
            # a permutation, but not the transpose's: each edge would get another's value
            ("t_perm_not_the_transpose", {"t_perm": _swapped(s.t_perm, 0, m - 1)},
             rf"^t_perm\[0\] = {int(s.t_perm[-1])} but CSR entry {int(s.t_perm[-1])} is "
             rf"\(row \d+, column {int(s.col[s.t_perm[-1]])}\), while entry 0 of the "
             rf"transposed CSR \(row 0 of t_rowptr, t_col\[0\] = {int(s.t_col[0])}\) .*: "
             rf"t_rowptr, t_col and t_perm must be the transpose of \(rowptr, col\); make them "
             rf"with dignn_kernels\.graph\.transpose_csr"),
            ("t_col_not_the_transpose", {"t_col": _set(s.t_col, 0, (int(s.t_col[0]) + 1) % N)},
             rf"^t_perm\[0\] = {int(s.t_perm[0])} but CSR entry {int(s.t_perm[0])} is .*"
             rf"t_col\[0\] = {(int(s.t_col[0]) + 1) % N}\) .*must be the transpose"),
        ]
    return out


def all_cases():
    """pytest params (op, changes, regex) of every op and bad graph."""
    import pytest
    return [pytest.param(op, changes, regex, id=f"{op}-{name}")
            for op in OPS for name, changes, regex in cases(op)]


def first_line(err: BaseException) -> str:
    """The message without the C++ source location torch may append."""
    return str(err).splitlines()[0] if str(err) else ""


def assert_raises_naming(call, regex: str) -> None:
    """``call()`` raises RuntimeError whose message matches ``regex`` (and not an IndexError
    from a kernel, a segfault, or a message about another argument)."""
    try:
        call()
    except RuntimeError as err:
        assert re.search(regex, first_line(err)), f"{first_line(err)!r} !~ {regex!r}"
        return
    raise AssertionError(f"no RuntimeError, expected {regex!r}")
