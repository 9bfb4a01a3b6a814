"""Anderson's vector work (dignn_kernels.solvers.anderson_update): the Triton kernels (in the
Triton interpreter on the CPU, compiled on a GPU) against the PyTorch ops, the small solves
against a dense float64 solve, and Anderson's whole solve with each."""
import math

import pytest
import torch

from dignn_kernels import solvers
from dignn_kernels.solver_state import ACCEPT, DIVERGED, DONE, RESIDUAL, SWEEPS
from dignn_kernels.solvers.anderson_update import (TRITON_MAX_M, AndersonVectors,
                                                   CpuAndersonVectors, TritonAndersonVectors,
                                                   anderson_regularization, anderson_state,
                                                   anderson_vectors_for, lapack_small_spd_solve,
                                                   torch_small_spd_solve)

pytest.importorskip("triton")
from dignn_kernels.solvers._triton_anderson import (anderson_finish,  # noqa: E402
                                                    anderson_gamma, small_spd_solve, window_mix,
                                                    window_record)

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


def _contraction(n, d, seed, rate):
    """(J, c) in float64 on the CPU: a random n x n J of spectral norm ``rate`` and an n x d
    c, the map y -> c + J y contracting."""
    g = torch.Generator().manual_seed(seed)
    j = torch.randn(n, n, generator=g, dtype=torch.float64)
    return rate * j / torch.linalg.matrix_norm(j, ord=2), \
        torch.randn(n, d, generator=g, dtype=torch.float64)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_anderson_with_each_solve(dtype):
    """Anderson on a linear contraction y -> c + J y with the Triton kernels and the PyTorch
    ops (LAPACK's small solves on the CPU): the same sweeps, the same history to rounding,
    and the dense solution of y = c + J y."""
    n = 60
    j, c = _contraction(n, 5, seed=1, rate=0.95)
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


@pytest.mark.parametrize("n,d,m,count,slot", [(1, 1, 5, 1, 0), (63, 5, 5, 3, 2),
                                                (130, 64, 5, 5, 1), (70, 80, 5, 2, 0),
                                                (40, 3, 5, 4, 3), (200, 64, 16, 16, 11),
                                                (90, 64, 16, 7, 6), (33, 17, 1, 1, 0)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_window_kernels_equal_torch(n, d, m, count, slot, dtype):
    """The record (f_new, the window's slot, the sums ||f_new||^2 (per channel in the kernel),
    <dF_j, dF_slot>, <dF_j, f_new> in float64) and the mix gy - sum_j d_g[j] gamma[j] as
    Triton kernels against the PyTorch ops and a float64 sum, over the filled slots only (the
    others hold garbage; the record's own slot is read from its registers, not from memory).
    Windows of m = 1, 5 and 16 slots (the record's sums of all slots held in one tile of m
    rounded up to a power of two), several row blocks and chunks, a last partial chunk."""
    g = torch.Generator().manual_seed(n + d)
    rnd = lambda *shape: torch.randn(*shape, generator=g, dtype=dtype).to(DEVICE)  # noqa: E731
    gy_new, y_new, f, gy, gamma = rnd(n, d), rnd(n, d), rnd(n, d), rnd(n, d), rnd(m, d)
    window = [rnd(m, n, d), rnd(m, n, d)]
    for slots in window:
        slots[count:] = float("nan")
    torch_window = [t.clone() for t in window]
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-12)
    f_new, sums = window_record(gy_new, y_new, f, gy, *window, slot, count)
    want_f, want_sums = AndersonVectors(f, m).record(gy_new, y_new, f, gy, *torch_window, slot,
                                                     count)
    assert torch.equal(f_new, want_f) and torch.equal(f_new, gy_new - y_new)
    assert torch.equal(window[0][slot], f_new - f) and torch.equal(window[1][slot], gy_new - gy)
    for got, want in zip(window, torch_window):
        assert torch.equal(got[:count], want[:count]) and got[count:].isnan().all()
    assert sums.shape == (1 + 2 * count, d) and sums.dtype == torch.float64
    # ||f_new||^2: per channel in the kernel's row, all in the first entry in PyTorch's
    torch.testing.assert_close(sums[0].sum(), want_sums[0].sum(), **tol)
    torch.testing.assert_close(sums[1:], want_sums[1:], **tol)
    d_f = window[0][:count].double()
    exact = torch.cat([f_new.double().square().sum(dim=0, keepdim=True),
                       (d_f * d_f[slot]).sum(dim=1), (d_f * f_new.double()).sum(dim=1)])
    torch.testing.assert_close(sums, exact, **tol)
    mixed = window_mix(gy, window[1], gamma, count)
    torch.testing.assert_close(mixed, AndersonVectors.mix(gy, window[1], gamma, count), **tol)
    assert mixed.data_ptr() != gy.data_ptr()


@pytest.mark.parametrize("m", [1, 5, TRITON_MAX_M])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gamma_kernel_equals_torch(m, dtype):
    """gamma in one kernel (each channel's Gram matrix regularized, solved, non-finite values
    zeroed, cast to the iterate's dtype) against the PyTorch ops (their elementwise solve),
    for 70 channels, one of them with a NaN Gram matrix and one all zero."""
    a, b = _systems(70, m, torch.float64, seed=m, condition=0.0)
    a[3] = float("nan")
    a[4] = 0.0
    b[4] = 0.0
    proj = b.t().contiguous()
    vectors = AndersonVectors(torch.zeros(1, 70, dtype=dtype, device=DEVICE), m)
    vectors.solve = torch_small_spd_solve
    want = vectors.gamma(a, proj, dtype)
    got = anderson_gamma(a, proj, anderson_regularization(dtype), dtype)
    assert got.shape == (m, 70) and got.dtype == dtype
    # contiguous, as the mix reads gamma[j] along every row (a strided gamma is 2x slower)
    assert got.is_contiguous() and want.is_contiguous()
    assert torch.isfinite(got).all() and not got[:, 3].any() and not got[:, 4].any()
    tol = dict(rtol=1e-9, atol=1e-10) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got, want, **tol)


