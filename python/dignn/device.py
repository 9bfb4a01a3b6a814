"""Where a run executes: the device a ``--device`` string names, the number of CPU threads,
and a description of the machine for the printed summary and the JSON record.

torch is imported inside the functions, so that the command line can check ``--device``
(:func:`device_spec_error`, :func:`early_device_error`) before it loads torch."""
from __future__ import annotations

import functools

import glob
import os
import platform
import re
import sys
from typing import TYPE_CHECKING, Dict, Optional, Tuple, Union

from .catalog import MAX_THREADS_PER_CORE, usable_cores

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["DeviceUnavailableError", "resolve_device", "describe_device", "choose_threads",
           "synchronize", "SMALL_GRAPH_WORK", "device_spec_error", "early_device_error"]

# Below this much work per CSR sweep ((nodes + directed edges) x channels), a training epoch
# on the CPU is a few milliseconds of many small ops: a second thread buys nothing, and when
# another process holds the other core every OpenMP barrier waits for it (the default CSBM
# run took 90-108 s per split at 2 threads on a 2-core machine with one core busy, 2.1 s at
# 1 thread). Cora (13k x 64 = 0.85M) stays below; Amherst41 (184k x 64 = 11.8M) and Cornell5
# (1.6M x 32 = 51M) are above and use every core torch was given.
SMALL_GRAPH_WORK = 4_000_000


class DeviceUnavailableError(ValueError):
    """The requested device does not exist on this machine."""


# What --device takes (case and surrounding spaces ignored); cpu:N is torch's spelling of the CPU.
_DEVICE_SPEC = re.compile(r"auto|cpu(:\d+)?|cuda(:\d+)?")
_DEVICE_WORDS = ("auto", "cpu", "cuda")


def device_spec_error(spec: str) -> Optional[str]:
    """Why the ``--device`` text ``spec`` names no device :func:`resolve_device` takes (None
    when it names one), with the close words; reads no torch.

    Example:
        >>> from dignn.device import device_spec_error
        >>> device_spec_error(" CUDA:1 ") is None
        True
        >>> device_spec_error("cdua")
        "device must be auto, cpu, cuda or cuda:N, got 'cdua' (did you mean cuda?)"
    """
    if _DEVICE_SPEC.fullmatch(spec.strip().lower()):
        return None
    import difflib
    word = spec.strip().lower().split(":")[0]
    close = difflib.get_close_matches(word, _DEVICE_WORDS, n=2)
    hint = f" (did you mean {' or '.join(close)}?)" if close else ""
    return f"device must be auto, cpu, cuda or cuda:N, got {spec!r}{hint}"


# Device files of the GPUs torch's "cuda" device can run on under Linux: NVIDIA's (and its
# driver's /proc entry), Jetson's (nvhost, nvgpu), AMD's ROCm (kfd) and WSL's (dxg).
_GPU_DEVICE_FILES = ("/dev/nvidia[0-9]*", "/dev/nvidiactl", "/proc/driver/nvidia/gpus/*",
                     "/dev/nvhost-*", "/dev/nvgpu*", "/dev/kfd", "/dev/dxg")


