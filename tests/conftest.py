"""Small graphs of every kind the layer must handle, and helpers shared by the tests."""
import os
import traceback
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode

# The Triton kernels run on CPU tensors only in Triton's interpreter, which has to be chosen
# before the kernels are defined (dignn_kernels defines them on first use, so setting it here,
# before any test runs one, is early enough). Without a GPU the whole session uses it and
# tests/test_triton.py runs every Triton kernel on the CPU; with a GPU the kernels compile for
# it and the same tests run on CUDA tensors (marker `cuda`). The interpreter only affects
# @triton.jit functions: nothing else in this suite (torch.compile on the CPU included)
# goes through Triton.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import dignn_kernels as dk  # noqa: E402

# pytest-xdist (`pytest -n auto`, as in the README's test command) runs the tests in one
# process per core. Each process gets its share of the cores for torch's intra-op threads: a
# thread on a core that another worker keeps busy only waits in OpenMP's spinning barriers
# (many times slower on small ops, see `one_thread`). The tests about threads set their own
# counts.
_XDIST_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _XDIST_WORKERS > 1:
    _cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
              else os.cpu_count() or 1)
    torch.set_num_threads(max(1, _cores // _XDIST_WORKERS))

# Tests that share an expensive module-scoped fixture run in one worker (`--dist loadgroup`),
# so that it is built once, not once per worker: the CUDA emulator's C++ build, the one spawn
# of four gloo ranks that computes every distributed case, the single-process cornell5 run
# the torchrun tests compare with. The tests that start torch.distributed rendezvous on
# localhost ports (the others carry xdist_group("rendezvous") in their files) share one
# worker, so that no two of them pick the same free port at once.
XDIST_GROUP_OF_FIXTURE = {"emu": "cuda_emulation_build", "compared": "rendezvous",
                          "cornell5_single": "rendezvous"}


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config, items):
    for item in items:
        for fixture, group in XDIST_GROUP_OF_FIXTURE.items():
            if fixture in getattr(item, "fixturenames", ()):
                item.add_marker(pytest.mark.xdist_group(group))
                break


GRAPH_KINDS = ["symmetric", "directed", "weighted", "isolated", "self_loops", "duplicates",
               "zero_rows", "single_node", "empty", "batch"]
LAPLACIANS = ["neural", "rw", "unnormalized", "sym"]
DATA_ROOT = Path(os.environ.get("DIGNN_DATA", Path(__file__).resolve().parents[2] / "shared" /
                                "data"))


def load_module(name, path):
    """The Python file at ``path`` imported as a module named ``name`` (the benchmark
    harnesses and the docs' renderer are scripts, not packages)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _sym(ei):
    return torch.cat([ei, ei.flip(0)], dim=1)


def make_graph(kind, n=24, d=5, seed=0, dtype=torch.float64):
    """(x, edge_index, edge_weight) of a small graph of the given kind; edge_weight may be
    None. Node features are random (some rows zero for 'zero_rows')."""
    g = torch.Generator().manual_seed(seed)
    weight = None
    if kind == "single_node":
        n = 1
        ei = torch.empty(2, 0, dtype=torch.long)
    elif kind == "empty":
        ei = torch.empty(2, 0, dtype=torch.long)
    elif kind == "batch":  # three disjoint graphs, as PyG batches them
        parts, offset = [], 0
        for size in (n // 3, n // 3, n - 2 * (n // 3)):
            e = torch.randint(0, size, (2, 2 * size), generator=g)
            parts.append(_sym(e[:, e[0] != e[1]]) + offset)
            offset += size
        ei = torch.cat(parts, dim=1)
    else:
        e = torch.randint(0, n, (2, 3 * n), generator=g)
        e = e[:, e[0] != e[1]]
        if kind == "directed":
            ei = e
        elif kind == "isolated":  # nodes n-4 .. n-1 have no edges at all
            e = e[:, (e < n - 4).all(dim=0)]
            ei = _sym(e)
        elif kind == "self_loops":
            loops = torch.arange(0, n, 3).repeat(2, 1)
            ei = torch.cat([_sym(e), loops], dim=1)
        elif kind == "duplicates":  # a third of the pairs twice, both ways
            ei = torch.cat([_sym(e), _sym(e[:, : e.size(1) // 3])], dim=1)
        else:  # symmetric, weighted, zero_rows
            ei = _sym(e)
        if kind == "weighted":
            half = torch.rand(e.size(1), generator=g, dtype=dtype) + 0.1
            weight = torch.cat([half, half])
    x = torch.randn(n, d, generator=g, dtype=dtype)
    if kind == "zero_rows":
        x[::5] = 0.0
    return x, ei, weight


def make_layer(d, laplacian="neural", mu=None, h=4, seed=0, scale=0.4, dtype=torch.float64,
               **kwargs):
    """A layer whose metric weights are small enough for the fixed point to converge; the
    paper's fixed point unless ``solver=`` says otherwise (the tests compare it with the
    reference's iterations; the layer's own default, ``"auto"``, has its tests)."""
    kwargs.setdefault("solver", "fixed_point")
    torch.manual_seed(seed)
    if mu is None:
        mu = {"unnormalized": 60.0}.get(laplacian, 3.0)
    layer = dk.FusedImplicitDiffusion(d, mu=mu, laplacian=laplacian, metric_channels=h,
                                      **kwargs).to(dtype)
    if laplacian == "neural":
        with torch.no_grad():
            for lin in (layer.theta_chi, layer.theta_phi, layer.theta_varphi):
                lin.weight.mul_(scale / lin.weight.abs().max())
    return layer


def thetas(layer):
    if layer.laplacian != "neural":
        return {}
    return dict(theta_chi=layer.theta_chi.weight, theta_phi=layer.theta_phi.weight,
                theta_varphi=layer.theta_varphi.weight)


def gradcheck_layer(layer, kind, x, ei, w) -> bool:
    """gradcheck of the layer in x and its parameters; x = 0 rows are the guarded kink of the
    neural chi = D tanh(||Θχ x||), so on such graphs only the parameters are checked."""
    params = list(layer.parameters())
    x.requires_grad_(not (kind == "zero_rows" and layer.laplacian == "neural"))
    inputs = [x] + params if x.requires_grad else params

    def f(*args):
        return layer(x if not x.requires_grad else args[0], ei, w)

    return torch.autograd.gradcheck(f, tuple(inputs), eps=1e-6, atol=1e-6, rtol=1e-5)


def wide_range_projections(n: int):
    """(a, p, q) of a ring of n nodes with h = 1 (exact dot products) whose edge weights take
    tanh over arguments from 1e-6 to 1e4 (both branches of the float32 tanh, and its clamp)."""
    gen = torch.Generator().manual_seed(0)
    mags = 10 ** (torch.rand(n, 1, generator=gen) * 5 - 3)
    signs = torch.where(torch.rand(n, 1, generator=gen) < 0.5, -1.0, 1.0)
    p = (mags * signs).float()
    q = (10 ** (torch.rand(n, 1, generator=gen) * 7 - 5)).float()
    return torch.ones(n), p, q


def run_per_instruction_set(script: str, cwd) -> dict:
    """Runs the Python ``script`` once per instruction-set build of the CPU passes this CPU
    has (generic, and on x86-64 avx2 and avx512), each in its own process with DIGNN_CPU_ISA
    set (the build is chosen once per process). Returns {isa: CompletedProcess}; the builds
    this CPU lacks are left out."""
    import platform
    import subprocess
    import sys
    isas = ("generic", "avx2", "avx512") if platform.machine() in ("x86_64", "AMD64") \
        else ("generic",)
    ran = {}
    for isa in isas:
        proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                              cwd=cwd, env=dict(os.environ, DIGNN_CPU_ISA=isa,
                                                OMP_NUM_THREADS="1"))
        if proc.returncode != 0 and "is not one of" in proc.stderr:
            continue  # this CPU lacks the instruction set
        ran[isa] = proc
    return ran


def rel_err(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


@pytest.fixture(autouse=True)
def _fresh_graph_cache():
    dk.clear_graph_cache()
    yield
    dk.clear_graph_cache()


@pytest.fixture
def world_of_one():
    """A gloo process group of this process alone (the distributed code's world of one)."""
    import torch.distributed as dist
    assert not dist.is_initialized()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.fixture
def one_thread():
    """One intra-op thread for a test on a tiny graph: threads gain nothing there, and on a
    busy machine OpenMP's spinning barriers make small ops many times slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class HostReads(TorchFunctionMode):
    """Counts the tensor methods that copy a value to the host (each a device sync on a
    GPU). Adam's own reads are left out: on the CPU its step counters are host scalars
    anyway; on a GPU training uses fused Adam, whose counters stay on the device."""
    READS = {"item", "__bool__", "__float__", "__int__", "__index__", "tolist", "cpu",
             "numpy", "nonzero"}

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in self.READS and not any(
                "torch/optim/" in frame.filename.replace("\\", "/")
                for frame in traceback.extract_stack(limit=8)):
            self.count += 1
        return func(*args, **(kwargs or {}))
