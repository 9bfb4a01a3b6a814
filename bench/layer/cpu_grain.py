"""When do the CPU row passes gain from a second thread? (the grain of csrc/cpu/parallel_rows.h)

Times one call of each main CPU pass of the solve -- ``csr_fma`` (every fixed-point and adjoint
iteration), ``neural_edge_weights`` (the neural edge weights) and ``neural_weight_grad`` (the
fused gradient pass) -- on random symmetric graphs whose work (rows + edges, the unit that
``balanced_row_chunks`` splits) spans about 1e3 to 2.5e6, h = 64 channels, float32, under four
conditions: torch.set_num_threads(1) and (2), each with the machine's other core idle and with
a busy-loop process pinned on one core (a stand-in for another job). The conditions are
interleaved: each round times every graph idle and busy (the order flipped every round), and
within a graph and pass the 1- and 2-thread samples alternate, each a batch of calls of about
--batch-ms. The table shows the median time per call and, as the verdict, the median over
adjacent (1-thread, 2-thread) batches of their time ratio: the two batches of a pair share
whatever else the machine was doing, so the ratio stays usable on a machine other jobs use.
The load other processes put on the machine while timing is printed at the end.

    python bench/layer/cpu_grain.py                 # the full table (~2 minutes on an idle 2-core machine)
    python bench/layer/cpu_grain.py --quick         # fewer sizes and rounds
    python bench/layer/cpu_grain.py --json out.json # also the raw samples

The extension as setup.py builds it has no -fopenmp, so at::parallel_for runs serially in it
and both thread counts time the same code; the numbers in parallel_rows.h come from a build
with "-fopenmp" added to the C++ compile and link flags in setup.py.

Run it from outside the source tree (the repo's dignn_kernels/ folder shadows the installed
package) or with the installed package first on the path, e.g. ``cd /tmp && python
/path/to/bench/layer/cpu_grain.py``. Only meaningful with >= 2 cores; with more, --busy-cpu picks
the core the busy loop holds.
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

import torch

import dignn_kernels as dk

H = 64
SIZES = [200, 500, 1000, 2000, 5000, 10000, 20000, 50000]
DEGREES = [5, 50]
PASSES = ["csr_fma", "neural_edge_weights", "neural_weight_grad"]
BUSY_LOOP = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True: pass\n"


def random_graph(n, degree, seed):
    """A random symmetric graph with about `degree` edges per row (duplicates coalesced)."""
    g = torch.Generator().manual_seed(seed)
    half = n * degree // 2
    src = torch.randint(0, n, (half,), generator=g)
    dst = torch.randint(0, n, (half,), generator=g)
    keep = src != dst
    src, dst = src[keep], dst[keep]
    edge_index = torch.stack([torch.cat([src, dst]), torch.cat([dst, src])])
    return dk.build_graph(edge_index, n)


def make_calls(graph, seed):
    """One zero-argument callable per pass, on `graph`, with fresh float32 inputs."""
    n = graph.num_nodes
    g = torch.Generator().manual_seed(seed)
    a, _ = graph.values(torch.float32)
    rowptr, col = graph.rowptr, graph.col
    y, b, z, v = (torch.randn(n, H, generator=g) for _ in range(4))
    p, q = (0.3 * torch.randn(n, H, generator=g) for _ in range(2))
    cy = -torch.rand(n, generator=g)
    rs = 0.1 * torch.rand(n, generator=g)
    o = torch.ops.dignn
    return {
        "csr_fma": lambda: o.csr_fma(rowptr, col, a, y, b, cy, rs),
        "neural_edge_weights": lambda: o.neural_edge_weights(rowptr, col, a, p, q, 1e-6),
        "neural_weight_grad": lambda: o.neural_weight_grad(rowptr, col, a, p, q, z, v, 1e-6,
                                                          None, None, None),
    }


def batch_time(fn, reps):
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps


class NoBusy:
    pid = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


class BusyCore:
    """A pure-Python busy loop pinned on one core while the block runs."""

    def __init__(self, cpu):
        self.cpu = cpu
        self.proc = None

    @property
    def pid(self):
        return self.proc.pid

    def __enter__(self):
        self.proc = subprocess.Popen([sys.executable, "-c", BUSY_LOOP, str(self.cpu)])
        time.sleep(0.3)  # started and spinning
        return self

    def __exit__(self, *exc):
        self.proc.kill()
        self.proc.wait()


def quantiles(xs):
    """(median, interquartile range / median)"""
    xs = sorted(xs)
    q = statistics.quantiles(xs, n=4) if len(xs) >= 2 else [xs[0]] * 3
    return q[1], (q[2] - q[0]) / q[1] if q[1] > 0 else 0.0


def busy_seconds():
    """CPU seconds all cores have spent busy since boot (None off Linux)."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return None
    return (sum(ticks[:8]) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def process_seconds(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class ForeignLoad:
    """Cores' worth of CPU used by other processes (not this one, not the busy loop) over a
    block: what another job on the machine adds to the noise."""

    def __init__(self, busy_pid=None):
        self.busy_pid = busy_pid

    def __enter__(self):
        self.t0 = time.perf_counter()
        self.all0 = busy_seconds()
        self.own0 = time.process_time()
        self.busy0 = process_seconds(self.busy_pid) if self.busy_pid else 0.0
        return self

    def __exit__(self, *exc):
        wall = time.perf_counter() - self.t0
        if self.all0 is None or wall <= 0:
            self.cores = 0.0
            return
        busy = process_seconds(self.busy_pid) - self.busy0 if self.busy_pid else 0.0
        used = busy_seconds() - self.all0 - (time.process_time() - self.own0) - busy
        self.cores = max(0.0, used / wall)


def wait_for_quiet(limit_cores, max_wait_s, busy_pid=None):
    """Sleeps until other processes use less than `limit_cores` over a quarter second (or
    gives up after max_wait_s)."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < max_wait_s:
        with ForeignLoad(busy_pid) as load:
            time.sleep(0.25)
        if load.cores < limit_cores:
            return


def paired_ratio(case, phase):
    """Median over adjacent (1 thread, 2 threads) batches of t2 / t1, and its interquartile
    range / median: the pair shares whatever else the machine was doing at that moment."""
    t1, t2 = case["samples"][f"1/{phase}"], case["samples"][f"2/{phase}"]
    return quantiles([b / a for a, b in zip(t1, t2)])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=SIZES)
    parser.add_argument("--degrees", type=int, nargs="+", default=DEGREES)
    parser.add_argument("--passes", nargs="+", default=PASSES, choices=PASSES)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--batch-ms", type=float, default=5.0,
                        help="one sample times a batch of calls of about this long")
    parser.add_argument("--case-ms", type=float, default=60.0,
                        help="time each case for about this long per round and condition")
    parser.add_argument("--busy-cpu", type=int, default=(os.cpu_count() or 2) - 1)
    parser.add_argument("--no-busy", action="store_true", help="only the idle conditions")
    parser.add_argument("--quick", action="store_true", help="2 rounds, fewer sizes")
    parser.add_argument("--json", help="write the samples and medians here")
    parser.add_argument("--max-foreign", type=float, default=0.15,
                        help="before each graph, wait until other processes use less than this "
                             "many cores (at most --max-wait seconds), and retake the graph's "
                             "samples (at most --retakes times) if they used more meanwhile")
    parser.add_argument("--max-wait", type=float, default=60.0)
    parser.add_argument("--retakes", type=int, default=20)
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds = 2
        args.sizes = [s for s in args.sizes if s in (200, 1000, 5000, 20000)] or args.sizes
    if (os.cpu_count() or 1) < 2:
        sys.exit("needs at least 2 cores")

    threads_before = torch.get_num_threads()
    phases_all = ["idle"] if args.no_busy else ["idle", "busy"]
    cases = []
    for degree in args.degrees:
        for n in args.sizes:
            graph = random_graph(n, degree, seed=n * 1000 + degree)
            calls = make_calls(graph, seed=n + degree)
            work = graph.num_nodes + graph.num_edges
            for name in args.passes:
                fn = calls[name]
                torch.set_num_threads(1)
                for _ in range(3):
                    fn()  # warm the caches and the allocator
                once = min(batch_time(fn, 1) for _ in range(3))
                reps = max(1, math.ceil(args.batch_ms / 1e3 / max(once, 1e-7)))
                pairs = max(1, min(10, round(args.case_ms / 1e3 / (reps * once))))
                cases.append(dict(n=n, degree=degree, edges=graph.num_edges, work=work,
                                  name=name, fn=fn, reps=reps, pairs=pairs,
                                  samples={f"{t}/{p}": [] for p in phases_all for t in (1, 2)}))
    cases.sort(key=lambda c: (c["work"], PASSES.index(c["name"])))
    groups = {}  # one graph's passes, timed back to back
    for case in cases:
        groups.setdefault((case["n"], case["degree"]), []).append(case)
    foreign = {p: [] for p in phases_all}
    retaken = 0
    print(f"{len(cases)} cases, {args.rounds} rounds, torch {torch.__version__}",
          file=sys.stderr, flush=True)
    t_start = time.perf_counter()
    for r in range(args.rounds):
        phases = phases_all if r % 2 == 0 else phases_all[::-1]
        for phase in phases:
            with BusyCore(args.busy_cpu) if phase == "busy" else NoBusy() as busy:
                for group in groups.values():
                    for attempt in range(args.retakes + 1):
                        wait_for_quiet(args.max_foreign, args.max_wait, busy.pid)
                        taken = {}
                        with ForeignLoad(busy.pid) as load:
                            for case in group:
                                for k in range(case["pairs"]):
                                    for threads in ((1, 2) if (r + k) % 2 == 0 else (2, 1)):
                                        torch.set_num_threads(threads)
                                        taken.setdefault((id(case), threads), []).append(
                                            batch_time(case["fn"], case["reps"]))
                        if load.cores <= args.max_foreign:
                            break
                        retaken += 1
                    foreign[phase].append(load.cores)
                    for case in group:
                        for threads in (1, 2):
                            case["samples"][f"{threads}/{phase}"] += taken[id(case), threads]
        print(f"round {r + 1}/{args.rounds} done, {time.perf_counter() - t_start:.0f} s, "
              f"{retaken} graphs retaken so far",
              file=sys.stderr, flush=True)
    torch.set_num_threads(threads_before)

    conds = list(cases[0]["samples"])
    head = (f"{'n':>6} {'deg':>3} {'work':>8} {'pass':<19}" +
            "".join(f" {c + ' us':>10}" for c in conds) +
            "".join(f" {'2:1 ' + p:>9} {'iqr':>4}" for p in phases_all))
    print("median time per call (us) at 1 and 2 threads, other core idle / busy; 2:1 = median "
          "of the 2-thread / 1-thread time ratio over adjacent batches (iqr: its spread)")
    print(head)
    print("-" * len(head))
    rows = []
    for case in cases:
        med = {c: statistics.median(case["samples"][c]) for c in conds}
        ratio = {p: paired_ratio(case, p) for p in phases_all}
        line = f"{case['n']:>6} {case['degree']:>3} {case['work']:>8} {case['name']:<19}"
        line += "".join(f" {med[c] * 1e6:>10.1f}" for c in conds)
        line += "".join(f" {ratio[p][0]:>9.2f} {ratio[p][1] * 100:>3.0f}%" for p in phases_all)
        print(line)
        rows.append({k: case[k] for k in ("n", "degree", "edges", "work", "name", "reps",
                                         "pairs")} |
                    {"median_s": med, "ratio_2_to_1": {p: ratio[p][0] for p in phases_all},
                     "samples_s": case["samples"]})
    every = [x for p in phases_all for x in foreign[p]]
    print(f"other processes' load while timing a graph: median {statistics.median(every):.2f}, "
          f"max {max(every):.2f} cores ({sum(x <= args.max_foreign for x in every)}/{len(every)}"
          f" under {args.max_foreign}, {retaken} graphs retaken)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "h": H, "rounds": args.rounds,
                       "foreign_load_cores": foreign, "cases": rows}, f, indent=1)


if __name__ == "__main__":
    main()