FINISH_CASES = {  # the sums' ||f_new||^2 row and the state's done flag before the iteration
    "running": ([1.0, 2.0, 0.5], 0.0), "converged": ([1e-14, 0.0, 0.0], 0.0),
    "diverged": ([1.0, float("inf"), 0.5], 0.0), "nan": ([float("nan"), 0.0, 1.0], 0.0),
    "done": ([1.0, 2.0, 0.5], 1.0)}


@pytest.mark.parametrize("case", sorted(FINISH_CASES))
def test_finish_kernel_equals_torch(case):
    """The iteration's bookkeeping in one kernel against the PyTorch ops: the Gram matrix's
    row and column of the slot, the next right-hand side, the history and every field of
    the state, running, converging, diverging (an infinite or NaN residual: the last finite
    one kept, nothing accepted) and once done (nothing counted or accepted)."""
    square, done = FINISH_CASES[case]
    d, m, count, slot, k = 3, 5, 4, 2, 6
    g = torch.Generator().manual_seed(len(case))
    sums = torch.randn(1 + 2 * count, d, generator=g, dtype=torch.float64)
    sums[0] = torch.tensor(square, dtype=torch.float64)
    states = [anderson_state(*torch.tensor([0.7, 1e-6, 2.0], dtype=torch.float64).unbind())
              for _ in range(2)]
    for state in states:
        state[DONE] = done
        state[SWEEPS] = 3.0
    grams = [torch.randn(d, m, m, generator=g, dtype=torch.float64)] * 2
    grams[1] = grams[0].clone()
    projs = [torch.zeros(m, d, dtype=torch.float64) for _ in range(2)]
    histories = [torch.full((9,), float("nan"), dtype=torch.float64) for _ in range(2)]
    (state, gram, proj, history), (t_state, t_gram, t_proj, t_history) = (
        [t.to(DEVICE) for t in group] for group in zip(states, grams, projs, histories))
    anderson_finish(sums.to(DEVICE), count, slot, gram, proj, state, history, k)
    AndersonVectors.finish(sums.to(DEVICE), count, slot, t_gram, t_proj, t_state, t_history, k)
    assert torch.equal(gram, t_gram) and torch.equal(proj, t_proj)
    torch.testing.assert_close(history, t_history, equal_nan=True, rtol=1e-15, atol=0)
    torch.testing.assert_close(state, t_state, rtol=1e-15, atol=0)
    assert torch.equal(t_gram[:, :count, slot], sums[1:1 + count].t().to(DEVICE))
    assert torch.equal(t_proj[:count], sums[1 + count:].to(DEVICE))
    res = float(sums[0].sum().sqrt())
    accepted = done == 0.0 and math.isfinite(res)
    assert float(state[ACCEPT]) == float(accepted)
    assert float(state[SWEEPS]) == 3.0 + (done == 0.0)
    assert float(state[DIVERGED]) == float(done == 0.0 and not math.isfinite(res))
    assert float(state[DONE]) == float(case != "running")
    assert float(state[RESIDUAL]) == (res if accepted else 0.7)


