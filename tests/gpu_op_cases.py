"""Every torch.ops.dignn op on one graph, run by a GPU implementation and by the CPU kernels.

Shared by tests/test_cuda.py (the CUDA kernels on a GPU) and tests/test_cuda_emulated.py (the
same kernels run by the host emulator of csrc/cuda/simt.cuh). A *runner* is a function
``run(op_name, *args) -> tuple of CPU tensors`` that moves the CPU arguments to its device,
calls the op there and brings the outputs back.
"""
import pytest
import torch

import dignn_kernels as dk
from dignn_kernels.graph import transpose_csr
from conftest import make_graph, rel_err

OP_NAMES = ["neural_edge_weights", "neural_edge_weights_backward", "diffusion_step", "csr_fma",
            "neural_weight_grad", "implicit_diffusion", "implicit_diffusion_backward"]


def hub_graph(n=400, directed=None, seed=0, extra=3):
    """A graph whose node 0 is linked with every other node (row 0 has n - 1 neighbours, far
    beyond one segment of the GPU kernels: a heavy row) plus `extra` random edges per node.
    directed=None: both ways; "in": only j -> 0 (row 0 of the CSR is heavy); "out": only
    0 -> j (row 0 of the transposed CSR is heavy)."""
    g = torch.Generator().manual_seed(seed)
    others = torch.arange(1, n)
    hub = torch.zeros_like(others)
    into = torch.stack([others, hub])  # j -> 0: row 0 aggregates from every j
    e = torch.randint(0, n, (2, extra * n), generator=g)
    e = e[:, e[0] != e[1]]
    if directed is None:
        ei = torch.cat([into, into.flip(0), e, e.flip(0)], dim=1)
    elif directed == "in":
        ei = torch.cat([into, e], dim=1)
    else:
        ei = torch.cat([into.flip(0), e], dim=1)
    return ei


class OpInputs:
    """CPU inputs of every op for one graph: CSR, transposed CSR, features and projections."""

    def __init__(self, edge_index, n, d, h, dtype, seed=0, edge_weight=None, zero_chi_rows=False,
                 col_dtype=torch.int32):
        gen = torch.Generator().manual_seed(seed + 1)
        self.graph = g = dk.build_graph(edge_index, n, edge_weight)
        self.rowptr = g.rowptr
        self.col = g.col.to(col_dtype)
        self.symmetric = g.symmetric
        t = transpose_csr(g.rowptr, g.col, n)
        self.t = (t[0], t[1].to(col_dtype), t[2])
        self.t_opt = (None, None, None) if g.symmetric else self.t
        self.a, deg = g.values(dtype)
        rnd = lambda *shape: torch.randn(*shape, generator=gen, dtype=dtype)  # noqa: E731
        self.x, self.z, self.v, self.g = rnd(n, d), rnd(n, d), rnd(n, d), rnd(n, d)
        self.p, self.q = 0.5 * rnd(n, h), 0.5 * rnd(n, h)
        self.chi = deg * torch.tanh(self.p.norm(dim=1))
        if zero_chi_rows:
            self.chi[::5] = 0.0
        self.cy, self.rs = rnd(n), rnd(n)
        self.grad_w = rnd(self.col.numel())
        self.mu, self.eps = 3.0, 1e-6
        self.w, self.kappa = torch.ops.dignn.neural_edge_weights(self.rowptr, self.col, self.a,
                                                                 self.p, self.q, self.eps)

    def calls(self, max_iter=8, tol=0.0, storage=None):
        """(op name, args) for every op, with the variants that take other kernel paths
        (``storage``: the solves' storage_dtype)."""
        s = self
        rp, cl, t, to = s.rowptr, s.col, s.t, s.t_opt
        solve = (s.mu, s.eps, max_iter, tol)
        z_star = torch.ops.dignn.implicit_diffusion(rp, cl, s.a, s.x, s.chi, s.p, s.q, None,
                                                    *solve, *to)[0]
        w_sym, kappa_sym = s.graph.fixed_laplacian("sym", s.x.dtype)[0], None
        out = [
            ("neural_edge_weights", (rp, cl, s.a, s.p, s.q, s.eps)),
            ("neural_edge_weights_backward", (rp, cl, s.a, s.p, s.q, s.eps, s.grad_w, *t)),
            ("diffusion_step", (rp, cl, s.w, s.chi, s.kappa, s.x, s.z, s.mu)),
            ("csr_fma", (rp, cl, s.w, s.z, s.x, s.cy, s.rs)),
            ("neural_weight_grad", (rp, cl, s.a, s.p, s.q, s.z, s.v, s.eps, *to)),
            ("implicit_diffusion", (rp, cl, s.a, s.x, s.chi, s.p, s.q, None, *solve, *to,
                                    storage)),
            ("implicit_diffusion", (rp, cl, w_sym, s.x, s.chi, None, None, kappa_sym, *solve,
                                    *to, storage)),
            ("implicit_diffusion", (rp, cl, s.w, s.x, s.chi, None, None, s.kappa, *solve, *to,
                                    storage)),
            ("implicit_diffusion_backward", (rp, cl, s.a, s.w, s.kappa, *to, s.x, s.chi, s.p,
                                             s.q, z_star, s.g, *solve, storage)),
            ("implicit_diffusion_backward", (rp, cl, s.w, s.w, s.kappa, *to, s.x, s.chi, None,
                                             None, z_star, s.g, *solve, storage)),
        ]
        if s.symmetric:  # the transposed path of the gradient pass on a symmetric graph too
            out.append(("neural_weight_grad", (rp, cl, s.a, s.p, s.q, s.z, s.v, s.eps, *t)))
        return out