def _no_gpu_reason() -> Optional[str]:
    """Why no GPU can be visible to this process, found without importing torch; None when one
    may be (then torch decides). Only certainties: CUDA_VISIBLE_DEVICES that hides every GPU,
    a CPU-only torch wheel, or (Linux) no GPU device file at all."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        first = visible.split(",")[0].strip()
        if first == "" or first.startswith("-") or first.startswith("NoDevFiles"):
            return (f"no CUDA GPU is visible (CUDA_VISIBLE_DEVICES={visible!r} hides every "
                    f"GPU)")
    try:
        from importlib import metadata
        version = metadata.version("torch")
    except Exception:  # noqa: BLE001 - no metadata: torch decides
        version = ""
    if version.endswith("+cpu"):
        return f"this torch build has no CUDA (torch {version})"
    if sys.platform.startswith("linux") and \
            not any(glob.glob(pattern) for pattern in _GPU_DEVICE_FILES):
        return "no CUDA GPU is visible (this machine has no GPU device files: no /dev/nvidia*)"
    return None


def early_device_error(spec: str) -> Optional[str]:
    """The error :func:`resolve_device` would raise for ``spec``, told before torch is
    imported where that is certain (a malformed spec; a GPU asked for where
    :func:`_no_gpu_reason` finds that none can be visible); None otherwise (including when
    only torch can tell, e.g. an index past the GPUs there). Where torch is imported already
    it is :func:`resolve_device`'s own answer.

    Example:
        >>> from dignn.device import early_device_error
        >>> early_device_error("cpu") is None and early_device_error("auto") is None
        True
    """
    bad = device_spec_error(spec)
    if bad is not None:
        return bad
    if not spec.strip().lower().startswith("cuda"):
        return None
    if "torch" in sys.modules:  # as cheap as the files, and exact
        try:
            resolve_device(spec)
        except DeviceUnavailableError as err:
            return str(err)
        return None
    why = _no_gpu_reason()
    return None if why is None else _gpu_missing(spec, why)


def _gpu_missing(spec, why: str) -> str:
    return (f"device {spec!r} asked for, but {why}; use --device cpu, or auto to take a GPU "
            f"only when there is one")


def resolve_device(spec: Union[str, torch.device, None] = "auto") -> torch.device:
    """``"auto"`` (the current GPU when torch sees one, else the CPU), ``"cpu"``, ``"cuda"``
    or ``"cuda:N"``; raises :class:`DeviceUnavailableError` with the fix when the GPU is
    missing.

    Args:
        spec: ``"auto"`` (or None), ``"cpu"``, ``"cuda"``, ``"cuda:N"`` (case and spaces
            ignored), or a ``torch.device``.

    Returns:
        torch.device: the device, with its index for CUDA.

    Raises:
        DeviceUnavailableError: (a ValueError) a spec that is not a CPU or CUDA device, or a
            GPU that this machine or this torch build does not have.

    Example:
        >>> from dignn import resolve_device
        >>> resolve_device(" CPU ")
        device(type='cpu')
        >>> resolve_device("auto").type in ("cpu", "cuda")
        True
    """
    import torch
    if spec is None or (isinstance(spec, str) and spec.strip().lower() == "auto"):
        return torch.device("cuda", torch.cuda.current_device()) \
            if torch.cuda.is_available() else torch.device("cpu")
    try:
        device = torch.device(spec.strip().lower() if isinstance(spec, str) else spec)
    except (RuntimeError, TypeError):
        raise DeviceUnavailableError(f"device must be auto, cpu, cuda or cuda:N, got "
                                     f"{spec!r}") from None
    if device.type == "cpu":
        return torch.device("cpu")
    if device.type != "cuda":
        raise DeviceUnavailableError(f"device must be auto, cpu, cuda or cuda:N, got "
                                     f"{spec!r}")
    if not torch.cuda.is_available():
        why = ("this torch build has no CUDA" if torch.version.cuda is None else
               "no CUDA GPU is visible (torch.cuda.is_available() is False)")
        raise DeviceUnavailableError(_gpu_missing(spec, why))
    count = torch.cuda.device_count()
    index = torch.cuda.current_device() if device.index is None else device.index
    if not 0 <= index < count:
        raise DeviceUnavailableError(f"device {spec!r}: this machine has {count} CUDA "
                                     f"device(s), cuda:0..cuda:{count - 1}")
    return torch.device("cuda", index)


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def describe_device(device: torch.device) -> Dict[str, Optional[str]]:
    """What the records keep about where a run ran."""
    import torch
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = f"{_cpu_name()} ({torch.get_num_threads()} thread(s))"
    return {"device": str(device), "device_name": name, "torch": torch.__version__,
            "cuda": torch.version.cuda, "torch_geometric": _version("torch-geometric"),
            "dignn_kernels": _version("dignn-kernels")}


@functools.lru_cache(maxsize=None)
def source_commit() -> Optional[str]:
    """The git commit this package runs, where it runs from a git checkout (an editable
    install), marked when the checkout has uncommitted changes to tracked files; None for an
    installed package. Read once per process (a run's commands read it as they start, so
    that a commit made while they train is not taken for theirs)."""
    import subprocess
    from pathlib import Path
    here = Path(__file__).resolve().parent
    try:
        # this very file tracked by the checkout: not a copy installed in a folder inside one
        tracked = subprocess.run(["git", "ls-files", "--error-unmatch", Path(__file__).name],
                                 cwd=here, capture_output=True, text=True, timeout=10)
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True,
                              text=True, timeout=10)
        if tracked.returncode != 0 or head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=here, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    commit = head.stdout.strip()
    if dirty.returncode == 0 and dirty.stdout.strip():
        commit += " (with uncommitted changes)"
    return commit


def describe_source() -> Dict[str, Optional[str]]:
    """When a record is written (UTC) and :func:`source_commit` (where there is one)."""
    import time
    out: Dict[str, Optional[str]] = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    commit = source_commit()
    if commit is not None:
        out["commit"] = commit
    return out


def _version(distribution: str) -> Optional[str]:
    from importlib import metadata
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


# torch's own thread count before any choice of ours set it (read on the first choice): what
# "the cores available" means for every later choice, such as the second graph of a figure
# after a first small one was given 1 thread.
_TORCH_DEFAULT_THREADS: Optional[int] = None


def _torch_default_threads() -> int:
    global _TORCH_DEFAULT_THREADS
    if _TORCH_DEFAULT_THREADS is None:
        import torch
        _TORCH_DEFAULT_THREADS = torch.get_num_threads()
    return _TORCH_DEFAULT_THREADS


def choose_threads(work: int, requested: Optional[int] = None) -> Tuple[int, str]:
    """The CPU thread count for a run whose sweeps do ``work`` (nodes + edges) x channels,
    and why: ``requested`` when given, 1 for a small graph, else torch's default (the cores
    this process may use), as it was before the first choice set it."""
    default = _torch_default_threads()  # before a choice is made (and set by the caller)
    cores = usable_cores()
    if requested is not None:
        if isinstance(requested, bool) or not isinstance(requested, int) or \
                not 1 <= requested <= MAX_THREADS_PER_CORE * cores:
            raise ValueError(f"--threads must be an integer in 1..{MAX_THREADS_PER_CORE * cores} "
                             f"({MAX_THREADS_PER_CORE} per core; this process may use {cores} "
                             f"cores), got {requested!r}")
        return requested, "--threads"
    if work < SMALL_GRAPH_WORK:
        return 1, "small graph"
    return max(1, min(default, cores)), "the cores available"


def synchronize(device: torch.device) -> None:
    import torch
    if device.type == "cuda":
        torch.cuda.synchronize(device)
