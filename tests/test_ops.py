"""The torch.ops.dignn operators: opcheck, each pass against plain PyTorch, ISA variants."""
import pytest
import torch

import dignn_kernels as dk
from dignn_kernels import laplacian, ops, reference
from dignn_kernels.solvers import implicit_diffusion
from backend_faces import graph_inputs
from conftest import make_graph, rel_err, run_per_instruction_set, wide_range_projections
from gpu_op_cases import (ROW_PRODUCT_CASES, check_row_product, check_row_product_errors,
                          check_row_product_of_nothing, check_scheduled_row_pass,
                          check_scheduled_row_pass_errors, graph_case)

OPS = ["neural_edge_weights", "neural_edge_weights_backward", "diffusion_step", "csr_fma",
       "csr_schedule", "row_product", "neural_weight_grad", "implicit_diffusion",
       "implicit_diffusion_backward", "anderson_record"]
FUSED_SOLVE = {"implicit_diffusion", "implicit_diffusion_backward"}  # no Python face


def paper_edge_weights(g, a, p, q, eps):
    """W_ij of eq. 13-14 from the torch formulas, differentiable."""
    rows, cols = g.rows(), g.col.long()
    pi, _, rho = laplacian.edge_terms(rows, cols, p, q)
    return laplacian.neural_edge_weight(a, pi, rho, eps)


def dense_w(g, w):
    n = g.num_nodes
    m = torch.zeros(n, n, dtype=w.dtype)
    return m.index_put_((g.rows(), g.col.long()), w, accumulate=True)


def test_every_op_is_registered():
    for name in OPS:
        assert hasattr(torch.ops.dignn, name), name
    assert set(OPS) - FUSED_SOLVE <= set(dk.ops.__all__)


@pytest.mark.parametrize("kind", ["symmetric", "directed"])
def test_opcheck_every_op(kind):
    g, x, p, q, a, chi = graph_inputs(kind)
    t = g.transposed() or dk.graph.transpose_csr(g.rowptr, g.col, g.num_nodes)
    w, kappa = ops.neural_edge_weights(g.rowptr, g.col, a, p, q)
    z = torch.randn_like(x)
    v = torch.randn_like(x)
    req = lambda *ts: [u.clone().requires_grad_() for u in ts]  # noqa: E731
    f32 = lambda *ts: [u.float() for u in ts]  # noqa: E731
    cases = {
        "neural_edge_weights": [(g.rowptr, g.col, a, p, q, 1e-6),
                                (g.rowptr, g.col, a, *req(p, q), 1e-6)],
        "neural_edge_weights_backward": [(g.rowptr, g.col, a, p, q, 1e-6, torch.randn_like(w),
                                          *t)],
        "diffusion_step": [(g.rowptr, g.col, w, chi, kappa, x, z, 2.2)],
        "csr_fma": [(g.rowptr, g.col, w, z, x, torch.randn_like(chi), torch.randn_like(chi)),
                    (g.rowptr, g.col, w.float(), z.bfloat16(), x.float(),  # 16-bit storage
                     torch.randn_like(chi).float(), torch.randn_like(chi).float()),
                    (g.rowptr, g.col, w, z, x, chi, kappa,  # on the graph's schedule
                     ops.csr_schedule(g.rowptr, g.col))],
        "csr_schedule": [(g.rowptr, g.col)],
        "row_product": [(g.rowptr, g.col, w, chi, kappa, ops.csr_schedule(g.rowptr, g.col), z,
                         torch.empty_like(z), torch.zeros(1, dtype=torch.float64))],
        "neural_weight_grad": [(g.rowptr, g.col, a, p, q, z, v, 1e-6, *t),
                               (g.rowptr, g.col, a.float(), p.float(), q.float(), z.half(),
                                v.half(), 1e-6, *t)],
        "implicit_diffusion": [  # the fused solve: differentiable through implicit_solve
            (g.rowptr, g.col, a, x, chi, p, q, None, 3.0, 1e-6, 8, 1e-8, *t),
            (g.rowptr, g.col, w, x, chi, None, None, kappa, 3.0, 1e-6, 8, 1e-8),
            (g.rowptr, g.col, *f32(a, x, chi, p, q), None, 3.0, 1e-6, 8, 1e-8, *t,
             torch.bfloat16)],  # 16-bit iterates
        "implicit_diffusion_backward": [
            (g.rowptr, g.col, a, w, kappa, *t, x, chi, p, q, z, torch.randn_like(x), 3.0, 1e-6,
             8, 1e-8),
            (g.rowptr, g.col, *f32(a, w, kappa), *t, *f32(x, chi, p, q, z, v), 3.0, 1e-6, 8,
             1e-8, torch.float16)],
        "anderson_record": [(z, v, x, torch.randn_like(x), torch.randn(3, *x.shape,
                                                                       dtype=x.dtype),
                             torch.randn(3, *x.shape, dtype=x.dtype), 1, 2)],
    }
    assert set(cases) == set(OPS)
    for name, samples in cases.items():
        for args in samples:
            torch.library.opcheck(getattr(torch.ops.dignn, name).default, args)
    # the one differentiable solve op, on the fused loop and on the solvers' loops
    for solver, window in (("fixed_point", 5), ("anderson", 3)):
        torch.library.opcheck(torch.ops.dignn.implicit_solve.default, (
            g.rowptr, g.col, a, *req(x, chi, p, q), None, *t, None, 3.0, 1e-6, 8, 1e-8, solver,
            "cpu", 1, window))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("kind", ["symmetric", "directed", "duplicates", "self_loops"])
