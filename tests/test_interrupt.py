"""Bounded, interruptible solves (issue 43): no allocation grows with ``max_iter`` (a solve's
history keeps its first ``HISTORY_LENGTH`` entries), and Ctrl-C ends a long solve with a
KeyboardInterrupt within about a second, on every solver and backend, through the layer, the
function and the compiled ops, forward and backward.

The interrupt cases run in one child process (this file run as a script), which reads case
names on its stdin, prints a marker right before each long solve and reports how it ended;
the test sends SIGINT after the marker. The child's address space is capped a few GB above
what it holds after its imports, so that a solve allocating in proportion to ``max_iter =
10**9`` fails there instead of taking the machine's memory.

Why the long solves never stop by themselves with ``tol=0`` (:func:`case_solve`): the graph is
an even cycle, bipartite, so lambda_max of its rw Laplacian is 2; at mu = 2 the fixed-point
map -Delta/mu has the eigenvalue -1, whose component alternates between X's and 0 forever
without growing (the divergence certificate holds). cg at mu = 0.01 runs until its r.u
underflows to 0 in float64, from where its steps are 0 and its residual stays above 0.
Anderson's residual at mu = 3 stays at the rounding level of the solution, not at 0.
"""
import contextlib
import math
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import warnings

import pytest
import torch

import dignn_kernels as dk
from dignn_kernels import solvers
from dignn_kernels.backends import get_backend
from dignn_kernels.solvers import common

HUGE = 10 ** 9  # max_iter of the long solves: an 8 GB history where one is kept per sweep
NODES, CHANNELS = 24, 4
MU = {"fixed_point": 2.0, "cg": 0.01, "anderson": 3.0}  # never converging at tol=0 (above)
SIGNAL_AFTER = 0.3  # seconds from the marker to SIGINT: the solve is in its loop by then
PROMPT = 2.0  # seconds from SIGINT to the KeyboardInterrupt, at most
SOLVERS = ["fixed_point", "cg", "anderson"]
BACKENDS = ["cpu", "torch", "triton"]


def cycle_edges(n: int = NODES) -> torch.Tensor:
    """Both directions of the cycle 0 - 1 - ... - (n-1) - 0 (n even: bipartite)."""
    src = torch.arange(n)
    dst = (src + 1) % n
    return torch.stack([torch.cat([src, dst]), torch.cat([dst, src])])


# --------------------------------------------------------------------- the child's cases --
# A case's name: "<entry>-<direction>-<solver>-<backend>[-<storage dtype>]", entry one of
# layer (FusedImplicitDiffusion), function (dignn_kernels.implicit_diffusion) or op
# (torch.ops.dignn.implicit_diffusion[_backward], the compiled fused loop itself).

INTERRUPT_CASES = (
    [f"layer-forward-{s}-{b}" for s in SOLVERS for b in BACKENDS]
    + ["layer-forward-fixed_point-cpu-bfloat16",  # the fused loop with 16-bit iterates
       "layer-forward-fixed_point-torch-float16"]
    + [f"function-forward-{s}-cpu" for s in SOLVERS] + ["function-forward-fixed_point-torch"]
    + [f"layer-backward-{s}-cpu" for s in SOLVERS]
    + ["layer-backward-fixed_point-torch", "layer-backward-fixed_point-triton",
       "function-backward-cg-torch"]
    + ["op-forward-fixed_point-cpu", "op-backward-fixed_point-cpu"])

# max_iter = 10**9 with a reachable tol: the solve stops by it, as with a small max_iter.
CONVERGE_CASES = (
    [f"layer-both-{s}-{b}" for s in ("cg", "anderson") for b in BACKENDS]
    + ["layer-both-fixed_point-torch", "layer-both-fixed_point-triton",
       "function-both-fixed_point-cpu-bfloat16"])  # (float64 x: the solvers' loop)

# The Triton interpreter takes up to a second for a sweep of cg or Anderson: those cases, and
# the Triton solves of many sweeps, run in the full suite only.
SLOW = [pytest.mark.slow]


