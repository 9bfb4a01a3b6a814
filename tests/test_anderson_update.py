"""Anderson's vector work (dignn_kernels.solvers.anderson_update): the Triton kernels (in the
Triton interpreter on the CPU, compiled on a GPU) against the PyTorch ops, the small solves
against a dense float64 solve, and Anderson's whole solve with each."""
import pytest
import torch

from dignn_kernels import solvers
from dignn_kernels.solvers.anderson_update import (TRITON_MAX_M, AndersonVectors,
                                                   TritonAndersonVectors, anderson_vectors_for,
                                                   lapack_small_spd_solve, torch_small_spd_solve)

pytest.importorskip("triton")
from dignn_kernels.solvers._triton_anderson import (small_spd_solve, window_dots,  # noqa: E402
                                                    window_mix)

triton_small_spd_solve = small_spd_solve

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _systems(batch, m, dtype, seed=0, condition=1.0):
    """A batch of SPD m x m systems (Gram matrices plus `condition` times the identity)."""
    g = torch.Generator().manual_seed(seed)
    f = torch.randn(batch, m + 3, m, generator=g, dtype=torch.float64)
    a = f.transpose(1, 2) @ f + condition * torch.eye(m, dtype=torch.float64)
    b = torch.randn(batch, m, generator=g, dtype=torch.float64)
    return a.to(dtype).to(DEVICE), b.to(dtype).to(DEVICE)


@pytest.mark.parametrize("m", [1, 2, 3, 5, 8, 11, TRITON_MAX_M])
@pytest.mark.parametrize("batch", [1, 7, 70])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_triton_solve_equals_torch_and_dense(m, batch, dtype):
    a, b = _systems(batch, m, dtype, seed=m + batch)
    got = triton_small_spd_solve(a, b)
    want = torch_small_spd_solve(a, b)
    tol = dict(rtol=1e-11, atol=1e-12) if dtype == torch.float64 else dict(rtol=2e-4,
                                                                          atol=1e-5)
    torch.testing.assert_close(got, want, **tol)
    exact = torch.linalg.solve(a.double().cpu(), b.double().cpu())
    torch.testing.assert_close(got.double().cpu(), exact, **tol)