def test_neural_edge_weights_match_reference(kind, dtype):
    g, x, p, q, a, chi = graph_inputs(kind, dtype=dtype)
    w, kappa = ops.neural_edge_weights(g.rowptr, g.col, a, p, q, 1e-6)
    want = paper_edge_weights(g, a, p, q, 1e-6)
    tol = 1e-14 if dtype == torch.float64 else 3e-7
    assert rel_err(w, want) < tol
    rows = g.rows()
    assert rel_err(kappa, torch.zeros_like(kappa).index_add_(0, rows, want)) < tol


def test_neural_edge_weights_paper_form():
    """The CSR pass gives the paper's varphi^2 phi (eq. 13-14) computed from x and the
    Thetas, per edge, including duplicate edges."""
    x, ei, w = make_graph("weighted", n=20, d=5)
    g = dk.build_graph(ei, 20, w)
    tc, tp, tv = (0.5 * torch.randn(4, 5, dtype=torch.float64),
                  0.5 * torch.randn(4, 4, dtype=torch.float64),
                  0.5 * torch.randn(4, 5, dtype=torch.float64))
    p, q = x @ tc.T @ tp.T, x @ tv.T
    wk, _ = ops.neural_edge_weights(g.rowptr, g.col, *g.values(torch.float64)[:1], p, q, 1e-6)
    i, j, w_ref, _ = reference.graph_neural_laplacian(x, ei, w, tc, tp, tv, 1e-6)
    dense_ref = torch.zeros(20, 20, dtype=torch.float64).index_put_((i, j), w_ref,
                                                                    accumulate=True)
    assert rel_err(dense_w(g, wk), dense_ref) < 1e-13


@pytest.mark.parametrize("kind", ["symmetric", "directed"])
def test_neural_edge_weights_gradcheck(kind):
    g, x, p, q, a, chi = graph_inputs(kind, n=12, h=3)
    p.requires_grad_()
    q.requires_grad_()
    assert torch.autograd.gradcheck(lambda p, q: ops.neural_edge_weights(
        g.rowptr, g.col, a, p, q, 1e-6), (p, q))


