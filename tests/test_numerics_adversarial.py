"""Adversarial numerics of the solve (issue 32, part C: no wrong answer without an error).

Every case here holds a result of :func:`dignn_kernels.implicit_diffusion` (every solver, the
backends "cpu", "torch" and "triton" in the interpreter) to a dense float64 solve of the same
data, written here from the paper's formulas independently of the package: (I + Delta/mu) Z = X
(eq. 10) with Delta = C^-1 (K - W) (eq. 9), its rows zero where chi_i <= 1e-30 (guard rows keep
z_i = x_i), and for the neural Laplacian W_ij = a_ij tanh(1/(||q_i - q_j|| + eps))
tanh(|p_i . p_j|) (eq. 13-14), kappa its row sums. Gradients are the dense solve's autograd.
A call either agrees (tolerances per dtype below) or raises / warns.

Tolerances: float64 solves converge to tol=1e-13 and agree to 1e-10 relative (the dense
solve's own rounding is ~1e-15 times the condition number, which stays below ~1e3 for the
graphs and mu here); float32 solves converge to tol=1e-6 and agree to 1e-4 relative (the
data itself is float32, the passes round at 6e-8 per operation over a few hundred sweeps).
"""
import math
import warnings

import pytest
import torch

import dignn_kernels as dk
from dignn_kernels.solvers import DivergenceWarning, implicit_diffusion

SOLVERS = ["fixed_point", "cg", "anderson"]
BACKENDS = ["cpu", "torch", "triton"]
FIXED = ["rw", "unnormalized", "sym"]
EPS = 1e-6


# ----------------------------------------------------------------- the dense oracle --

def dense_weights(rowptr, col, edge_value, p=None, q=None, eps=EPS):
    """(rows, cols, W per entry) in float64, differentiable in p and q (eq. 13-14)."""
    n = rowptr.numel() - 1
    rows = torch.repeat_interleave(torch.arange(n), rowptr[1:] - rowptr[:-1])
    cols = col.long()
    if p is None:
        return rows, cols, edge_value.double()
    p, q = p.double(), q.double()
    pi = (p[rows] * p[cols]).sum(dim=1)
    rho = (q[rows] - q[cols]).norm(dim=1)
    return rows, cols, edge_value.double() * torch.tanh(1.0 / (rho + eps)) * torch.tanh(pi.abs())


def dense_solve(rowptr, col, edge_value, x, chi, p=None, q=None, kappa=None, *, mu,
                eps=EPS):
    """Z of (I + Delta/mu) Z = X in float64, differentiable in x, chi, p, q."""
    n = rowptr.numel() - 1
    rows, cols, w = dense_weights(rowptr, col, edge_value, p, q, eps)
    W = torch.zeros(n, n, dtype=torch.float64).index_put((rows, cols), w, accumulate=True)
    k = W.sum(dim=1) if kappa is None else kappa.double()
    chi = chi.double()
    guard = chi <= 1e-30
    safe = torch.where(guard, torch.ones_like(chi), chi)
    delta = torch.where(guard.unsqueeze(1), 0.0, (torch.diag(k) - W) / safe.unsqueeze(1))
    return torch.linalg.solve(torch.eye(n, dtype=torch.float64) + delta / mu, x.double())


def rel(a, b):
    b = b.double()
    return float((a.double() - b).norm() / b.norm().clamp_min(1e-300))


# ------------------------------------------------------------------------ graphs --

def random_graph(n, seed, *, symmetric=True, self_loops=False, duplicates=False,
                 zero_weights=False, isolated=0, weights=(0.5, 1.5)):
    """(rowptr, col, a) of a seeded random graph (CSR by target row)."""
    g = torch.Generator().manual_seed(seed)
    m = 2 * n
    e = torch.randint(0, n - isolated, (2, m), generator=g) if n > isolated else \
        torch.empty(2, 0, dtype=torch.long)
    e = e[:, e[0] != e[1]]
    lo, hi = weights
    a = lo + (hi - lo) * torch.rand(e.size(1), generator=g, dtype=torch.float64)
    if zero_weights and a.numel():
        a[::4] = 0.0
    if duplicates and e.size(1):
        e = torch.cat([e, e[:, :3]], dim=1)
        a = torch.cat([a, a[:3]])
    if symmetric:
        e = torch.cat([e, e.flip(0)], dim=1)
        a = torch.cat([a, a])
    if self_loops:
        loops = torch.arange(0, n, 3)
        e = torch.cat([e, loops.repeat(2, 1)], dim=1)
        a = torch.cat([a, torch.full((loops.numel(),), 0.7, dtype=torch.float64)])
    graph = dk.build_graph(e, n, a)
    return graph.rowptr, graph.col, graph.value, graph


