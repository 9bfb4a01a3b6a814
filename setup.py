"""Builds dignn_kernels._C: the CPU kernels always, the CUDA kernels when they can be built.

DIGNN_WITH_CUDA=auto (default) builds CUDA when the installed torch is a CUDA build and nvcc
is found (CUDA_HOME, or /usr/local/cuda); 0 never; 1 always (fails if it cannot).
With no GPU visible and TORCH_CUDA_ARCH_LIST unset, CUDA code is built for sm_80 and sm_90.
CMakeLists.txt builds the same csrc/ sources into a plain library for C++ (libtorch) users.
"""
import os
import sys
from pathlib import Path

ROOT = Path(__file__).parent.resolve()

# torch guesses CUDA_HOME from the nvcc on PATH when the variable is unset; a wrapper script
# in /usr/local/bin makes that guess /usr/local, which has no CUDA headers.
if "CUDA_HOME" not in os.environ and "CUDA_PATH" not in os.environ:
    if (Path("/usr/local/cuda") / "bin" / "nvcc").exists():
        os.environ["CUDA_HOME"] = "/usr/local/cuda"

import torch  # noqa: E402
from setuptools import setup  # noqa: E402
from torch.utils import cpp_extension  # noqa: E402


def _say(message: str) -> None:
    # pip runs this file once for metadata and once to build: speak only when building
    if not any(cmd in sys.argv for cmd in ("egg_info", "dist_info")):
        print(f"dignn-kernels: {message}")


def _with_cuda() -> bool:
    mode = os.environ.get("DIGNN_WITH_CUDA", "auto").strip().lower()
    if mode not in ("auto", "0", "1"):
        sys.exit(f"DIGNN_WITH_CUDA must be auto, 0 or 1, got {mode!r}")
    if mode == "0":
        _say("DIGNN_WITH_CUDA=0, building the CPU kernels only.")
        return False
    reason = None
    if torch.version.cuda is None:
        reason = f"torch {torch.__version__} is a CPU-only build"
    elif cpp_extension.CUDA_HOME is None:
        reason = "no CUDA toolkit found (set CUDA_HOME to the folder holding bin/nvcc)"
    if reason is None:
        return True
    if mode == "1":
        sys.exit(f"dignn-kernels: DIGNN_WITH_CUDA=1 but {reason}.")
    _say(f"{reason}; building the CPU kernels only (CUDA skipped).")
    return False


def _sources(with_cuda: bool):
    csrc = ROOT / "csrc"
    files = sorted(csrc.glob("*.cpp")) + sorted(csrc.glob("ops/*.cpp")) + sorted(
        csrc.glob("cpu/*.cpp"))
    if with_cuda:
        files += sorted(csrc.glob("cuda/*.cu")) + sorted(csrc.glob("cuda/*.cpp"))
    return [str(f.relative_to(ROOT)) for f in files]


def _write_build_info(with_cuda: bool, archs: str) -> None:
    # Read by dignn_kernels/__init__.py to refuse a torch other than the one built against.
    (ROOT / "dignn_kernels" / "_build_info.py").write_text(
        "# Written by setup.py at build time.\n"
        f"TORCH_VERSION = {torch.__version__!r}\n"
        f"WITH_CUDA = {with_cuda!r}\n"
        f"CUDA_ARCHS = {archs!r}\n")


def _extension():
    with_cuda = _with_cuda()
    # -fopenmp: at::parallel_for is an inline template that only runs in parallel when the
    # including file is compiled with OpenMP (without it the CPU passes were serial at any
    # thread count; csrc/cpu/parallel_rows.h has the measurements). torch adds its own -std.
    cxx_flags = ["-O3", "-fopenmp-simd", "-fopenmp"]
    link_flags = ["-fopenmp"]
    define_macros = []
    archs = ""
    if with_cuda:
        if not os.environ.get("TORCH_CUDA_ARCH_LIST") and not torch.cuda.is_available():
            os.environ["TORCH_CUDA_ARCH_LIST"] = "8.0;9.0"
        archs = os.environ.get("TORCH_CUDA_ARCH_LIST", "visible GPU")
        define_macros.append(("DIGNN_WITH_CUDA", "1"))
        ext = cpp_extension.CUDAExtension(
            "dignn_kernels._C", _sources(True), include_dirs=[str(ROOT / "csrc")],
            define_macros=define_macros,
            extra_compile_args={"cxx": cxx_flags,
                                "nvcc": ["-O3", "-lineinfo"]},
            extra_link_args=link_flags)
    else:
        ext = cpp_extension.CppExtension(
            "dignn_kernels._C", _sources(False), include_dirs=[str(ROOT / "csrc")],
            extra_compile_args={"cxx": cxx_flags}, extra_link_args=link_flags)
    _write_build_info(with_cuda, archs)
    return ext


setup(
    ext_modules=[_extension()],
    cmdclass={"build_ext": cpp_extension.BuildExtension.with_options(use_ninja=True)},
)