def cpu_run(name, *args):
    out = getattr(torch.ops.dignn, name)(*args)
    return out if isinstance(out, tuple) else (out,)


def check_stats(got, want, dtype, where):
    """[iterations, ||Z_t - Z_t-1||, relative]: the same count; residuals equal up to the
    rounding of the last step (relative to ||Z_t||, as they are differences of iterates)."""
    assert got[0] == want[0], f"{where}: iterations {got.tolist()} vs {want.tolist()}"
    res, rel = float(want[1]), float(want[2])
    norm = res / rel if rel > 0 else 0.0
    eps = 1e-13 if dtype == torch.float64 else 1e-5
    assert abs(float(got[1]) - res) <= 1e-6 * res + eps * norm, \
        f"{where}: {got.tolist()} vs {want.tolist()}"
    assert abs(float(got[2]) - rel) <= 1e-6 * rel + eps, \
        f"{where}: {got.tolist()} vs {want.tolist()}"


def check_against_cpu(run, inputs, max_iter=8, tol=0.0, context=""):
    """Runs every op with `run` and with the CPU kernels and compares the outputs: close for
    float64 and float32 values, equal iteration counts, close residuals."""
    dtype = inputs.x.dtype
    value_tol = 1e-12 if dtype == torch.float64 else 5e-5
    for name, args in inputs.calls(max_iter, tol):
        got = run(name, *args)
        want = cpu_run(name, *args)
        assert len(got) == len(want), (context, name)
        for k, (a, b) in enumerate(zip(got, want)):
            where = f"{context} {name} output {k}"
            assert a.shape == b.shape and a.dtype == b.dtype, where
            assert a.device.type == "cpu", where
            if name.startswith("implicit_diffusion") and k == len(want) - 1:  # stats
                check_stats(a, b, dtype, where)
                continue
            assert torch.isfinite(a).all(), where
            err = rel_err(a, b)
            assert err < value_tol, f"{where}: relative error {err:.3g}"