def params(names):
    return [pytest.param(n, marks=SLOW if "-triton" in n and (
        "fixed_point" not in n or n in CONVERGE_CASES) else []) for n in names]


def case_solve(name: str, converge: bool = False):
    """``solve(max_iter, tol) -> tensor`` of the case ``name``: the forward's output or the
    gradient of the input (``both``: the two, concatenated)."""
    entry, direction, solver, backend, *storage = name.split("-")
    storage = getattr(torch, storage[0]) if storage else None
    # 16-bit iterates with float32 x run in the compiled fused loop, with float64 x in the
    # solvers' loop over the passes
    dtype = torch.float32 if storage is not None and entry == "layer" else torch.float64
    mu = 3.0 if converge else MU[solver]
    ei = cycle_edges()
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(NODES, CHANNELS, generator=gen, dtype=dtype)
    grad = torch.randn(NODES, CHANNELS, generator=gen, dtype=dtype)
    graph = dk.build_graph(ei, NODES)
    w, chi, kappa = graph.fixed_laplacian("rw", dtype)
    if entry == "op":
        ops = torch.ops.dignn
        if direction == "forward":
            return lambda max_iter, tol: ops.implicit_diffusion(
                graph.rowptr, graph.col, w, x, chi, None, None, kappa, mu, 1e-6, max_iter, tol,
                None, None, None)[0]
        z = ops.implicit_diffusion(graph.rowptr, graph.col, w, x, chi, None, None, kappa, mu,
                                   1e-6, 20, 0.0, None, None, None)[0]
        return lambda max_iter, tol: ops.implicit_diffusion_backward(
            graph.rowptr, graph.col, w, w, kappa, None, None, None, x, chi, None, None, z, grad,
            mu, 1e-6, max_iter, tol)[0]
    if entry == "layer":
        layer = dk.FusedImplicitDiffusion(CHANNELS, mu=mu, laplacian="rw", solver=solver,
                                          backend=backend, storage_dtype=storage).to(dtype)

        def call(x, max_iter, tol):
            layer.max_iter, layer.tol = max_iter, tol
            return layer(x, ei)
    else:
        def call(x, max_iter, tol):
            return dk.implicit_diffusion(graph.rowptr, graph.col, w, x, chi, kappa=kappa, mu=mu,
                                         max_iter=max_iter, tol=tol, solver=solver,
                                         backend=backend, storage_dtype=storage)[0]
    if direction == "forward":
        return lambda max_iter, tol: call(x, max_iter, tol).detach()

    def gradient(max_iter, tol):
        # backward: from X = 0 the forward stops at once, the adjoint solve of grad does not
        x_in = (x.clone() if direction == "both" else torch.zeros_like(x)).requires_grad_()
        z = call(x_in, max_iter, tol)
        z.backward(grad)
        return torch.cat([z.detach(), x_in.grad]) if direction == "both" else x_in.grad
    return gradient


def _address_space() -> int:
    with open("/proc/self/status") as f:
        return 1024 * int(next(line for line in f if line.startswith("VmSize:")).split()[1])