@pytest.mark.parametrize("kind", ["symmetric", "directed", "zero_rows", "isolated"])
def test_steps_match_dense(kind):
    g, x, p, q, a, chi = graph_inputs(kind)  # zero_rows: every fifth row guarded
    mu = 2.2
    z = torch.randn_like(x)
    w, kappa = ops.neural_edge_weights(g.rowptr, g.col, a, p, q)
    wd = dense_w(g, w)
    guard = chi > reference.CHI_FLOOR
    inv_chi = torch.where(guard, 1 / chi, torch.zeros_like(chi))
    delta = inv_chi[:, None] * (torch.diag(kappa) - wd)
    want = x - delta @ z / mu
    cached = ops.diffusion_step(g.rowptr, g.col, w, chi, kappa, x, z, mu)
    assert rel_err(cached, want) < 1e-13


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("d", [1, 5, 16, 67])
def test_csr_fma_matches_dense(d, dtype):
    g, _, p, q, a, chi = graph_inputs("directed", n=40, dtype=dtype)
    w, _ = ops.neural_edge_weights(g.rowptr, g.col, a, p, q)
    y, b = torch.randn(40, d, dtype=dtype), torch.randn(40, d, dtype=dtype)
    cy, rs = torch.randn(40, dtype=dtype), torch.randn(40, dtype=dtype)
    got = ops.csr_fma(g.rowptr, g.col, w, y, b, cy, rs)
    want = b + cy[:, None] * y + rs[:, None] * (dense_w(g, w) @ y)
    assert rel_err(got, want) < (1e-13 if dtype == torch.float64 else 1e-6)


@pytest.mark.parametrize("kind", ["symmetric", "directed", "self_loops"])
def test_neural_weight_grad_matches_autograd(kind):
    """The fused gradient pass equals autograd through the edge weights with
    dl/dW_ij = v_i . (z_j - z_i)."""
    g, x, p, q, a, chi = graph_inputs(kind)
    z, v = torch.randn_like(x), torch.randn_like(x)
    pr, qr = p.clone().requires_grad_(), q.clone().requires_grad_()
    w = paper_edge_weights(g, a, pr, qr, 1e-6)
    rows, cols = g.rows(), g.col.long()
    loss = (w * (v[rows] * (z[cols] - z[rows])).sum(1)).sum()
    gp, gq = torch.autograd.grad(loss, [pr, qr])
    t = g.transposed()
    got_p, got_q = ops.neural_weight_grad(g.rowptr, g.col, a, p, q, z, v, 1e-6,
                                          *(t if t is not None else (None, None, None)))
    assert rel_err(got_p, gp) < 1e-12 and rel_err(got_q, gq) < 1e-12
    if t is None:  # the transposed path gives the same on a symmetric graph
        tt = dk.graph.transpose_csr(g.rowptr, g.col, g.num_nodes)
        alt_p, alt_q = ops.neural_weight_grad(g.rowptr, g.col, a, p, q, z, v, 1e-6, *tt)
        assert rel_err(alt_p, gp) < 1e-12 and rel_err(alt_q, gq) < 1e-12


def test_float32_edge_math_is_accurate():
    """The float32 passes evaluate tanh with their own vectorized code: within a few ulp of
    the float64 math. With h = 1 the dot products are exact, so this measures tanh itself,
    over arguments from 1e-6 to 1e4 (both branches, and the clamp)."""
    n = 4000
    g = dk.build_graph(torch.stack([torch.arange(n), torch.arange(n).roll(1)]), n)
    a, p, q = wide_range_projections(n)
    gen = torch.Generator().manual_seed(1)
    w32, _ = ops.neural_edge_weights(g.rowptr, g.col, a, p, q, 1e-6)
    w64, _ = ops.neural_edge_weights(g.rowptr, g.col, a.double(), p.double(), q.double(), 1e-6)
    err = (w32.double() - w64).abs() / w64.abs()
    assert float(err.max()) < 6e-7  # a few float32 ulp (2^-24 = 6e-8)
    z, v = torch.randn(n, 3, generator=gen), torch.randn(n, 3, generator=gen)
    gp32, gq32 = ops.neural_weight_grad(g.rowptr, g.col, a, p, q, z, v, 1e-6)
    gp64, gq64 = ops.neural_weight_grad(g.rowptr, g.col, a.double(), p.double(), q.double(),
                                        z.double(), v.double(), 1e-6)
    assert rel_err(gp32, gp64) < 1e-6 and rel_err(gq32, gq64) < 1e-6