# Graph kinds of conftest.make_graph plus heavy-row graphs; (n, d, h) per case.
def graph_case(kind, n=24, d=5, h=4, dtype=torch.float64, seed=0, col_dtype=torch.int32):
    if kind.startswith("hub"):
        directed = {"hub": None, "hub_in": "in", "hub_out": "out"}[kind]
        ei = hub_graph(n, directed, seed)
        return OpInputs(ei, n, d, h, dtype, seed, col_dtype=col_dtype)
    x, ei, w = make_graph(kind, n=n, d=d, seed=seed, dtype=dtype)
    return OpInputs(ei, x.size(0), d, h, dtype, seed, edge_weight=w,
                    zero_chi_rows=kind == "zero_rows", col_dtype=col_dtype)


# ------------------------------------------------------------------ 16-bit storage --
# float32 values that 16-bit rounding has to get right: NaN, infinities, float16 overflow, ties,
# subnormals (mixed into b of the row pass, where they reach the output).
SPECIAL_VALUES = torch.tensor([float("nan"), float("inf"), -float("inf"), 3.4e38, 65504.0,
                               65520.0, 70000.0, 1.00390625, 1.01171875, 6e-8, 3e-8, -1.5e-5,
                               1e-40, 2.9e-39])


def same_bits(x, y):
    """x and y (16-bit) equal bit for bit, any NaN equal to any NaN (the payload a device's
    conversion gives NaN differs from the CPU's)."""
    return bool(((x.view(torch.int16) == y.view(torch.int16)) | (x.isnan() & y.isnan())).all())


def check_storage16(run, inputs, storage_dtype, grad_tol=0.0, context=""):
    """The 16-bit passes (csrc/ops/storage.h) of a GPU implementation (``run``) on float32
    ``inputs``:

    - against its own float32 passes on the widened inputs: the kernels widen every load
      exactly and sum in the same order, so the row pass's 16-bit output equals bit for bit its
      float32 output rounded by torch (special values in b included), with float64 compute too;
      the weights are equal and the gradients equal (``grad_tol`` 0), or within ``grad_tol``
      relative where a compiler may contract products into FMAs differently per instantiation;
    - against the CPU kernels' 16-bit passes: the row pass within one 16-bit ulp (the float32
      sums differ in order), the gradients to 1e-5.
    """
    s = inputs
    sd = storage_dtype
    assert s.x.dtype == torch.float32
    gen = torch.Generator().manual_seed(7)
    rp, cl = s.rowptr, s.col
    y, z, v, p, q = (t.to(sd) for t in (s.z, s.z.flip(0), s.v, s.p, s.q))
    pick = torch.randint(0, len(SPECIAL_VALUES), s.x.shape, generator=gen)
    b = torch.where(torch.rand(s.x.shape, generator=gen) < 0.3, SPECIAL_VALUES[pick], s.x)

    def row(w, y_, b_, cy, rs):
        return run("csr_fma", rp, cl, w, y_, b_, cy, rs)[0]

    for w in (s.w, torch.zeros_like(s.w)):  # zero weights: out = b + cy.y, special values kept
        out = row(w, y, b, s.cy, s.rs)
        assert out.dtype == sd and same_bits(out, row(w, y.float(), b, s.cy, s.rs).to(sd)), \
            context
    b16 = s.x.to(sd)  # b in 16 bits: widened before the pass
    assert same_bits(row(s.w, y, b16, s.cy, s.rs), row(s.w, y.float(), b16.float(), s.cy,
                                                        s.rs).to(sd)), context
    d64 = [t.double() for t in (s.w, s.x, s.cy, s.rs)]  # float64 compute: rounded once
    out64 = row(d64[0], y, *d64[1:])
    assert out64.dtype == sd and same_bits(out64, row(d64[0], y.double(), *d64[1:]).to(sd)), \
        context
    out_cpu = cpu_run("csr_fma", rp, cl, s.w, y, s.x, s.cy, s.rs)[0]
    out = row(s.w, y, s.x, s.cy, s.rs)
    ulp = torch.finfo(sd).eps * out_cpu.float().abs().clamp_min(1e-3)
    assert bool(((out.float() - out_cpu.float()).abs() <= ulp).all()), context

    def close(got, want, tol):
        return all(a.dtype == torch.float32 and
                   (torch.equal(a, b_) if tol == 0 else rel_err(a, b_) <= tol)
                   for a, b_ in zip(got, want))

    weights = run("neural_edge_weights", rp, cl, s.a, p, q, s.eps)
    assert close(weights, run("neural_edge_weights", rp, cl, s.a, p.float(), q.float(), s.eps),
                 0.0), context
    for t in (s.t_opt, s.t):  # as the graph needs it, and with the transposed CSR
        args16 = (rp, cl, s.a, p, q, z, v, s.eps, *t)
        got = run("neural_weight_grad", *args16)
        wide = run("neural_weight_grad", rp, cl, s.a, p.float(), q.float(), z.float(),
                   v.float(), s.eps, *t)
        assert close(got, wide, grad_tol), context
        assert close(got, cpu_run("neural_weight_grad", *args16), 1e-5), context
    other = torch.float16 if sd == torch.bfloat16 else torch.bfloat16
    mixed = run("neural_weight_grad", rp, cl, s.a, p, q, z, v.to(other), s.eps, *s.t_opt)
    assert close(mixed, run("neural_weight_grad", rp, cl, s.a, p.float(), q.float(), z.float(),
                            v.to(other).float(), s.eps, *s.t_opt), 0.0), context  # widened