def _child() -> None:
    """The child: for each case name on stdin, one line on stdout saying how it ended."""
    import resource
    # SIGINT raises KeyboardInterrupt here (pytest-xdist's workers ignore it, and a child
    # inherits that)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    warnings.simplefilter("ignore")  # (the non-converging solves warn)
    for name in (INTERRUPT_CASES[0], CONVERGE_CASES[0]):  # imports and kernels, before the cap
        case_solve(name, name in CONVERGE_CASES)(3, 0.0)
    resource.setrlimit(resource.RLIMIT_AS, (_address_space() + 3 * 2 ** 30,
                                            resource.getrlimit(resource.RLIMIT_AS)[1]))
    print("READY", flush=True)
    for line in sys.stdin:
        name = line.strip()
        try:
            converge = name in CONVERGE_CASES
            solve = case_solve(name, converge)
            if converge:
                tol = 1e-6 if "-float" not in name and "-bfloat" not in name else 1e-2
                want = solve(200, tol)
                got = solve(HUGE, tol)
                print(f"CONVERGED {name} {torch.equal(got, want)}", flush=True)
                continue
            want = solve(5, 0.0)
            print(f"START {name}", flush=True)
            try:
                solve(HUGE, 0.0)
            except KeyboardInterrupt:
                print(f"INTERRUPTED {name} {time.monotonic()!r}", flush=True)
                # the layer, the graph and their caches intact
                print(f"INTACT {name} {torch.equal(solve(5, 0.0), want)}", flush=True)
            else:
                print(f"FINISHED {name}", flush=True)
        except BaseException as e:  # noqa: B036 (reported to the test, which fails)
            print(f"ERROR {name} {type(e).__name__}: {str(e)[:300]!r}".replace("\n", " "),
                  flush=True)


class Child:
    """The child process, restarted after a case that it did not end."""

    def __init__(self):
        self.proc = None
        self.lines = None

    def start(self):
        env = dict(os.environ, TRITON_INTERPRET="1")  # (its solves run on the CPU only)
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__)], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, bufsize=1)
        self.lines = queue.Queue()
        proc, lines = self.proc, self.lines
        threading.Thread(target=lambda: [lines.put(s.strip()) for s in proc.stdout],
                         daemon=True).start()
        assert self.next_line(240) == "READY"

    def next_line(self, timeout: float) -> str:
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            return ""

    @contextlib.contextmanager
    def case(self, name: str):
        """Runs the case ``name``; a case that fails stops the child (it may still be
        solving, or have taken a SIGINT meant for its solve elsewhere), the next one starts
        it anew."""
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        self.proc.stdin.write(name + "\n")
        self.proc.stdin.flush()
        try:
            yield
        except BaseException:
            self.stop()
            raise

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


@pytest.fixture(scope="module")
def child():
    c = Child()
    yield c
    c.stop()


@pytest.mark.parametrize("name", params(INTERRUPT_CASES))
def test_ctrl_c_ends_a_long_solve(child, name):
    """SIGINT during a solve of max_iter = 10**9 at tol = 0 raises KeyboardInterrupt within
    PROMPT seconds, and the same call then gives what it gave before."""
    with child.case(name):
        started = child.next_line(120)
        assert started == f"START {name}", started
        time.sleep(SIGNAL_AFTER)
        sent = time.monotonic()
        child.proc.send_signal(signal.SIGINT)
        line = child.next_line(5.0)
        assert line, f"{name}: still running 5 s after SIGINT"
        assert line.startswith(f"INTERRUPTED {name} "), line
        assert float(line.split()[2]) - sent < PROMPT
        # a short solve after the interrupt gives what it gave before
        assert child.next_line(120) == f"INTACT {name} True"


@pytest.mark.parametrize("name", params(CONVERGE_CASES))
def test_huge_max_iter_allocates_nothing_in_proportion(child, name):
    """max_iter = 10**9 under the child's address-space cap: the solve (forward and
    backward) stops by its tol, with the values of max_iter = 500."""
    with child.case(name):
        line = child.next_line(120)
        assert line == f"CONVERGED {name} True", line


# ------------------------------------------------------------ the history, in process --

def _device(backend: str) -> torch.device:
    """The CPU, or for Triton without its interpreter (TRITON_INTERPRET unset with a GPU)
    the GPU its kernels were compiled for."""
    if backend == "triton" and not get_backend("triton").available(torch.device("cpu")):
        return torch.device("cuda")
    return torch.device("cpu")


def _system(backend: str, mu: float, dtype=torch.float64):
    device = _device(backend)
    graph = dk.build_graph(cycle_edges().to(device), NODES)
    w, chi, kappa = graph.fixed_laplacian("rw", dtype)
    gen = torch.Generator().manual_seed(1)
    rhs = torch.randn(NODES, CHANNELS, generator=gen, dtype=dtype).to(device)
    return solvers.EquilibriumSystem(get_backend(backend), graph.rowptr, graph.col, w, chi,
                                     kappa, mu), rhs