def test_singular_and_non_finite_systems_fail_alike():
    """A zero matrix (pivots clamped to the smallest normal number: huge but finite), an
    indefinite one, NaN on the diagonal and below it, infinity below it: both solves give
    non-finite values at the same places (Anderson zeroes them) and the same finite values
    elsewhere; a NaN above the diagonal is never read."""
    a, b = _systems(7, 5, torch.float64, seed=3)
    a[0] = 0.0
    a[1] = -a[1]
    a[2, 2, 2] = float("nan")
    a[3, 3, 1] = float("nan")
    a[4, 3, 0] = float("inf")
    a[5, 1, 3] = float("nan")
    got = triton_small_spd_solve(a, b)
    want = torch_small_spd_solve(a, b)
    assert torch.equal(torch.isfinite(got), torch.isfinite(want))
    assert all(not torch.isfinite(want[k]).any() for k in range(1, 5))
    assert torch.isfinite(want[[0, 5, 6]]).all() and want[0].abs().max() > 1e300
    torch.testing.assert_close(torch.nan_to_num(got, nan=0.0, posinf=0.0, neginf=0.0),
                               torch.nan_to_num(want, nan=0.0, posinf=0.0, neginf=0.0),
                               rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize("m", [1, 5, TRITON_MAX_M + 4])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_lapack_solve_equals_dense_and_fails_with_nan(m, dtype):
    """The CPU's LAPACK solve: the dense solution of positive definite systems; NaN for
    every entry of a system it cannot factor (zero, indefinite, NaN), which Anderson zeroes
    (its step is then the plain fixed-point step)."""
    a, b = _systems(9, m, dtype, seed=m)
    a, b = a.cpu(), b.cpu()
    a[0] = 0.0
    a[1] = -a[1]
    a[2, m - 1, 0] = float("nan")
    got = lapack_small_spd_solve(a, b)
    assert got.isnan().all(dim=1).tolist() == [True] * 3 + [False] * 6
    exact = torch.linalg.solve(a[3:].double(), b[3:].double())
    tol = dict(rtol=1e-11, atol=1e-12) if dtype == torch.float64 else dict(rtol=2e-4,
                                                                          atol=1e-5)
    torch.testing.assert_close(got[3:].double(), exact, **tol)
    torch.testing.assert_close(got[3:], torch_small_spd_solve(a[3:], b[3:]), **tol)


def test_empty_batch():
    a, b = _systems(0, 5, torch.float64)
    assert triton_small_spd_solve(a, b).shape == (0, 5)
    assert lapack_small_spd_solve(a.cpu(), b.cpu()).shape == (0, 5)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_anderson_with_each_solve(dtype):
    """Anderson on a linear contraction y -> c + J y with the Triton kernels and the PyTorch
    ops (LAPACK's small solves on the CPU): the same sweeps, the same history to rounding,
    and the dense solution of y = c + J y."""
    g = torch.Generator().manual_seed(1)
    n, d = 60, 5
    j = torch.randn(n, n, generator=g, dtype=torch.float64)
    j = 0.95 * j / torch.linalg.matrix_norm(j, ord=2)
    c = torch.randn(n, d, generator=g, dtype=torch.float64)
    exact = torch.linalg.solve(torch.eye(n, dtype=torch.float64) - j, c)
    jd, cd = j.to(dtype).to(DEVICE), c.to(dtype).to(DEVICE)
    tol = 1e-11 if dtype == torch.float64 else 1e-5
    runs = [solvers.anderson(lambda y: cd + jd @ y, cd, max_iter=80, tol=tol,
                             vector_kernels=kernels) for kernels in ("torch", "triton")]
    assert int(runs[0].sweeps) == int(runs[1].sweeps) < 80
    # (float32: the residuals near 1e-5 of ||c|| are a few ulp of the iterate, which the sums'
    # order and precision move by a few parts in a thousand)
    torch.testing.assert_close(runs[1].history, runs[0].history, equal_nan=True, atol=1e-12,
                               rtol=1e-3 if dtype == torch.float64 else 1e-2)
    for run in runs:
        rel = float((run.solution.double().cpu() - exact).norm() / exact.norm())
        assert rel < (1e-9 if dtype == torch.float64 else 1e-4)


@pytest.mark.parametrize("n,d,filled", [(1, 1, 1), (63, 5, 3), (130, 64, 5), (70, 80, 2),
                                         (40, 3, 0)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_window_kernels_equal_torch(n, d, filled, dtype):
    """The window's dots (float64 sums) and the mix gy - sum_j d_g[j] gamma[j] as Triton
    kernels against the PyTorch ops, over the filled slots only (the others hold garbage)."""
    g = torch.Generator().manual_seed(n + d)
    rnd = lambda *shape: torch.randn(*shape, generator=g, dtype=dtype).to(DEVICE)  # noqa: E731
    m = 5
    slots, d_g, v, gy, gamma = rnd(m, n, d), rnd(m, n, d), rnd(n, d), rnd(n, d), rnd(m, d)
    slots[filled:] = float("nan")
    d_g[filled:] = float("nan")
    torch_ops = AndersonVectors(v, m)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-12)
    got = window_dots(slots, v, filled)
    assert got.shape == (filled, d) and got.dtype == torch.float64
    if filled:
        torch.testing.assert_close(got, torch_ops.dots(slots, v, filled), **tol)
        exact = (slots[:filled].double() * v.double()).sum(dim=1)
        torch.testing.assert_close(got, exact, **tol)
        mixed = window_mix(gy, d_g, gamma, filled)
        torch.testing.assert_close(mixed, AndersonVectors.mix(gy, d_g, gamma, filled), **tol)
        assert mixed.data_ptr() != gy.data_ptr()


def test_which_vectors():
    x = torch.zeros(3, 2, device=DEVICE)
    plain = torch_small_spd_solve if x.is_cuda else lapack_small_spd_solve
    assert type(anderson_vectors_for(x, 5, "torch")) is AndersonVectors
    assert anderson_vectors_for(x, 5, "torch").solve is plain
    triton_vectors = anderson_vectors_for(x, 5, "triton")
    assert type(triton_vectors) is TritonAndersonVectors
    assert triton_vectors.solve is triton_small_spd_solve
    assert anderson_vectors_for(x, TRITON_MAX_M + 1, "triton").solve is plain
    assert type(anderson_vectors_for(x, 5)) is (TritonAndersonVectors if x.is_cuda
                                                 else AndersonVectors)
    with pytest.raises(ValueError, match="vector_kernels must be one of"):
        anderson_vectors_for(x, 5, "cuda")