def check_fused_storage16(run, inputs, storage_dtype, context=""):
    """The fused solves with 16-bit iterates (csrc/ops/solve.h) of a GPU implementation
    (``run``) against the CPU kernels' on float32 ``inputs``: forward (neural and fixed
    weights) and backward, with a fixed number of iterations, with two (no stored sweep) and
    stopping early (where the device flag decides, and the wide last iteration is counted after
    the one that converged: launch_finalize_step). The same iteration counts; z, the weights and
    the gradients in float32, within a rounding of the storage dtype (the float32 sums differ
    in order, so a rounding may flip), and not equal to the float32 solve's."""
    s = inputs
    assert s.x.dtype == torch.float32
    tol16 = torch.finfo(storage_dtype).eps
    for max_iter, tol in ((6, 0.0), (2, 0.0), (80, 1e-2)):
        for name, args in s.calls(max_iter, tol, storage=storage_dtype):
            if not name.startswith("implicit_diffusion"):
                continue
            where = f"{context} {name} max_iter={max_iter} tol={tol}"
            got, want = run(name, *args), cpu_run(name, *args)
            assert [(a.dtype, a.shape) for a in got] == [(b.dtype, b.shape) for b in want], where
            assert all(a.dtype == s.x.dtype for a in got[:-1]), where
            *values, stats = got
            assert stats[0] == want[-1][0], f"{where}: {stats.tolist()} {want[-1].tolist()}"
            assert (stats[0] < max_iter) == (tol > 0), f"{where}: {stats.tolist()}"
            assert abs(float(stats[2] - want[-1][2])) <= tol16 * float(want[-1][2]) + 1e-7, \
                f"{where}: {stats.tolist()} {want[-1].tolist()}"
            for k, (a, b) in enumerate(zip(values, want)):
                assert torch.isfinite(a).all() and rel_err(a, b) <= tol16, (where, k)
            float32 = cpu_run(name, *args[:-1], None)
            assert rel_err(values[0], float32[0]) > 1e-7, where  # stored in 16 bits


# The row product's kernel paths: (graph kind, d, dtype).
ROW_PRODUCT_CASES = [
    ("hub", 8, torch.float32),         # heavy rows (products from the combine kernel); float4
    ("hub_in", 5, torch.float64),      # a heavy row in one direction only
    ("directed", 1, torch.float64),    # one channel: groups of 4 lanes, mostly idle
    ("symmetric", 64, torch.float32),  # the benchmark's width: float4, groups of 8
    ("hub_out", 300, torch.float32),   # two channel blocks of a 32-lane group: two launches
    ("zero_rows", 70, torch.float64),  # float64 wider than one channel block
    ("isolated", 6, torch.float32),    # scalar channels (6 is no multiple of 4), empty rows
    ("single_node", 3, torch.float64),
]


