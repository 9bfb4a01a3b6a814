"""The conjugate-gradient update (dignn_kernels.solvers.cg_update): its Triton kernels (run
in the Triton interpreter on the CPU, compiled on a GPU) against the PyTorch update, and the
whole cg solve with each against a dense solve."""
import pytest
import torch

from dignn_kernels import solvers
from dignn_kernels.solvers.cg_update import (CGState, TorchCGUpdate, TritonCGUpdate,
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
    flag = torch.tensor(live, device=DEVICE)
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


def test_empty_and_zero_width():
    for n, d in ((0, 3), (4, 0)):
        st = _state(n, d, torch.float32)
        w = torch.zeros(n, d, device=DEVICE)
        assert TritonCGUpdate.dot(st, w).shape == (d,)
        TritonCGUpdate.step(st, w, torch.zeros(d, device=DEVICE), torch.tensor(True, device=DEVICE))
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
