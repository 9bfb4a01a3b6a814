"""The build descriptions: when setup.py builds the CUDA kernels and what it says, CMake for C++
users, the torch-version guard, README <-> CI."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import load_module

ROOT = Path(__file__).resolve().parents[1]
SETUP = load_module("dignn_setup", ROOT / "setup.py")  # runs no build: setup() is in main()

# A CUDA build of torch and a toolkit with nvcc: what a CUDA build needs besides the GPU.
CUDA_READY = dict(torch_version="2.14.1+cu130", torch_cuda="13.0", toolkit="/usr/local/cuda",
                  toolkit_has_nvcc=True)
CPU_TORCH = dict(CUDA_READY, torch_version="2.14.1+cpu", torch_cuda=None)
NO_TOOLKIT = dict(CUDA_READY, toolkit=None, toolkit_has_nvcc=False)
NO_NVCC = dict(CUDA_READY, toolkit_has_nvcc=False)


@pytest.mark.parametrize("machine, gpu, build", [
    (CUDA_READY, True, True),      # the GPU machine: CUDA built
    (CUDA_READY, False, False),    # a CUDA torch and nvcc but no GPU (this 2-core machine)
    (CPU_TORCH, True, False),
    (CPU_TORCH, False, False),
    (NO_TOOLKIT, True, False),
    (NO_TOOLKIT, False, False),
    (NO_NVCC, True, False),
])
def test_auto_builds_cuda_only_where_a_gpu_is_visible(machine, gpu, build):
    """DIGNN_WITH_CUDA=auto (the default, also when unset or empty) follows torch-scatter's
    and pyg-lib's convention: CUDA kernels where a GPU is visible at build time and torch and
    the toolkit can build them; the CPU kernels always; the message says which and how long."""
    for mode in ("auto", "", " AUTO "):
        decision = SETUP.cuda_decision(mode, gpu_visible=gpu, **machine)
        assert decision.build is build
        assert decision.arch_list == ""  # a visible GPU: torch builds for it
        assert decision.message.startswith("building the CPU kernels (about ")
        assert " min on 2 idle cores)" in decision.message
        if not build:
            assert "CUDA kernels: skipped" in decision.message


def test_auto_without_a_gpu_says_how_to_build_cuda_and_how_long():
    message = SETUP.cuda_decision("auto", gpu_visible=False, **CUDA_READY).message
    assert message == (
        f"building the CPU kernels (about {SETUP.CPU_MINUTES_2_CORES} min on 2 idle cores); "
        f"CUDA kernels: skipped (no GPU visible; DIGNN_WITH_CUDA=1 to build them, about "
        f"{SETUP.CUDA_MINUTES_2_CORES} more min on 2 idle cores for two architectures)")
    # ... and what else that needs, where something is missing
    message = SETUP.cuda_decision("auto", gpu_visible=False, **NO_TOOLKIT).message
    assert "DIGNN_WITH_CUDA=1 to build them" in message
    assert "no CUDA toolkit was found" in message and "CUDA_HOME" in message
    message = SETUP.cuda_decision("auto", gpu_visible=False, arch_list="8.6",
                                  **CUDA_READY).message
    assert "DIGNN_WITH_CUDA=1 to build them for TORCH_CUDA_ARCH_LIST=8.6" in message


def test_auto_with_a_gpu_but_no_toolkit_names_the_fix_and_triton():
    message = SETUP.cuda_decision("auto", gpu_visible=True, **NO_TOOLKIT).message
    assert "skipped although a GPU is visible: no CUDA toolkit was found" in message
    assert "CUDA_HOME" in message and "backend='triton'" in message
    message = SETUP.cuda_decision("auto", gpu_visible=True, **NO_NVCC).message
    assert "/usr/local/cuda has no bin/nvcc" in message


def test_auto_with_a_gpu_names_its_architectures():
    decision = SETUP.cuda_decision("auto", gpu_visible=True, gpu_archs="8.0;9.0", **CUDA_READY)
    assert "and the CUDA kernels for sm_80, sm_90 (a GPU is visible" in decision.message
    assert "DIGNN_WITH_CUDA=0 skips them" in decision.message
    decision = SETUP.cuda_decision("auto", gpu_visible=True, **CUDA_READY)
    assert "CUDA kernels for the visible GPU" in decision.message


@pytest.mark.parametrize("gpu", [False, True])
def test_with_cuda_1_forces_cuda(gpu):
    """DIGNN_WITH_CUDA=1 (like FORCE_CUDA=1) builds CUDA with or without a GPU: without one,
    for sm_80 and sm_90 unless TORCH_CUDA_ARCH_LIST says otherwise."""
    decision = SETUP.cuda_decision("1", gpu_visible=gpu, gpu_archs="9.0" if gpu else "",
                                   **CUDA_READY)
    assert decision.build
    assert decision.arch_list == ("" if gpu else "8.0;9.0")
    assert ("for sm_90 " if gpu else "for sm_80, sm_90 ") in decision.message
    assert "(DIGNN_WITH_CUDA=1; about " in decision.message
    decision = SETUP.cuda_decision("1", gpu_visible=gpu, arch_list="8.6;9.0a+PTX",
                                   **CUDA_READY)
    assert decision.build and decision.arch_list == ""  # the user's list stays as it is
    assert "for sm_86, sm_90a+PTX " in decision.message


@pytest.mark.parametrize("machine, missing, fix", [
    (CPU_TORCH, "torch 2.14.1+cpu is a CPU-only build", "install a CUDA build of torch"),
    (NO_TOOLKIT, "no CUDA toolkit was found", "set CUDA_HOME to the folder holding bin/nvcc"),
    (NO_NVCC, "the CUDA toolkit folder /usr/local/cuda has no bin/nvcc",
     "set CUDA_HOME to the folder holding bin/nvcc"),
])
@pytest.mark.parametrize("gpu", [False, True])
def test_with_cuda_1_stops_with_what_is_missing_and_the_fix(machine, missing, fix, gpu):
    with pytest.raises(SystemExit) as stop:
        SETUP.cuda_decision("1", gpu_visible=gpu, **machine)
    message = str(stop.value)
    assert message.startswith(f"dignn-kernels: DIGNN_WITH_CUDA=1 but {missing}")
    assert fix in message and "unset DIGNN_WITH_CUDA to build the CPU kernels only" in message


@pytest.mark.parametrize("machine", [CUDA_READY, CPU_TORCH, NO_TOOLKIT])
@pytest.mark.parametrize("gpu", [False, True])
def test_with_cuda_0_never_builds_cuda(machine, gpu):
    decision = SETUP.cuda_decision("0", gpu_visible=gpu, **machine)
    assert not decision.build
    assert decision.message.endswith("; CUDA kernels: skipped (DIGNN_WITH_CUDA=0)")


def test_with_cuda_refuses_other_values():
    with pytest.raises(SystemExit, match="DIGNN_WITH_CUDA must be auto, 0 or 1, got 'yes'"):
        SETUP.cuda_decision("yes", gpu_visible=True, **CUDA_READY)


SETUP_SCRIPT_CASES = [
    ({"DIGNN_WITH_CUDA": "0"}, 0, "dignn-kernels: building the CPU kernels (about "),
    ({"DIGNN_WITH_CUDA": "auto"}, 0, "CUDA kernels: skipped ("),
    ({"DIGNN_WITH_CUDA": "1", "CUDA_HOME": "/nonexistent"}, 1,
     "dignn-kernels: DIGNN_WITH_CUDA=1 but "),
]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the auto case expects no GPU")
@pytest.mark.parametrize("env, rc, says", SETUP_SCRIPT_CASES)
@pytest.mark.slow  # a subprocess or a compile: seconds; `-m "not slow"` leaves it out
def test_setup_py_says_what_it_builds(tmp_path, env, rc, says):
    """setup.py run as pip runs it (no compile: `--name`), in a copy so that the build record
    it writes lands there: it prints its decision and keeps it in the record, or stops with
    the missing piece."""
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tmp_path / name)
    (tmp_path / "dignn_kernels").mkdir()
    proc = subprocess.run([sys.executable, "setup.py", "--name"], cwd=tmp_path, text=True,
                          capture_output=True, env={**os.environ, **env})
    assert proc.returncode == rc, proc.stdout + proc.stderr
    assert says in proc.stdout + proc.stderr
    if rc == 0:
        record = {}
        exec((tmp_path / "dignn_kernels" / "_build_info.py").read_text(), record)
        assert record["WITH_CUDA"] is False
        assert f"dignn-kernels: {record['BUILD_MESSAGE']}\n" in proc.stdout  # kept as said


def test_ci_compiles_the_cuda_kernels_where_nvcc_is():
    """CI's machine has nvcc and no GPU, so `auto` would skip CUDA there: .ci/run asks for it."""
    script = (ROOT / ".ci" / "run").read_text()
    assert "export DIGNN_WITH_CUDA=1" in script


