"""Builds dignn_kernels._C: the CPU kernels always, the CUDA kernels where a GPU is visible or
when asked.

DIGNN_WITH_CUDA, the convention of torch-scatter's and pyg-lib's FORCE_CUDA:
  auto (default)  the CUDA kernels too when a CUDA GPU is visible at build time
                  (torch.cuda.is_available()), torch is a CUDA build and the CUDA toolkit is
                  found; else the CPU kernels only, and the build says why
  1               the CUDA kernels too, GPU or not (CI, images built for other machines); stops
                  with the fix when torch is a CPU-only build or no toolkit is found. With no
                  GPU visible and TORCH_CUDA_ARCH_LIST unset, for sm_80 and sm_90
  0               the CPU kernels only
The toolkit: CUDA_HOME (or CUDA_PATH), else /usr/local/cuda, else the nvcc on PATH.
The build prints what it builds and about how long that takes, and at the end how long it took;
pip shows a build's output only with `pip install -v .` (or in `--log FILE`).
CMakeLists.txt builds the same csrc/ sources into a plain library for C++ (libtorch) users.
"""
import os
import re
import sys
import time
from pathlib import Path
from typing import NamedTuple, Optional

ROOT = Path(__file__).parent.resolve()

# About how long the compile takes on 2 idle cores (ninja runs the files in parallel): the CPU
# time of `pip install .` on the 2-core machine of docs/getting-started.md's "Install" was
# 5.1-9.2 CPU-minutes for the CPU kernels and 1.6-1.7 more with the CUDA kernels for sm_80 and
# sm_90 (DIGNN_WITH_CUDA=1); below, the lower figures halved and rounded up. That machine was
# shared with other jobs (load 5-12) and its wall times were 14-27 min.
CPU_MINUTES_2_CORES = 3
CUDA_MINUTES_2_CORES = 1  # sm_80 and sm_90 (two architectures), on top of the CPU kernels
DEFAULT_ARCHS = "8.0;9.0"


class CudaDecision(NamedTuple):
    build: bool        # compile csrc/cuda
    arch_list: str     # TORCH_CUDA_ARCH_LIST to set ("" = leave it: torch's choice)
    message: str       # what the build says it builds


def _minutes(n: float) -> str:
    return f"about {n:g} min on 2 idle cores"


def cuda_decision(mode: str, *, torch_version: str, torch_cuda: Optional[str],
                  toolkit: Optional[str], toolkit_has_nvcc: bool, gpu_visible: bool,
                  arch_list: str = "", gpu_archs: str = "") -> CudaDecision:
    """Whether to build the CUDA kernels, from DIGNN_WITH_CUDA's value (mode) and this machine:
    torch's version and CUDA version (None: a CPU-only build), the toolkit folder found (None:
    none) and whether it holds bin/nvcc, whether a CUDA GPU is visible, TORCH_CUDA_ARCH_LIST,
    and the visible GPUs' architectures (for the message). Raises SystemExit, with what is
    missing and how to fix it, when DIGNN_WITH_CUDA=1 cannot be met or the mode is unknown."""
    mode = (mode or "auto").strip().lower()
    if mode not in ("auto", "0", "1"):
        raise SystemExit(f"dignn-kernels: DIGNN_WITH_CUDA must be auto, 0 or 1, got {mode!r}.")
    cpu = f"building the CPU kernels ({_minutes(CPU_MINUTES_2_CORES)})"
    cuda_more = (f"about {CUDA_MINUTES_2_CORES:g} more min on 2 idle cores for two "
                 "architectures")
    if mode == "0":
        return CudaDecision(False, "", f"{cpu}; CUDA kernels: skipped (DIGNN_WITH_CUDA=0)")

    # what a CUDA build lacks, and the fix
    missing = fix = None
    if torch_cuda is None:
        missing = f"torch {torch_version} is a CPU-only build"
        fix = "install a CUDA build of torch first (https://pytorch.org/get-started/locally/)"
    elif toolkit is None:
        missing = "no CUDA toolkit was found"
        fix = (f"install one (CUDA {torch_cuda}, as torch) and set CUDA_HOME to the folder "
               "holding bin/nvcc")
    elif not toolkit_has_nvcc:
        missing = f"the CUDA toolkit folder {toolkit} has no bin/nvcc"
        fix = "set CUDA_HOME to the folder holding bin/nvcc"

    if mode == "1":
        if missing:
            raise SystemExit(f"dignn-kernels: DIGNN_WITH_CUDA=1 but {missing}: {fix}; or unset "
                             "DIGNN_WITH_CUDA to build the CPU kernels only.")
        if arch_list:
            archs, set_archs = arch_list, ""
        elif gpu_visible:
            archs, set_archs = gpu_archs, ""
        else:
            archs, set_archs = DEFAULT_ARCHS, DEFAULT_ARCHS
        return CudaDecision(True, set_archs,
                            f"{cpu} and the CUDA kernels for {_arch_names(archs)} "
                            f"(DIGNN_WITH_CUDA=1; {cuda_more})")

    # auto: CUDA where a GPU is visible and everything a CUDA build needs is there
    if torch_cuda is None:
        return CudaDecision(False, "", f"{cpu}; CUDA kernels: skipped ({missing})")
    if not gpu_visible:
        how = "DIGNN_WITH_CUDA=1 to build them"
        if arch_list:
            how += f" for TORCH_CUDA_ARCH_LIST={arch_list}"
        how += f", {cuda_more}"
        if missing:
            how += f"; {missing}: {fix}"
        return CudaDecision(False, "", f"{cpu}; CUDA kernels: skipped (no GPU visible; {how})")
    if missing:
        return CudaDecision(False, "", f"{cpu}; CUDA kernels: skipped although a GPU is "
                                       f"visible: {missing}; {fix}, then reinstall "
                                       "(backend='triton' runs on the GPU without them)")
    archs = arch_list or gpu_archs
    return CudaDecision(True, "", f"{cpu} and the CUDA kernels for {_arch_names(archs)} (a GPU "
                                  f"is visible; {cuda_more}; DIGNN_WITH_CUDA=0 skips them)")


