"""The build descriptions: CMake for C++ users, the torch-version guard, README <-> CI."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]

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