LOAD_SCRIPT = r"""
import importlib.util, sys, torch
torch.ops.load_library(sys.argv[1])
spec = importlib.util.spec_from_file_location("reference", sys.argv[2])
reference = importlib.util.module_from_spec(spec); spec.loader.exec_module(reference)
torch.manual_seed(0)
n = 30
ei = torch.randint(0, n, (2, 90)); ei = torch.cat([ei, ei.flip(0)], 1)
x = torch.randn(n, 4, dtype=torch.float64)
# rw Laplacian as CSR (row = target), solved by the library's op
order = torch.argsort(ei[1] * n + ei[0])
rows, cols = ei[1][order], ei[0][order]
rowptr = torch.zeros(n + 1, dtype=torch.long); rowptr[1:] = torch.cumsum(torch.bincount(rows, minlength=n), 0)
a = torch.ones(rows.numel(), dtype=torch.float64)
deg = torch.zeros(n, dtype=torch.float64).index_add_(0, rows, a)
z, w, kappa, stats = torch.ops.dignn.implicit_diffusion(rowptr, cols.int(), a, x, deg, None, None,
                                                        deg, 3.0, 1e-6, 500, 1e-14)
want, _ = reference.dense_equilibrium(x, ei, laplacian="rw", mu=3.0)
err = float((z - want).norm() / want.norm())
print("rel_err", err, "iterations", int(stats[0]))
assert err < 1e-10
"""