def _arch_names(archs: str) -> str:
    """'8.0;9.0a;10.0+PTX' -> 'sm_80, sm_90a, sm_100+PTX'; anything else as given; '' (torch
    picks) -> 'the visible GPU'."""
    if not archs.strip():
        return "the visible GPU"
    names = [re.sub(r"^(\d+)\.(\d+)([a-z]?)(?=\+|$)", r"sm_\1\2\3", arch)
             for arch in re.split(r"[;, ]+", archs) if arch]
    return ", ".join(names) or archs


def _building() -> bool:
    # pip runs this file once for metadata and once to build: speak only when building
    return not any(cmd in sys.argv for cmd in ("egg_info", "dist_info"))


def _say(message: str) -> None:
    if _building():
        print(f"dignn-kernels: {message}", flush=True)


def _machine_decision() -> CudaDecision:
    import torch
    from torch.utils import cpp_extension
    toolkit = cpp_extension.CUDA_HOME
    gpu_visible = torch.version.cuda is not None and torch.cuda.is_available()
    gpu_archs = ""
    if gpu_visible:
        gpu_archs = ";".join(sorted({"{}.{}".format(*torch.cuda.get_device_capability(i))
                                     for i in range(torch.cuda.device_count())}))
    return cuda_decision(
        os.environ.get("DIGNN_WITH_CUDA", "auto"), torch_version=torch.__version__,
        torch_cuda=torch.version.cuda, toolkit=toolkit,
        toolkit_has_nvcc=bool(toolkit) and (Path(toolkit) / "bin" / "nvcc").exists(),
        gpu_visible=gpu_visible, arch_list=os.environ.get("TORCH_CUDA_ARCH_LIST", ""),
        gpu_archs=gpu_archs)


def _sources(with_cuda: bool):
    csrc = ROOT / "csrc"
    files = sorted(csrc.glob("*.cpp")) + sorted(csrc.glob("ops/*.cpp")) + sorted(
        csrc.glob("cpu/*.cpp"))
    if with_cuda:
        files += sorted(csrc.glob("cuda/*.cu")) + sorted(csrc.glob("cuda/*.cpp"))
    return [str(f.relative_to(ROOT)) for f in files]


def _write_build_info(with_cuda: bool, archs: str, message: str) -> None:
    import torch
    # Read by dignn_kernels/__init__.py to refuse a torch other than the one built against;
    # BUILD_MESSAGE keeps what the build said (pip shows it only with -v).
    (ROOT / "dignn_kernels" / "_build_info.py").write_text(
        "# Written by setup.py at build time.\n"
        f"TORCH_VERSION = {torch.__version__!r}\n"
        f"WITH_CUDA = {with_cuda!r}\n"
        f"CUDA_ARCHS = {archs!r}\n"
        f"BUILD_MESSAGE = {message!r}\n")


def _extension(decision: CudaDecision):
    from torch.utils import cpp_extension
    # -fopenmp: at::parallel_for is an inline template that only runs in parallel when the
    # including file is compiled with OpenMP (without it the CPU passes were serial at any
    # thread count; csrc/cpu/parallel_rows.h has the measurements). torch adds its own -std.
    cxx_flags = ["-O3", "-fopenmp-simd", "-fopenmp"]
    link_flags = ["-fopenmp"]
    archs = ""
    if decision.build:
        if decision.arch_list:
            os.environ["TORCH_CUDA_ARCH_LIST"] = decision.arch_list
        archs = os.environ.get("TORCH_CUDA_ARCH_LIST", "visible GPU")
        ext = cpp_extension.CUDAExtension(
            "dignn_kernels._C", _sources(True), include_dirs=[str(ROOT / "csrc")],
            define_macros=[("DIGNN_WITH_CUDA", "1")],
            extra_compile_args={"cxx": cxx_flags,
                                "nvcc": ["-O3", "-lineinfo"]},
            extra_link_args=link_flags)
    else:
        ext = cpp_extension.CppExtension(
            "dignn_kernels._C", _sources(False), include_dirs=[str(ROOT / "csrc")],
            extra_compile_args={"cxx": cxx_flags}, extra_link_args=link_flags)
    _write_build_info(decision.build, archs, decision.message)
    return ext


def main() -> None:
    # torch guesses CUDA_HOME from the nvcc on PATH when the variable is unset; a wrapper
    # script in /usr/local/bin makes that guess /usr/local, which has no CUDA headers.
    if "CUDA_HOME" not in os.environ and "CUDA_PATH" not in os.environ:
        if (Path("/usr/local/cuda") / "bin" / "nvcc").exists():
            os.environ["CUDA_HOME"] = "/usr/local/cuda"
    from setuptools import setup
    from torch.utils import cpp_extension

    decision = _machine_decision()
    _say(decision.message)

    class BuildExtension(cpp_extension.BuildExtension.with_options(use_ninja=True)):
        def build_extensions(self):
            start = time.monotonic()
            super().build_extensions()
            _say(f"built the {'CPU and CUDA' if decision.build else 'CPU'} kernels in "
                 f"{(time.monotonic() - start) / 60:.1f} min")

    setup(ext_modules=[_extension(decision)], cmdclass={"build_ext": BuildExtension})


if __name__ == "__main__":  # pip (setuptools' build backend) and `python setup.py` run it so
    main()
