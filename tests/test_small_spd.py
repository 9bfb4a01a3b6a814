"""Anderson's small SPD solves (dignn_kernels.solvers.small_spd): the Triton kernel (in the
Triton interpreter on the CPU, compiled on a GPU) against the PyTorch solve, both against a
dense float64 solve, and Anderson's whole solve with each."""
import pytest
import torch

from dignn_kernels import solvers
from dignn_kernels.solvers.small_spd import (TRITON_MAX_M, lapack_small_spd_solve,
                                             small_spd_solve_for, torch_small_spd_solve)

pytest.importorskip("triton")
from dignn_kernels.solvers._triton_small_spd import triton_small_spd_solve  # noqa: E402

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
    """Anderson on a linear contraction y -> c + J y with the Triton small solve and the
    PyTorch one (LAPACK's on the CPU): the same sweeps, the same history to rounding, and the
    dense solution of y = c + J y."""
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
    torch.testing.assert_close(runs[1].history, runs[0].history, rtol=1e-3, atol=1e-12,
                               equal_nan=True)
    for run in runs:
        rel = float((run.solution.double().cpu() - exact).norm() / exact.norm())
        assert rel < (1e-9 if dtype == torch.float64 else 1e-4)


def test_which_solve():
    x = torch.zeros(3, 2, device=DEVICE)
    plain = torch_small_spd_solve if x.is_cuda else lapack_small_spd_solve
    assert small_spd_solve_for(x, 5, "torch") is plain
    assert small_spd_solve_for(x, 5, "triton") is triton_small_spd_solve
    assert small_spd_solve_for(x, TRITON_MAX_M + 1, "triton") is plain
    assert small_spd_solve_for(x, 5) is (triton_small_spd_solve if x.is_cuda else plain)
    with pytest.raises(ValueError, match="vector_kernels must be one of"):
        small_spd_solve_for(x, 5, "cuda")