@pytest.mark.parametrize("kernels", ["torch", "triton"])
def test_anderson_stops_at_a_non_finite_sweep(kernels):
    """A map whose 5th sweep (iteration 4) is infinite: the solve ends diverged with 5 sweeps
    counted, the iterate of iteration 3 (the last accepted, finite) and its residual, whether
    the flag is read every sweep, every 4 or never (then the later, finite sweeps change
    nothing)."""
    j, c = (t.to(DEVICE) for t in _contraction(30, 4, seed=2, rate=0.9))
    results = []
    for check_every in (1, 4, 0):
        calls = []

        def step(y):
            calls.append(len(calls))
            return c + j @ y if len(calls) != 5 else torch.full_like(y, float("inf"))

        results.append(solvers.anderson(step, c, max_iter=12, tol=1e-14,
                                        check_every=check_every, vector_kernels=kernels))
        assert len(calls) == (5 if check_every == 1 else 8 if check_every == 4 else 12)
    first = results[0]
    assert int(first.sweeps) == 5 and bool(first.diverged)
    assert torch.isfinite(first.solution).all() and torch.isfinite(first.residual)
    assert float(first.history[4]) == math.inf and float(first.history[3]) > 0
    assert float(first.relative) == pytest.approx(float(first.history[3]))
    for other in results[1:]:
        assert torch.equal(other.solution, first.solution)
        assert torch.equal(other.stats(), first.stats())


@pytest.mark.parametrize("kernels", ["torch", "triton"])
def test_one_reduction_per_iteration(kernels):
    """A partitioned solve sums its per-process partial sums once per iteration (the record's
    table: the norm, the Gram row and the next right-hand side together), besides the two of
    its start (||rhs|| and the first residual); with an identity for that sum the solve is
    the one-process solve (to the rounding of the start's norms, taken another way)."""
    d = 3
    j, c = (t.to(DEVICE) for t in _contraction(40, d, seed=4, rate=0.9))
    calls = []

    def reduce(partial):
        calls.append(partial.shape)
        return partial

    solve = dict(max_iter=10, tol=0.0, check_every=0, vector_kernels=kernels)
    alone = solvers.anderson(lambda y: c + j @ y, c, **solve)
    summed = solvers.anderson(lambda y: c + j @ y, c, reduce=reduce, **solve)
    assert len(calls) == 2 + 9
    assert [tuple(shape) for shape in calls[2:4]] == [(3, d), (5, d)]  # 1 + 2 count rows
    torch.testing.assert_close(summed.solution, alone.solution, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(summed.stats(), alone.stats(), rtol=1e-12, atol=1e-14)


def test_which_vectors():
    x = torch.zeros(3, 2, device=DEVICE)
    plain = torch_small_spd_solve if x.is_cuda else lapack_small_spd_solve
    assert type(anderson_vectors_for(x, 5, "torch")) is AndersonVectors
    assert anderson_vectors_for(x, 5, "torch").solve is plain
    triton_vectors = anderson_vectors_for(x, 5, "triton")
    assert type(triton_vectors) is TritonAndersonVectors
    assert "gamma" in vars(triton_vectors)  # the gamma kernel
    wide = anderson_vectors_for(x, TRITON_MAX_M + 1, "triton")  # the PyTorch gamma
    assert "gamma" not in vars(wide) and wide.solve is plain
    assert type(anderson_vectors_for(x, 5)) is (TritonAndersonVectors if x.is_cuda
                                                 else CpuAndersonVectors)
    with pytest.raises(ValueError, match="vector_kernels must be one of"):
        anderson_vectors_for(x, 5, "cuda")