@pytest.mark.slow
def test_cmake_builds_the_library_for_cpp_users(tmp_path):
    """CMakeLists.txt builds the same csrc/ sources into libdignn_kernels, which registers
    working torch.ops.dignn operators when loaded (here into a process without the Python
    extension)."""
    cmake = shutil.which("cmake")
    assert cmake, "cmake is needed to build the C++ library"
    build = tmp_path / "build"
    configure = [cmake, "-S", str(ROOT), "-B", str(build),
                 f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}"]
    cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    if torch.version.cuda is not None and Path(cuda_home).exists():
        configure.append(f"-DCUDA_TOOLKIT_ROOT_DIR={cuda_home}")  # CUDA builds of libtorch
    for cmd in (configure, [cmake, "--build", str(build), "-j", str(os.cpu_count() or 2)]):
        proc = subprocess.run(cmd, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lib = build / "libdignn_kernels.so"
    assert lib.exists()
    proc = subprocess.run([sys.executable, "-c", LOAD_SCRIPT, str(lib),
                           str(ROOT / "dignn_kernels" / "reference.py")],
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "rel_err" in proc.stdout


MISMATCH_SCRIPT = r"""
import sys, types
fake = types.ModuleType("dignn_kernels._build_info")
fake.TORCH_VERSION, fake.WITH_CUDA, fake.CUDA_ARCHS = "1.0.0+other", False, ""
sys.modules["dignn_kernels._build_info"] = fake
try:
    import dignn_kernels
except ImportError as err:
    print(err)
else:
    print("imported")
"""


@pytest.mark.slow  # a subprocess or a compile: seconds; `-m "not slow"` leaves it out
def test_import_refuses_a_different_torch(tmp_path):
    proc = subprocess.run([sys.executable, "-c", MISMATCH_SCRIPT], capture_output=True,
                          text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    message = proc.stdout.strip()
    assert message.startswith("dignn_kernels was built against torch 1.0.0+other but torch "
                              f"{torch.__version__} is installed")
    assert "pip install --force-reinstall" in message


def test_build_info_matches_this_torch():
    from dignn_kernels import _build_info
    assert _build_info.TORCH_VERSION == torch.__version__
    if torch.version.cuda is None:
        assert _build_info.WITH_CUDA is False


def test_cuda_backend_asks_the_dispatcher_whether_it_was_built():
    """The CUDA backend's availability reads the ops' registrations (no import of the build
    record from the package above the backends): they agree."""
    from dignn_kernels import _build_info
    from dignn_kernels.backends import compiled
    assert compiled._cuda_built() == bool(_build_info.WITH_CUDA)


def test_ci_runs_the_readme_test_command():
    """.ci/run extracts the line after README's test-command marker; check that what it
    extracts is the documented command."""
    script = (ROOT / ".ci" / "run").read_text()
    awk = script.split("test_command=\"$(")[1].split(" README.md)\"")[0]
    proc = subprocess.run(["bash", "-c", f"{awk} README.md"], capture_output=True, text=True,
                          cwd=ROOT)
    command = proc.stdout.strip()
    readme = (ROOT / "README.md").read_text()
    assert command and command in readme
    assert "pytest" in command and "tests" in command
    assert "pip install" in readme.split("<!-- test-command")[0]  # the first command installs


@pytest.mark.parametrize("state, message", [
    ("no build", "is not built: run `pip install -e .` in that source tree"),
    ("no extension", "is a source tree without its compiled extension: run `pip install -e .`"),
])
@pytest.mark.slow  # a subprocess or a compile: seconds; `-m "not slow"` leaves it out
def test_source_tree_import_says_how_in_one_line(tmp_path, state, message):
    """Importing dignn_kernels from a source checkout that was never built in place (the
    repository root shadows the installed package) gives one line that names the fix."""
    tree = tmp_path / "dignn_kernels"
    tree.mkdir()
    for f in (ROOT / "dignn_kernels").glob("*.py"):
        if f.name != "_build_info.py":
            shutil.copy(f, tree / f.name)
    if state == "no extension":
        (tree / "_build_info.py").write_text(f"TORCH_VERSION = {torch.__version__!r}\n"
                                             "WITH_CUDA = False\nCUDA_ARCHS = ''\n")
    done = subprocess.run([sys.executable, "-c", "import dignn_kernels"], cwd=tmp_path,
                          capture_output=True, text=True)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: dignn_kernels at ") and message in last
