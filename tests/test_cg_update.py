"""The conjugate-gradient update (dignn_kernels.solvers.cg_update): its Triton kernels (run
in the Triton interpreter on the CPU, compiled on a GPU) against the PyTorch update, and the
whole cg solve with each against a dense solve."""
import pytest
import torch

from dignn_kernels import solvers
from dignn_kernels.solver_state import DIVERGED, DONE, SWEEPS
from dignn_kernels.solvers.cg_update import (CGState, TorchCGUpdate, TritonCGUpdate, cg_flags,
                                             cg_update_for)

pytest.importorskip("triton")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _state(n, d, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *shape: torch.randn(*shape, generator=g, dtype=dtype).to(DEVICE)  # noqa: E731
    inv = (torch.rand(n, generator=g, dtype=dtype) + 0.5).to(DEVICE)
    scale = (torch.rand(n, generator=g, dtype=dtype) + 0.5).to(DEVICE)
    decoupled = (torch.rand(n, generator=g) < 0.2).to(DEVICE)
    st = CGState.start(rnd(n, d), inv, scale, decoupled)
    st.p, st.s = rnd(n, d), rnd(n, d)
    st.gamma = rnd(d).abs()
    st.gamma_prev = rnd(d).abs()
    st.alpha_prev = rnd(d).abs()
    if d > 0:
        st.gamma_prev[0] = 0.0  # a restart
    if d > 1:
        st.alpha_prev[1] = 0.0  # a breakdown
    return st


def _clone(st):
    return CGState(**{k: (v.clone() if isinstance(v, torch.Tensor) else v)
                      for k, v in st.__dict__.items()})


@pytest.mark.parametrize("n,d", [(1, 1), (63, 5), (130, 64), (70, 80)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("live", [True, False])
def test_triton_update_equals_torch(n, d, dtype, live):
    st = _state(n, d, dtype, seed=n + d)
    w = torch.randn(n, d, dtype=dtype, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    flag = torch.tensor([0.0 if live else 1.0], dtype=torch.float64, device=DEVICE)  # done
    a, b = _clone(st), _clone(st)
    delta_t = TorchCGUpdate.dot(a, w)
    delta_k = TritonCGUpdate.dot(b, w)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(delta_k, delta_t, **tol)
    TorchCGUpdate.step(a, w, delta_t, flag)
    TritonCGUpdate.step(b, w, delta_t, flag)
    for name in ("z", "r", "u", "p", "s", "alpha_prev"):
        torch.testing.assert_close(getattr(b, name), getattr(a, name), **tol, msg=name)
    torch.testing.assert_close(b.reduction(), a.reduction(), **tol)
    if not live:  # a finished solve keeps z and r
        assert torch.equal(a.z, st.z) and torch.equal(b.r, st.r)
        assert not b.alpha_prev.any()


FINISH_CASES = [  # (d, dtype, sums' kind, flags' done, target): one block and several
    (5, torch.float32, "finite", False, 1e-3), (5, torch.float64, "finite", False, 1e9),
    (2100, torch.float32, "finite", False, 1e-3), (6, torch.float32, "nan", False, 1e-3),
    (6, torch.float64, "inf", False, 1e-3), (6, torch.float32, "finite", True, 1e-3),
    (6, torch.float64, "negative", False, 1e-3)]


@pytest.mark.parametrize("d,dtype,kind,done,target", FINISH_CASES)
def test_triton_finish_equals_torch(d, dtype, kind, done, target):
    """The iteration's bookkeeping in one kernel against the PyTorch ops: the residual, the
    history entry, the sweep count, the divergence and done flags and the kept residual, for
    a live iteration that runs on or stops, a non-finite residual, a negative sum rounding
    (clamped to 0) and a finished solve (flags as they were)."""
    g = torch.Generator().manual_seed(d)
    sums = torch.rand(2, d, generator=g, dtype=dtype)
    if kind == "nan":
        sums[1, d // 2] = float("nan")
    elif kind == "inf":
        sums[1, 0] = float("inf")
    elif kind == "negative":
        sums[1] = -1e-300
    residual = torch.tensor(2.0, dtype=torch.float64)
    flags = cg_flags(residual, torch.tensor(target, dtype=torch.float64),
                     torch.tensor(4.0, dtype=torch.float64))
    flags[DONE] = float(done)
    flags[SWEEPS] = 3.0
    results = []
    for update in (TorchCGUpdate, TritonCGUpdate):
        st = _state(4, d, dtype)
        f, history = flags.clone().to(DEVICE), torch.full((5,), -1.0, dtype=torch.float64,
                                                           device=DEVICE)
        update.finish(st, sums.to(DEVICE), f, history, 2)
        assert torch.equal(st.gamma.cpu(), sums[0]) and st.pending is None
        results.append((f.cpu(), history.cpu()))
    (f_t, h_t), (f_k, h_k) = results
    torch.testing.assert_close(f_k, f_t, rtol=1e-13, atol=0, equal_nan=True)
    torch.testing.assert_close(h_k, h_t, rtol=1e-13, atol=0, equal_nan=True)
    res = float(h_t[2]) * 4.0
    if done:
        assert torch.equal(f_t, flags)
    else:
        assert float(f_t[SWEEPS]) == 4.0
        assert float(f_t[DIVERGED]) == float(kind in ("nan", "inf"))
        assert float(f_t[DONE]) == float(kind != "finite" or res <= target)
        assert kind != "negative" or res == 0.0


def test_empty_and_zero_width():
    for n, d in ((0, 3), (4, 0)):
        st = _state(n, d, torch.float32)
        w = torch.zeros(n, d, device=DEVICE)
        assert TritonCGUpdate.dot(st, w).shape == (d,)
        TritonCGUpdate.step(st, w, torch.zeros(d, device=DEVICE),
                              torch.zeros(1, dtype=torch.float64, device=DEVICE))
        assert st.reduction().shape == (2, d)


@pytest.mark.parametrize("vector_kernels", ["torch", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cg_solve_with_each_update_matches_dense(vector_kernels, dtype):
    g = torch.Generator().manual_seed(0)
    n, d = 90, 6
    b = torch.randn(n, n, generator=g, dtype=torch.float64)
    a = b @ b.T / n + torch.diag(torch.rand(n, generator=g, dtype=torch.float64) + 0.5)
    rhs = torch.randn(n, d, generator=g, dtype=torch.float64)
    exact = torch.linalg.solve(a, rhs)
    a_dev, rhs_dev = a.to(dtype).to(DEVICE), rhs.to(dtype).to(DEVICE)
    out = solvers.conjugate_gradient(lambda v: a_dev @ v, rhs_dev,
                                     1.0 / torch.diagonal(a_dev), max_iter=200,
                                     tol=1e-12 if dtype == torch.float64 else 1e-6,
                                     vector_kernels=vector_kernels)
    rel = float((out.solution.double().cpu() - exact).norm() / exact.norm())
    assert rel < (1e-10 if dtype == torch.float64 else 1e-4)
    assert int(out.sweeps) < 200


def test_both_updates_take_the_same_steps():
    g = torch.Generator().manual_seed(2)
    n, d = 120, 4
    b = torch.randn(n, n, generator=g, dtype=torch.float64)
    a = (b @ b.T / n + torch.eye(n, dtype=torch.float64)).to(DEVICE)
    rhs = torch.randn(n, d, generator=g, dtype=torch.float64).to(DEVICE)
    runs = [solvers.conjugate_gradient(lambda v: a @ v, rhs, 1.0 / torch.diagonal(a),
                                       max_iter=30, tol=1e-11, vector_kernels=k)
            for k in ("torch", "triton")]
    assert int(runs[0].sweeps) == int(runs[1].sweeps)
    torch.testing.assert_close(runs[1].history, runs[0].history, rtol=1e-9, atol=1e-14,
                               equal_nan=True)
    torch.testing.assert_close(runs[1].solution, runs[0].solution, rtol=1e-10, atol=1e-12)


def test_vector_kernels_argument():
    x = torch.zeros(3, 2)
    assert cg_update_for(x, "torch") is TorchCGUpdate
    assert cg_update_for(x) is (TritonCGUpdate if x.is_cuda else TorchCGUpdate)
    with pytest.raises(ValueError, match="vector_kernels must be one of"):
        cg_update_for(x, "cuda")
