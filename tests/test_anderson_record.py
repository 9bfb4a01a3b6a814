"""Anderson's record as one compiled CPU pass (the op dignn::anderson_record,
dignn_kernels.solvers.anderson_update.CpuAndersonVectors): against the PyTorch record and a
float64 sum, the same bits at any thread count and instruction set, its argument checks, and
Anderson's solve with it (the default on the CPU)."""
import pytest
import torch

from dignn_kernels import ops, solvers
from dignn_kernels.solvers.anderson_update import (AndersonVectors, CpuAndersonVectors,
                                                   anderson_vectors_for)
from conftest import run_per_instruction_set


def _inputs(n, d, m, count, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *shape: torch.randn(*shape, generator=g, dtype=dtype)  # noqa: E731
    window = [rnd(m, n, d), rnd(m, n, d)]
    for slots in window:
        slots[count:] = float("nan")  # unfilled slots: never read
    return (rnd(n, d), rnd(n, d), rnd(n, d), rnd(n, d)), window


@pytest.mark.parametrize("n,d,m,count,slot", [
    (1, 1, 5, 1, 0), (63, 5, 5, 3, 2), (130, 64, 5, 5, 1), (40, 3, 5, 4, 3),
    (90, 64, 16, 7, 6), (33, 17, 1, 1, 0),
    (3000, 64, 5, 5, 4),   # rows in many chunks, summed in chunk order
    (2001, 7, 5, 5, 0)])   # channels that fill no vector, a last short chunk
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_record_equals_torch_and_float64_sums(n, d, m, count, slot, dtype):
    """f_new and the window's new slot equal the PyTorch record's bit for bit (one rounded
    subtraction each), the other slots are untouched, and the sums equal the float64 sums of
    the products (float64 exact; float32 products rounded once, then summed in float64 where
    the PyTorch record sums in float32)."""
    vectors, window = _inputs(n, d, m, count, dtype, seed=n + d)
    gy_new, y_new, f, gy = vectors
    torch_window = [t.clone() for t in window]
    f_new, sums = ops.anderson_record(*vectors, *window, slot, count)
    want_f, want_sums = AndersonVectors(f, m).record(*vectors, *torch_window, slot, count)
    assert torch.equal(f_new, want_f)
    for got, want in zip(window, torch_window):
        assert torch.equal(got[:count], want[:count]) and got[count:].isnan().all()
    assert sums.shape == (1 + 2 * count, d) and sums.dtype == torch.float64
    d_f = window[0][:count]
    products = torch.cat([(f_new * f_new).unsqueeze(0), d_f * d_f[slot], d_f * f_new])
    exact = products.double().sum(dim=1)  # the products as the record rounds them
    tol = dict(rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(sums, exact, **tol)
    loose = dict(rtol=1e-5, atol=1e-4) if dtype == torch.float32 else tol
    torch.testing.assert_close(sums[0].sum(), want_sums[0].sum(), **loose)
    torch.testing.assert_close(sums[1:], want_sums[1:], **loose)


def test_record_same_bits_at_any_thread_count():
    vectors, window = _inputs(5000, 64, 5, 5, torch.float32)
    runs = []
    threads = torch.get_num_threads()
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            w = [t.clone() for t in window]
            runs.append((*ops.anderson_record(*vectors, *w, 3, 5), *w))
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(*runs))


RECORD_SCRIPT = """
import torch
from dignn_kernels import ops
g = torch.Generator().manual_seed(0)
vectors = [torch.randn(3000, 37, generator=g) for _ in range(4)]
window = [torch.randn(5, 3000, 37, generator=g) for _ in range(2)]
f_new, sums = ops.anderson_record(*vectors, *window, 2, 5)
print(repr(sums.sum(dim=1).tolist()), float(f_new.sum()), float(window[0][2].sum()))
"""


def test_record_same_bits_in_every_instruction_set_build(tmp_path):
    """Every instruction-set build of the CPU passes this CPU has (the channel loops vectorized
    differently, each channel's sums in the same order): the same bits."""
    runs = run_per_instruction_set(RECORD_SCRIPT, tmp_path)
    assert runs and all(p.returncode == 0 for p in runs.values()), \
        {isa: p.stderr[-2000:] for isa, p in runs.items()}
    assert len({p.stdout for p in runs.values()}) == 1, {isa: p.stdout for isa, p in runs.items()}


def _bad(**changes):
    vectors, window = _inputs(6, 4, 3, 2, torch.float32)
    args = dict(zip(["gy_new", "y_new", "f", "gy"], vectors), d_f=window[0], d_g=window[1],
                slot=1, count=2)
    args.update(changes)
    return args


@pytest.mark.parametrize("changes,message", [
    (dict(y_new=torch.zeros(6, 5)), "y_new must have gy_new's shape"),
    (dict(gy=torch.zeros(6, 4, dtype=torch.float64)), "gy must have gy_new's dtype"),
    (dict(gy_new=torch.zeros(6, 4, dtype=torch.bfloat16)), "gy_new must be float32 or float64"),
    (dict(gy_new=torch.zeros(24)), "gy_new must be an n x d tensor"),
    (dict(d_f=torch.zeros(3, 6, 5)), "d_f must be the window's m x n x d"),
    (dict(d_g=torch.zeros(2, 6, 4)), "d_g must have d_f's shape"),
    (dict(f=torch.zeros(4, 6).t()), "f must be contiguous"),
    (dict(count=4), "count must be the filled slots"),
    (dict(count=0), "count must be the filled slots"),
    (dict(slot=2), "slot must be one of the filled slots"),
    (dict(slot=-1), "slot must be one of the filled slots"),
])
def test_record_refuses_bad_arguments(changes, message):
    args = _bad(**changes)
    with pytest.raises(RuntimeError, match=message):
        ops.anderson_record(**args)


def test_cpu_solves_take_the_compiled_record():
    x = torch.zeros(3, 2)
    assert type(anderson_vectors_for(x, 5)) is CpuAndersonVectors
    assert type(anderson_vectors_for(x.double(), 5)) is CpuAndersonVectors
    assert type(anderson_vectors_for(x, 5, "torch")) is AndersonVectors  # PyTorch ops alone


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_anderson_with_the_compiled_record(dtype):
    """Anderson on a linear contraction y -> c + J y with the compiled record and with the
    PyTorch ops: the same sweeps, the history to the sums' rounding, the dense solution."""
    n, d = 60, 5
    g = torch.Generator().manual_seed(1)
    j = torch.randn(n, n, generator=g, dtype=torch.float64)
    j = 0.95 * j / torch.linalg.matrix_norm(j, ord=2)
    c = torch.randn(n, d, generator=g, dtype=torch.float64)
    exact = torch.linalg.solve(torch.eye(n, dtype=torch.float64) - j, c)
    jd, cd = j.to(dtype), c.to(dtype)
    tol = 1e-11 if dtype == torch.float64 else 1e-5
    runs = [solvers.anderson(lambda y: cd + jd @ y, cd, max_iter=80, tol=tol,
                             vector_kernels=kernels) for kernels in (None, "torch")]
    assert int(runs[0].sweeps) == int(runs[1].sweeps) < 80
    torch.testing.assert_close(runs[0].history, runs[1].history, equal_nan=True, atol=1e-12,
                               rtol=1e-3 if dtype == torch.float64 else 1e-2)
    for run in runs:
        rel = float((run.solution.double() - exact).norm() / exact.norm())
        assert rel < (1e-9 if dtype == torch.float64 else 1e-4)