def check_row_product(ops_ns, case, device, exact, context=""):
    """The row product of ``ops_ns`` (``csr_schedule``, ``row_product``, ``csr_fma``:
    torch.ops.dignn on ``device``, or the emulated build on the CPU): its output is the row
    pass of the same kernels with b = 0 (bit for bit where ``exact``; else to 4 ulp, as a GPU
    may fuse either product of cy y + rs (W y) into an FMA) and matches the CPU kernels; its
    dots match a float64 sum of that output times y (the exact products summed in float64,
    then rounded to y's dtype); a second call gives the same dots bit for bit; once the flag
    is set (the first element of a view into a longer flags tensor) nothing is written and the
    dots are 0."""
    s = case
    rp, cl, w, cy, rs, y = (t.to(device) for t in (s.rowptr, s.col, s.w, s.cy, s.rs, s.z))
    graph = (rp, cl, w, cy, rs, ops_ns.csr_schedule(rp, cl))
    flags = torch.zeros(4, dtype=torch.float64, device=device)
    flags[0] = 1.0  # not the flag: the product reads the first element of its view
    done = flags[2:3]
    out = torch.full_like(y, float("nan"))
    dots = ops_ns.row_product(*graph, y, out, done)
    assert dots.shape == (y.shape[1],) and dots.dtype == y.dtype, context
    same = ops_ns.csr_fma(rp, cl, w, y, torch.zeros_like(y), cy, rs)
    if exact:
        assert torch.equal(out, same), context
    else:
        ulp = torch.finfo(y.dtype).eps * same.abs().clamp_min(torch.finfo(y.dtype).tiny)
        assert ((out - same).abs() <= 4 * ulp).all(), context
    cpu = torch.ops.dignn.csr_fma(s.rowptr, s.col, s.w, s.z, torch.zeros_like(s.z), s.cy, s.rs)
    assert rel_err(out.cpu(), cpu) < (1e-12 if y.dtype == torch.float64 else 5e-6), context
    terms = out.cpu().double() * s.z.double()
    want = terms.sum(0)
    bound = 1e-13 * terms.abs().sum(0) + torch.finfo(y.dtype).eps * want.abs()
    assert ((dots.cpu().double() - want).abs() <= bound).all(), context
    assert torch.equal(ops_ns.row_product(*graph, y, torch.empty_like(y), done), dots), context
    flags[2] = 1.0
    kept = torch.full_like(y, 7.0)
    assert torch.equal(ops_ns.row_product(*graph, y, kept, done), torch.zeros_like(dots)), \
        context
    assert (kept == 7.0).all(), context


def check_row_product_errors(ops_ns, device):
    """Bad arguments of the row product raise naming the argument and the fix."""
    case = graph_case("symmetric", n=12, d=3)
    rp, cl, w, cy, rs, y = (t.to(device) for t in (case.rowptr, case.col, case.w, case.cy,
                                                   case.rs, case.z))
    schedule = ops_ns.csr_schedule(rp, cl)
    done = torch.zeros(1, dtype=torch.float64, device=device)
    out = torch.empty_like(y)
    other = graph_case("hub", n=30, d=3)  # another graph's schedule
    bad = [
        ((w.long(), cy, rs, schedule, y, out, done), "w must be float32 or float64"),
        ((w, cy[:-1], rs, schedule, y, out, done), r"cy must have shape \[12\]"),
        ((w, cy, rs.float(), schedule, y, out, done), "rs must have dtype"),
        ((w, cy, rs, schedule + [rp], y, out, done),
         r"schedule must be csr_schedule\(rowptr, col\) of this graph"),
        ((w, cy, rs, schedule, y.float(), out, done), r"y must be a \[12, d\] tensor of w's "
                                                      "dtype"),
        ((w, cy, rs, schedule, y[:-1], out[:-1], done), r"y must be a \[12, d\] tensor"),
        ((w, cy, rs, schedule, y, y, done), "out must not be y"),
        ((w, cy, rs, schedule, y, out[:, :2], done), "out must be a contiguous buffer like y"),
        ((w, cy, rs, schedule, y, y.new_empty(3, 12).t(), done),
         r"\(not contiguous\): pass torch.empty_like\(y\)"),
        ((w, cy, rs, schedule, y, out, done.float()), "done must be a float64 flag tensor"),
        ((w, cy, rs, schedule, y, out, done[:0]), "done must be a float64 flag tensor"),
    ]
    if schedule:  # a device with a schedule (the GPU): one of another size
        bad.append(((w, cy, rs, ops_ns.csr_schedule(other.rowptr.to(device),
                                                    other.col.to(device)), y, out, done),
                    "schedule must be csr_schedule"))
    for args, regex in bad:
        with pytest.raises(RuntimeError, match=regex):
            ops_ns.row_product(rp, cl, *args)