def fixed_system(graph, laplacian, dtype):
    w, chi, kappa = graph.fixed_laplacian(laplacian, dtype)
    return w, chi.clone(), kappa


def solve(rowptr, col, value, x, chi, p=None, q=None, kappa=None, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("error", DivergenceWarning)
        return implicit_diffusion(rowptr, col, value, x, chi, p, q, kappa, **kw)[0]


# ------------------------------------------------- 1. cg on graphs with guard rows --

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("solver", SOLVERS)
def test_guard_row_with_edges_forward_and_gradients(solver, backend):
    """A row whose chi is 0 while it has edges keeps z_i = x_i, and the other rows still
    diffuse from it: every solver agrees with the dense solve, forward and backward (cg
    eliminates the guard row; before, it solved a different system, 1.7e-2 off)."""
    rowptr, col, a, graph = random_graph(9, seed=1)
    n, d = 9, 2
    x = torch.randn(n, d, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    g = torch.randn(n, d, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    opts = dict(mu=2.5, solver=solver, backend=backend, max_iter=400, tol=1e-13)
    for laplacian in FIXED + ["neural"]:
        if laplacian == "neural":
            gen = torch.Generator().manual_seed(4)
            p = torch.randn(n, 2, dtype=torch.float64, generator=gen)
            q = torch.randn(n, 2, dtype=torch.float64, generator=gen)
            value, chi, kappa = a, graph.degree.clone(), None
        else:
            value, chi, kappa = fixed_system(graph, laplacian, torch.float64)
            p = q = None
        chi[[2, 5]] = 0.0
        assert (rowptr[3] > rowptr[2]) and (rowptr[6] > rowptr[5])  # guard rows with edges
        leaves = [x.clone().requires_grad_(), chi.clone().requires_grad_()]
        if p is not None:
            leaves += [p.clone().requires_grad_(), q.clone().requires_grad_()]
        pq = leaves[2:] if p is not None else [None, None]
        mu = 25.0 if laplacian == "unnormalized" else 2.5
        z = solve(rowptr, col, value, leaves[0], leaves[1], *pq, kappa, **{**opts, "mu": mu})
        want = dense_solve(rowptr, col, value, *[t.detach() for t in leaves[:2]],
                           *[t.detach() if t is not None else None for t in pq], kappa, mu=mu)
        assert rel(z, want) < 1e-10, (laplacian, rel(z, want))
        assert torch.equal(z[[2, 5]].detach(), x[[2, 5]])
        got = torch.autograd.grad(z, leaves, g)
        dense_leaves = [t.detach().clone().requires_grad_() for t in leaves]
        dpq = dense_leaves[2:] if p is not None else [None, None]
        zd = dense_solve(rowptr, col, value, dense_leaves[0], dense_leaves[1], *dpq, kappa,
                         mu=mu)
        wanted = torch.autograd.grad(zd, dense_leaves, g)
        for name, a_, b_ in zip(["x", "chi", "p", "q"], got, wanted):
            assert rel(a_, b_) < 1e-9, (laplacian, name, rel(a_, b_))


def test_guard_row_gradcheck_cg():
    """gradcheck of the cg solve (forward and adjoint elimination) in x, p and q on a tiny
    neural graph with a guard row that has edges."""
    rowptr, col, a, graph = random_graph(6, seed=5)
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(6, 2, dtype=torch.float64, generator=gen, requires_grad=True)
    p = torch.randn(6, 2, dtype=torch.float64, generator=gen, requires_grad=True)
    q = torch.randn(6, 2, dtype=torch.float64, generator=gen, requires_grad=True)
    chi = graph.degree.clone()
    chi[1] = 0.0
    assert rowptr[2] > rowptr[1]

    def f(x, p, q):
        return solve(rowptr, col, a, x, chi, p, q, mu=1.5, solver="cg", max_iter=200,
                     tol=1e-14)
    assert torch.autograd.gradcheck(f, (x, p, q), eps=1e-6, atol=1e-7, rtol=1e-6)
