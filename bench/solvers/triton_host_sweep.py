"""Host time of one sweep of the solvers' fixed point on the Triton backend, with the row step
(``Backend.row_step``: checked once per solve; the norms of the stopping test and the
certificate from the sweep and the loop's bookkeeping in one small kernel) against the same
loop on the row pass alone (a dispatcher op and its checks per sweep; the norms, the
bookkeeping and the kept iterate in some twenty small torch ops, each a kernel launch on a
GPU).

What a GPU sweep waits on when the graph is small: the Triton launches are replaced by stubs
(the row pass by a contraction y -> y/2 - 0.3 b on a 64 x 8 signal, so that the solve runs
every sweep and the n x d work is negligible; the bookkeeping kernel by nothing, so the
row step's host time leaves out that one launch), and what is left is the Python, the
dispatcher and the small-tensor ops of each sweep, timed on the CPU tensors of the Triton
interpreter's device. 20 sweeps per
solve, the two variants interleaved round by round, medians of the rounds; the flag read
every 16 sweeps (the GPU default) and every sweep (the CPU default).

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 python bench/solvers/triton_host_sweep.py \\
        bench/results/triton_host_sweep_cpu.json

The same for an iteration of cg with the Triton vector update (its dot, step and bookkeeping
launches stubbed, the sweep an identity): the bookkeeping (residual, history, flags, stopping
test) in the update's one kernel against the same in PyTorch ops; and for an iteration of
cg on the Triton backend's system (every launch stubbed): its sweep as the backend's row
product (the dots w.u from the sweep) against the row map (the row pass prepared once per
solve) and the row pass op, each with a separate dot kernel.

And for an iteration of Anderson (window 5) on a stubbed sweep: its vector work (the window's
dot products, small SPD solves and mix) as Triton kernels (launches stubbed) against PyTorch
ops (elementwise small solves, a GPU's without Triton; LAPACK's, the CPU's), with the PyTorch
ops each variant runs per iteration (each a kernel launch on a GPU); and for an iteration of
Anderson on the Triton backend's system (every launch stubbed): its sweep as the backend's
row map against the row pass op.

On a GPU each small op is a kernel launch (a few microseconds of host time each); this
measures the CPU-side cost only, not the GPU's.
"""
import contextlib
import dataclasses
import json
import os
import platform
import statistics
import sys
import time

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

import dignn_kernels as dk  # noqa: E402
from dignn_kernels.backends import triton as tb  # noqa: E402

NODES, CHANNELS, SWEEPS, ROUNDS = 64, 8, 20, 30