def check_row_product_of_nothing(ops_ns):
    """No rows, or no channels: dots of zeros, out (empty, or of no channels) untouched."""
    for n, d in ((0, 3), (5, 0)):
        rowptr = torch.zeros(n + 1, dtype=torch.long)
        col = torch.zeros(0, dtype=torch.long)
        w = torch.zeros(0, dtype=torch.float64)
        ones = torch.ones(n, dtype=torch.float64)
        y = torch.ones(n, d, dtype=torch.float64)
        dots = ops_ns.row_product(rowptr, col, w, ones, ones, ops_ns.csr_schedule(rowptr, col),
                                  y, torch.empty_like(y), torch.zeros(1, dtype=torch.float64))
        assert torch.equal(dots, torch.zeros(d, dtype=torch.float64))


def check_scheduled_row_pass(ops_ns, case, device, context=""):
    """``csr_fma`` on the graph's ``csr_schedule`` (a solve's sweeps: made once) is the same
    op on a schedule made in the call, bit for bit (the same kernels on the same segments),
    with iterates in the compute dtype and in bfloat16; an empty graph takes its empty
    schedule."""
    s = case
    rp, cl, w, y, b, cy, rs = (t.to(device) for t in (s.rowptr, s.col, s.w, s.z, s.x, s.cy,
                                                      s.rs))
    schedule = ops_ns.csr_schedule(rp, cl)
    ys = [y] + ([y.bfloat16()] if w.dtype == torch.float32 else [])
    for yy in ys:
        made = ops_ns.csr_fma(rp, cl, w, yy, b, cy, rs)
        assert torch.equal(ops_ns.csr_fma(rp, cl, w, yy, b, cy, rs, schedule), made), \
            (context, yy.dtype)
    rowptr = torch.zeros(1, dtype=torch.long, device=device)
    col = torch.zeros(0, dtype=torch.long, device=device)
    none = torch.zeros(0, dtype=torch.float64, device=device)
    empty = torch.zeros(0, 3, dtype=torch.float64, device=device)
    assert ops_ns.csr_fma(rowptr, col, none, empty, empty, none, none,
                          ops_ns.csr_schedule(rowptr, col)).shape == (0, 3), context


def check_scheduled_row_pass_errors(ops_ns, device):
    """A schedule that is not the graph's raises naming it and the fix."""
    case = graph_case("symmetric", n=12, d=3)
    rp, cl, w, y, b, cy, rs = (t.to(device) for t in (case.rowptr, case.col, case.w, case.z,
                                                      case.x, case.cy, case.rs))
    schedule = ops_ns.csr_schedule(rp, cl)
    other = graph_case("hub", n=30, d=3)
    bad = [schedule + [rp]]
    if schedule:  # a device with a schedule (the GPU): one of another graph and size
        bad.append(ops_ns.csr_schedule(other.rowptr.to(device), other.col.to(device)))
    for wrong in bad:
        with pytest.raises(RuntimeError, match=r"schedule must be csr_schedule\(rowptr, col\) "
                                               r"of this graph .*pass csr_schedule"):
            ops_ns.csr_fma(rp, cl, w, y, b, cy, rs, wrong)