def _solve(backend, solver, adjoint, max_iter, tol, mu, storage=None):
    system, rhs = _system(backend, mu)
    run = solvers.solve_adjoint if adjoint else solvers.solve_forward
    return run(system, rhs, solver, max_iter=max_iter, tol=tol, storage_dtype=storage)


HISTORY_CASES = [(s, b, a, None) for s in SOLVERS for b in BACKENDS for a in (False, True)] + [
    ("fixed_point", "torch", False, torch.bfloat16), ("fixed_point", "triton", True,
                                                      torch.float16)]


def history_params(slow_triton):
    """The cases, those of the Triton interpreter for which ``slow_triton`` says so slow."""
    out = []
    for solver, backend, adjoint, storage in HISTORY_CASES:
        name = "-".join([solver, backend, "adjoint" if adjoint else "forward"] +
                        ([str(storage).split(".")[1]] if storage else []))
        slow = backend == "triton" and slow_triton(solver, adjoint)
        out.append(pytest.param((solver, backend, adjoint, storage), id=name,
                                marks=SLOW if slow else []))
    return out


# (the bookkeeping that depends on max_iter is the loops', the same for every backend)
@pytest.mark.parametrize("case", history_params(lambda solver, adjoint: True))
def test_history_does_not_grow_with_max_iter(case):
    """A solve that stops by its tol keeps a history of the same size at max_iter = 10**5 and
    10**6, and returns the same solution, stats and history."""
    solver, backend, adjoint, storage = case
    tol = 1e-6 if storage is None else 1e-2  # (16-bit iterates: their rounding, 4e-3)
    runs = [_solve(backend, solver, adjoint, m, tol, 3.0, storage) for m in (10 ** 5, 10 ** 6)]
    assert runs[0].history.numel() == runs[1].history.numel() < 10 ** 5
    assert not bool(runs[0].diverged) and float(runs[0].relative) <= tol
    assert torch.equal(runs[1].solution, runs[0].solution)
    assert torch.equal(runs[1].stats(), runs[0].stats())
    assert torch.equal(runs[1].history.nan_to_num(-1.0), runs[0].history.nan_to_num(-1.0))


# (each solver's Triton bookkeeping kernel writes its entry in the forward and the adjoint)
@pytest.mark.parametrize("case", history_params(lambda solver, adjoint: adjoint))
def test_history_keeps_the_first_entries(monkeypatch, case):
    """Past HISTORY_LENGTH entries (3 here) a solve runs on as before: the same solution and
    stats, its history the first 3 entries of the full one (every backend's bookkeeping,
    the Triton kernels' included, writes the entries past them where they are dropped)."""
    solver, backend, adjoint, storage = case
    mu = {"fixed_point": 2.0, "cg": 3.0, "anderson": 3.0}[solver]  # 8 sweeps, none at rest
    full = _solve(backend, solver, adjoint, 8, 0.0, mu, storage)
    monkeypatch.setattr(common, "HISTORY_LENGTH", 3)
    kept = _solve(backend, solver, adjoint, 8, 0.0, mu, storage)
    assert int(kept.sweeps) == int(full.sweeps) > 3
    assert kept.history.numel() == 3 and bool(torch.isfinite(kept.history).all())
    assert torch.equal(kept.history, full.history[:3])
    assert torch.equal(kept.solution, full.solution)
    assert torch.equal(kept.stats(), full.stats())


def test_history_length_is_documented_and_bounded():
    """The bound is the module's constant, a few tens of KB of float64."""
    assert common.HISTORY_LENGTH * 8 <= 2 ** 20
    out = _solve("torch", "fixed_point", False, 10 ** 6, 1e-10, 3.0)
    assert out.history.numel() == common.HISTORY_LENGTH
    assert math.isfinite(float(out.history[0]))


if __name__ == "__main__":
    _child()