def main(out_path):
    torch.set_num_threads(1)
    if not tb.available(torch.device("cpu")):
        raise SystemExit("needs the Triton interpreter (TRITON_INTERPRET=1 before triton loads)")
    jit = tb._jit()
    parts = torch.tensor([1.0, 1.0, 0.0] * 4, dtype=torch.float64)

    def launch_stub(sched, col, w, y, b, cy, rs, out, done=None, c=None, sums=jit.SUMS_NONE):
        if b is None:  # cg's product: A y ~ y, its dots y.y from 4 programs
            out.copy_(y)
            return (y * y).view(4, -1, y.shape[1]).sum(dim=1)
        torch.add(y.mul(0.5), b, alpha=-0.3, out=out)  # contracts; 20 sweeps do not converge
        return parts.clone() if sums == jit.SUMS_NORMS else None  # the plain pass: no sums

    jit.csr_fma = launch_stub
    jit.fixed_point_update = lambda sums, state, history, k: None  # one Triton launch on a GPU
    gen = torch.Generator().manual_seed(0)
    ei = torch.randint(0, NODES, (2, 10 * NODES), generator=gen)
    graph = dk.build_graph(torch.cat([ei, ei.flip(0)], 1), NODES)
    w, chi, kappa = graph.fixed_laplacian("rw", torch.float32)
    x = torch.randn(NODES, CHANNELS, generator=gen)
    variants = {"row_step": tb.TRITON,
                "row_pass": dataclasses.replace(tb.TRITON, row_step=None, row_map=None)}
    systems = {name: dk.solvers.EquilibriumSystem(backend, graph.rowptr, graph.col, w, chi,
                                                  kappa, 2.2)
               for name, backend in variants.items()}

    def sweep_us(name, check_every):
        start = time.perf_counter()
        out = dk.solvers.solve_forward(systems[name], x, "fixed_point", max_iter=SWEEPS + 1,
                                       tol=0.0, check_every=check_every)
        elapsed = time.perf_counter() - start
        # (the row step's bookkeeping is stubbed: its state counts no sweep)
        assert int(out.sweeps) == (0 if name == "row_step" else SWEEPS)
        assert not bool(out.diverged)
        return elapsed / SWEEPS * 1e6

    result = {"command": "PYTHONPATH=$PWD OMP_NUM_THREADS=1 python bench/solvers/triton_host_sweep.py",
              "machine": f"{platform.processor() or platform.machine()}, "
                         f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}",
              "torch": torch.__version__, "nodes": NODES, "channels": CHANNELS,
              "sweeps_per_solve": SWEEPS, "rounds": ROUNDS, "us_per_sweep": {}}
    for check_every in (16, 1):
        result["us_per_sweep"][f"check_every_{check_every}"] = interleaved_medians(
            variants, lambda name: sweep_us(name, check_every), f"check_every={check_every}",
            "us/sweep")
    result["cg_us_per_iteration"] = cg_host_times(gen)
    result["cg_sweep_us_per_iteration"] = cg_sweep_host_times(graph, w, chi, kappa, x)
    result["anderson_us_per_iteration"], result["anderson_torch_ops_per_iteration"] = \
        anderson_host_times(x)
    result["anderson_sweep_us_per_iteration"] = anderson_sweep_host_times(graph, w, chi, kappa,
                                                                          x)
    with open(out_path, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")


def interleaved_medians(variants, time_one, label, unit):
    """{name: median of time_one(name)} over ROUNDS rounds that each time every variant once,
    after one warm-up call each; prints them after `label`."""
    times = {name: [] for name in variants}
    for name in variants:
        time_one(name)
    for _ in range(ROUNDS):
        for name in variants:
            times[name].append(time_one(name))
    medians = {name: round(statistics.median(t), 1) for name, t in times.items()}
    print(f"{label}: " + ", ".join(f"{name} {us:.0f} {unit}" for name, us in medians.items()))
    return medians


@contextlib.contextmanager
def solvers_patched(name, value):
    """``name`` replaced by ``value`` in every module of :mod:`dignn_kernels.solvers` that
    holds it (a solver's loop imports the factory of its vector work by name). The package's
    submodules only, not all of sys.modules: the solves timed here include the patch."""
    import types
    held = [(module, getattr(module, name)) for module in vars(dk.solvers).values()
            if isinstance(module, types.ModuleType) and hasattr(module, name)]
    for module, _ in held:
        setattr(module, name, value)
    try:
        yield
    finally:
        for module, original in held:
            setattr(module, name, original)


def cg_update_of(update):
    """cg's vector update forced to `update` (the Triton one runs on CPU tensors only because
    its launches are stubbed)."""
    return solvers_patched("cg_update_for", lambda rhs, kernels: update)


def cg_host_times(gen):
    """Host time per iteration of cg with the Triton vector update (its launches stubbed out,
    a stubbed sweep): the iteration's bookkeeping in the update's one kernel (``finish``,
    stubbed: its launch not counted) against the same bookkeeping in PyTorch ops."""
    from dignn_kernels.solvers import _triton_cg, cg_update
    _triton_cg.column_dots = lambda a, b: a.new_ones(a.shape[1])
    sums = torch.tensor([[1.0] * CHANNELS, [1.0] * CHANNELS])

    def cg_step_stub(state, w, delta, live):
        return state.alpha_prev, sums.clone()

    _triton_cg.cg_step = cg_step_stub
    _triton_cg.cg_finish = lambda sums, flags, history, k: None
    class TorchFinish(cg_update.TritonCGUpdate):  # the Triton update, PyTorch bookkeeping
        finish = staticmethod(cg_update.TorchCGUpdate.finish)

    variants = {"finish_kernel": cg_update.TritonCGUpdate, "finish_torch": TorchFinish}
    rhs = torch.randn(NODES, CHANNELS, generator=gen)
    inv = torch.rand(NODES, generator=gen) + 0.5

    def iteration_us(name):
        with cg_update_of(variants[name]):
            start = time.perf_counter()
            out = dk.solvers.conjugate_gradient(lambda u: u, rhs, inv, max_iter=SWEEPS,
                                                tol=0.0, check_every=16)
            elapsed = time.perf_counter() - start
        # (the kernel's bookkeeping is stubbed: its flags count no iteration)
        assert int(out.sweeps) == (0 if name == "finish_kernel" else SWEEPS)
        return elapsed / SWEEPS * 1e6

    return interleaved_medians(variants, iteration_us, "cg, flag read every 16 iterations",
                               "us/iteration")


def cg_sweep_host_times(graph, w, chi, kappa, x):
    """Host time per iteration of cg on the Triton backend's system, its launches stubbed
    (the sweep an identity, the vector update, dots and bookkeeping kernels no-ops): the
    sweep as the backend's row product (its dots w.u from the sweep's own partial sums)
    against the row map (the row pass prepared once per solve, a zero right-hand side) and
    the row pass op (a dispatcher op, its checks and the schedule's lookup per sweep), each
    with the dot kernel."""
    from dignn_kernels.solvers import _triton_cg, cg_update
    sums = torch.ones(2, CHANNELS)
    _triton_cg.column_dots = lambda a, b: a.new_ones(a.shape[1])
    _triton_cg.cg_step = lambda state, w, delta, done: (state.alpha_prev, sums.clone())
    _triton_cg.cg_finish = lambda sums, flags, history, k: None
    variants = {"row_product": tb.TRITON,
                "row_map": dataclasses.replace(tb.TRITON, row_product=None),
                "row_pass": dataclasses.replace(tb.TRITON, row_product=None, row_map=None)}
    systems = {name: dk.solvers.EquilibriumSystem(backend, graph.rowptr, graph.col, w, chi,
                                                  kappa, 2.2)
               for name, backend in variants.items()}

    def iteration_us(name):
        with cg_update_of(cg_update.TritonCGUpdate):
            start = time.perf_counter()
            out = dk.solvers.solve_forward(systems[name], x, "cg", max_iter=SWEEPS, tol=0.0,
                                           check_every=16)
            elapsed = time.perf_counter() - start
        assert int(out.sweeps) == 0  # (the bookkeeping is stubbed: no iteration counted)
        return elapsed / SWEEPS * 1e6

    return interleaved_medians(variants, iteration_us,
                               "cg on the system, flag read every 16 iterations",
                               "us/iteration")


class _NoLaunch:
    """A Triton kernel whose launches do nothing (``kernel[grid](...)``)."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def anderson_host_times(x):
    """Host time per iteration of Anderson (window 5, 20 iterations, the flag never read: every
    iteration runs, converged or not) on a stubbed sweep (y -> x + tanh(y) / 2), by the vector
    work it takes: the Triton kernels (their launches stubbed out, their PyTorch ops kept), the
    PyTorch ops a GPU without Triton runs (elementwise small solves) and the CPU's (LAPACK's
    small solves); and the PyTorch ops per iteration of each (torch.profiler, views and scalar
    reads left out; on a GPU each a kernel launch, LAPACK's aside)."""
    from torch.profiler import profile
    from dignn_kernels.solvers import _triton_anderson, anderson_update
    for name in [name for name in dir(_triton_anderson) if name.endswith("_kernel")]:
        setattr(_triton_anderson, name, _NoLaunch())

    def torch_ops(rhs, window):
        vectors = anderson_update.AndersonVectors(rhs, window)
        vectors.solve = anderson_update.torch_small_spd_solve
        return vectors

    variants = {"triton_kernels": anderson_update.TritonAndersonVectors,
                "torch_ops": torch_ops, "cpu_lapack": anderson_update.AndersonVectors}
    step = lambda y: torch.add(x, torch.tanh(y), alpha=0.5)  # noqa: E731

    def solve(name):
        with solvers_patched("anderson_vectors_for",
                             lambda rhs, window, kernels: variants[name](rhs, window)):
            return dk.solvers.anderson(step, x, max_iter=SWEEPS + 1, tol=0.0, check_every=0)

    def iteration_us(name):
        start = time.perf_counter()
        solve(name)
        return (time.perf_counter() - start) / SWEEPS * 1e6

    skip = ("aten::view", "aten::select", "aten::slice", "aten::as_strided", "aten::t",
            "aten::transpose", "aten::diagonal", "aten::unsqueeze", "aten::expand",
            "aten::alias", "aten::detach", "aten::lift_fresh", "aten::empty",
            "aten::empty_like", "aten::empty_strided", "aten::item", "aten::_local_scalar_dense",
            "aten::is_nonzero", "aten::resolve_conj", "aten::resolve_neg")
    ops = {}
    for name in variants:
        with profile() as prof:
            solve(name)
        ops[name] = round(sum(e.count for e in prof.key_averages()
                              if e.key.startswith("aten::") and e.key not in skip) / SWEEPS)
    print("anderson ops per iteration: " + ", ".join(f"{k} {v}" for k, v in ops.items()))
    return interleaved_medians(variants, iteration_us, "anderson, flag never read",
                               "us/iteration"), ops


def anderson_sweep_host_times(graph, w, chi, kappa, x):
    """Host time per iteration of Anderson (window 5, the flag never read) on the Triton
    backend's system, every launch stubbed (the row pass a contraction, the vector kernels
    no-ops: run after :func:`anderson_host_times` stubbed them): its sweep as the backend's
    row map (the graph checked and scheduled once per solve) against the csr_fma op (a
    dispatcher op, its checks and the schedule's lookup per sweep)."""
    from dignn_kernels.solvers.anderson_update import TritonAndersonVectors
    variants = {"row_map": tb.TRITON, "row_pass": dataclasses.replace(tb.TRITON, row_map=None)}
    systems = {name: dk.solvers.EquilibriumSystem(backend, graph.rowptr, graph.col, w, chi,
                                                  kappa, 2.2)
               for name, backend in variants.items()}

    def iteration_us(name):
        with solvers_patched("anderson_vectors_for",
                             lambda rhs, window, kernels: TritonAndersonVectors(rhs, window)):
            start = time.perf_counter()
            dk.solvers.solve_forward(systems[name], x, "anderson", max_iter=SWEEPS + 1, tol=0.0,
                                     check_every=0)
            return (time.perf_counter() - start) / SWEEPS * 1e6

    return interleaved_medians(variants, iteration_us,
                               "anderson on the system, flag never read", "us/iteration")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "triton_host_sweep_cpu.json")