def test_float32_vectorized_tanh_at_small_distances():
    """Rows of 16+ edges take the float32 passes' vectorized tanh (rows shorter than a vector
    take the scalar path, so the test above does not reach it). Each star's centre has 24
    edges all at one distance rho (h = 1: q_j = q_i - rho, pi = 1) and dl/dW = 1 (d = 1), so its
    dl/dq_i = 24 cq rho is one edge scalar times 24: the float32 value must be the float64 one
    to rounding, also where s = 1/(rho + eps) makes 1 - tanh(s)^2 tiny or zero (it once
    bottomed out at 4 e^-40 for s > 20, rho < 0.05: 10^70 times too large at rho = 0.01)."""
    rhos = torch.tensor([1e-6, 1e-5, 1e-4, 1e-3, 5e-3, 0.01, 0.02, 0.04, 0.06, 0.1, 0.3, 1.0,
                         3.0, 10.0], dtype=torch.float64)
    leaves = 24
    stars = len(rhos)
    n = stars * (leaves + 1)
    centre = torch.arange(stars) * (leaves + 1)
    hub = centre.repeat_interleave(leaves)
    leaf = hub + torch.arange(1, leaves + 1).repeat(stars)
    g = dk.build_graph(torch.stack([leaf, hub]), n)  # messages leaf -> centre: CSR row centre
    q = torch.zeros(n, 1, dtype=torch.float64)
    q[centre, 0] = rhos
    p = torch.ones(n, 1, dtype=torch.float64)
    z = torch.zeros(n, 1, dtype=torch.float64)
    z[leaf, 0] = 1.0  # z_j - z_i = 1 on every edge
    v = torch.zeros(n, 1, dtype=torch.float64)
    v[centre, 0] = 1.0  # dl/dW = v_i . (z_j - z_i) = 1
    a = torch.ones(g.num_edges, dtype=torch.float64)
    t = g.transposed()
    out = {}
    for dt in (torch.float32, torch.float64):
        args = [x.to(dt) for x in (a, p, q, z, v)]
        w, _ = ops.neural_edge_weights(g.rowptr, g.col, args[0], args[1], args[2], 1e-6)
        gp, gq = ops.neural_weight_grad(g.rowptr, g.col, *args, 1e-6, *t)
        out[dt] = (w.double(), gq[centre, 0].double())
    (w32, gq32), (w64, gq64) = out[torch.float32], out[torch.float64]
    assert float(((w32 - w64).abs() / w64.abs()).max()) < 6e-7
    # 1 - tanh(s)^2 ~ 4 exp(-2 s): a float32 s (relative error 2^-24) moves it by 2 s 2^-24
    # relative, so the bound is a few ulp times (2 s + a few); below float32's normal range
    # both are (about) zero
    s = 1.0 / (rhos + 1e-6)
    err = (gq32 - gq64).abs()
    ok = (err <= 2.0 ** -24 * (4 * s + 16) * gq64.abs()) | \
        ((gq64.abs() < 1e-37) & (gq32.abs() < 1e-37))
    assert bool(ok.all()), list(zip(rhos.tolist(), gq32.tolist(), gq64.tolist()))


ISA_SCRIPT = r"""
import os
import torch, dignn_kernels as dk
from dignn_kernels import ops
torch.manual_seed(0)
n, m = 500, 4000
ei = torch.randint(0, n, (2, m)); ei = torch.cat([ei, ei.flip(0)], 1)
g = dk.build_graph(ei, n)
out = {}
for dt in (torch.float32, torch.float64):
    for d in (3, 16, 37, 64):  # block tails and whole blocks
        p, q = 0.3 * torch.randn(n, 19, dtype=dt), 0.3 * torch.randn(n, 19, dtype=dt)
        x, z, v = (torch.randn(n, d, dtype=dt) for _ in range(3))
        a, deg = g.values(dt)
        chi = deg * torch.tanh(p.norm(dim=1))
        zn, w, k, _ = torch.ops.dignn.implicit_diffusion(g.rowptr, g.col, a, x, chi, p, q, None,
                                                         2.2, 1e-6, 2, 0.0, None, None, None)
        gp, gq = ops.neural_weight_grad(g.rowptr, g.col, a, p, q, z, v)
        out[(str(dt), d)] = [zn, w, k, gp, gq]
torch.save(out, os.environ["DIGNN_CPU_ISA"] + ".pt")
"""


@pytest.mark.slow  # a subprocess or a compile: seconds; `-m "not slow"` leaves it out
def test_instruction_set_variants_agree(tmp_path):
    """The generic, AVX2 and AVX-512 builds of the passes compute the same function (each
    chosen with DIGNN_CPU_ISA in its own process)."""
    import platform
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("only x86-64 builds more than one instruction-set variant")
    results = {}
    for isa, proc in run_per_instruction_set(ISA_SCRIPT, tmp_path).items():
        assert proc.returncode == 0, proc.stderr
        results[isa] = torch.load(tmp_path / f"{isa}.pt")
    assert "generic" in results and len(results) >= 2
    base = results.pop("generic")
    for isa, res in results.items():
        for key, tensors in res.items():
            tol = 1e-12 if "float64" in key[0] else 3e-5
            for got, want in zip(tensors, base[key]):
                assert rel_err(got, want) < tol, (isa, key)


# ------------------------------------------------------------- thread count --

def random_symmetric(n, degree, seed):
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(0, n, (n * degree // 2,), generator=gen)
    dst = torch.randint(0, n, (n * degree // 2,), generator=gen)
    keep = src != dst
    src, dst = src[keep], dst[keep]
    return dk.build_graph(torch.stack([torch.cat([src, dst]), torch.cat([dst, src])]), n)


# work = rows + edges: 9k runs as one chunk, 18k (many chunks before) and 220k as many
# chunks (csrc/cpu/parallel_rows.h); the step norms summed over them are compared too.
@pytest.mark.parametrize("n,degree", [(1500, 5), (3000, 5), (20000, 10)])
def test_bitwise_same_at_any_thread_count(n, degree):
    g = random_symmetric(n, degree, seed=n)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(n, 64, generator=gen) * torch.rand(n, 1, generator=gen) ** 4
    p = 0.3 * torch.randn(n, 16, generator=gen)
    q = 0.3 * torch.randn(n, 16, generator=gen)
    a, deg = g.values(torch.float32)
    chi = deg * torch.tanh(p.norm(dim=1))
    grad_z = torch.randn(n, 64, generator=gen)
    o = torch.ops.dignn
    before = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 2, 1):
            torch.set_num_threads(threads)
            out = []
            for max_iter in (2, 3, 5):  # tol 0: stats after a fixed number of steps
                z, w, kappa, stats = o.implicit_diffusion(g.rowptr, g.col, a, x, chi, p, q, None,
                                                          2.2, 1e-6, max_iter, 0.0, None, None,
                                                          None)
                back = o.implicit_diffusion_backward(g.rowptr, g.col, a, w, kappa, None, None,
                                                     None, x, chi, p, q, z, grad_z, 2.2, 1e-6,
                                                     max_iter, 0.0)
                out += [z, w, kappa, stats, *back]
            out.append(o.csr_fma(g.rowptr, g.col, a, x, grad_z, chi, deg))
            results.append(out)
    finally:
        torch.set_num_threads(before)
    for other in results[1:]:
        for got, want in zip(other, results[0]):
            assert torch.equal(got, want)


# ------------------------------------------------------------------ bad input --

@pytest.mark.parametrize("kwargs, match", [
    (dict(mu=0.0), "mu must be a finite number > 0"),
    (dict(mu=-1.0), "mu must be a finite number > 0"),
    (dict(mu=float("nan")), "mu must be a finite number > 0"),
    (dict(mu=float("inf")), "mu must be a finite number > 0"),
    (dict(mu=2.0, max_iter=0), "max_iter must be an integer >= 1"),
    (dict(mu=2.0, max_iter=2.5), "max_iter must be an integer >= 1"),
    (dict(mu=2.0, tol=-1e-3), "tol must be a finite number >= 0"),
    (dict(mu=2.0, eps=0.0), "eps must be a finite number > 0"),
])
def test_op_scalar_errors(kwargs, match):
    """Checked in Python before any backend runs (on CUDA a C++-side mu = 0 crashed)."""
    g, x, p, q, a, chi = graph_inputs()
    with pytest.raises(ValueError, match=match):
        implicit_diffusion(g.rowptr, g.col, a, x, chi, p, q, **kwargs)
    if match.startswith("mu"):
        with pytest.raises(ValueError, match=match):
            ops.diffusion_step(g.rowptr, g.col, a, chi, chi, x, x, kwargs["mu"])


def test_op_argument_errors():
    g, x, p, q, a, chi = graph_inputs()
    with pytest.raises(RuntimeError, match="mu must be > 0"):  # the C++ check, called directly
        torch.ops.dignn.implicit_diffusion(g.rowptr, g.col, a, x, chi, p, q, None, 0.0, 1e-6,
                                           10, 1e-6, None, None, None)
    with pytest.raises(RuntimeError, match="x has 19 rows but the graph has 20 nodes"):
        implicit_diffusion(g.rowptr, g.col, a, x[:19], chi, p, q, mu=2.0)
    with pytest.raises(RuntimeError, match="chi must have shape"):
        implicit_diffusion(g.rowptr, g.col, a, x, chi[:-1], p, q, mu=2.0)
    with pytest.raises(RuntimeError, match="p and q go together"):
        implicit_diffusion(g.rowptr, g.col, a, x, chi, p, None, mu=2.0)
    with pytest.raises(RuntimeError, match="max_iter must be >= 1"):
        torch.ops.dignn.implicit_diffusion(g.rowptr, g.col, a, x, chi, p, q, None, 2.0, 1e-6,
                                           0, 1e-6, None, None, None)
    # 16-bit storage in the fused solves: float32 x only, and a 16-bit dtype
    solve = (g.rowptr, g.col, a, x, chi, p, q, None, 2.0, 1e-6, 4, 0.0, None, None, None)
    back = (g.rowptr, g.col, a, a, chi, None, None, None, x, chi, p, q, x, x, 2.0, 1e-6, 4, 0.0)
    for op, args in ((torch.ops.dignn.implicit_diffusion, solve),
                     (torch.ops.dignn.implicit_diffusion_backward, back)):
        with pytest.raises(RuntimeError, match=r"storage_dtype=BFloat16 needs float32 x .*got "
                                               r"Double: pass x in float32, or storage_dtype="
                                               r"None"):
            op(*args, torch.bfloat16)
        with pytest.raises(RuntimeError, match=r"storage_dtype must be None \(iterates in x's "
                                               r"dtype\), torch.bfloat16 or torch.float16, got "
                                               r"Float"):
            op(*args, torch.float32)
    with pytest.raises(RuntimeError, match="rowptr must be int64"):
        ops.neural_edge_weights(g.rowptr.int(), g.col, a, p, q)
    with pytest.raises(RuntimeError, match="a must hold one value per edge"):
        ops.neural_edge_weights(g.rowptr, g.col, a[:-1], p, q)
    with pytest.raises(RuntimeError, match="q must have dtype"):
        ops.neural_edge_weights(g.rowptr, g.col, a, p, q.float())
    with pytest.raises(RuntimeError, match="t_rowptr, t_col and t_perm go together"):
        ops.neural_weight_grad(g.rowptr, g.col, a, p, q, x, x, 1e-6, g.rowptr)


def test_backward_through_building_block_raises():
    g, x, p, q, a, chi = graph_inputs()
    z = torch.randn_like(x).requires_grad_()
    w, kappa = ops.neural_edge_weights(g.rowptr, g.col, a, p, q)
    out = ops.diffusion_step(g.rowptr, g.col, w, chi, kappa, x, z, 2.2)
    with pytest.raises(RuntimeError, match="diffusion_step"):
        out.sum().backward()


def test_ops_compile_without_graph_breaks():
    """Fake kernels and the registered autograd let torch.compile trace the ops whole
    (fullgraph=True), forward and backward, with dynamic shapes."""
    g, x, p, q, a, chi = graph_inputs("directed", dtype=torch.float32)
    t = g.transposed()

    def step(x, chi, p, q):
        z, stats = implicit_diffusion(g.rowptr, g.col, a, x, chi, p, q, mu=3.0, max_iter=6,
                                          tol=0.0, t_rowptr=t[0], t_col=t[1], t_perm=t[2])
        w, kappa = ops.neural_edge_weights(g.rowptr, g.col, a, p, q)
        return z.square().sum() + w.sum() + kappa.sum()

    compiled = torch.compile(step, fullgraph=True, dynamic=True)
    args = [u.clone().requires_grad_() for u in (x, chi, p, q)]
    ref_args = [u.clone().requires_grad_() for u in (x, chi, p, q)]
    got, want = compiled(*args), step(*ref_args)
    assert rel_err(got, want) < 1e-6
    got.backward()
    want.backward()
    for a_, b_ in zip(args, ref_args):
        assert rel_err(a_.grad, b_.grad) < 1e-5


@pytest.mark.parametrize("kind,d,dtype", ROW_PRODUCT_CASES)
def test_row_product_is_the_row_pass_with_its_dots(kind, d, dtype):
    """The CPU kernel of the row product (the GPU's is tested in test_cuda_emulated.py and
    test_cuda.py with the same checks)."""
    check_row_product(torch.ops.dignn, graph_case(kind, n=40, d=d, dtype=dtype), "cpu",
                      exact=True, context=f"{kind} d={d} {dtype}")


def test_row_product_argument_errors():
    check_row_product_errors(torch.ops.dignn, "cpu")


def test_row_product_of_an_empty_graph_or_signal():
    check_row_product_of_nothing(ops)


@pytest.mark.parametrize("kind,d,dtype", ROW_PRODUCT_CASES[:4])
def test_row_pass_on_a_given_schedule(kind, d, dtype):
    """The CPU op with the (empty) schedule of the CPU kernels, as the GPU's with its own
    (test_cuda_emulated.py, test_cuda.py)."""
    check_scheduled_row_pass(torch.ops.dignn, graph_case(kind, n=40, d=d, dtype=dtype), "cpu",
                             context=f"{kind} d={d} {dtype}")


def test_row_pass_schedule_errors():
    check_scheduled_row_pass_errors(torch.ops.dignn, "cpu")
    g, x, *_ = graph_inputs("symmetric")
    ones = torch.ones(g.num_nodes, dtype=x.dtype)
    with pytest.raises(ValueError, match=r"schedule is taken by the compiled op \(backend=None"
                                         r"\); backend='torch' makes its own: pass "
                                         r"schedule=None"):
        ops.csr_fma(g.rowptr, g.col, g.values(x.dtype)[0], x, x, ones, ones, schedule=[],
                    backend="torch")
