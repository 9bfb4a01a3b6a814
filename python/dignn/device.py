"""Where a run executes: the device a ``--device`` string names, the number of CPU threads,
and a description of the machine for the printed summary and the JSON record."""
from __future__ import annotations

import platform
from typing import Dict, Optional, Tuple, Union

import torch

from .catalog import MAX_THREADS_PER_CORE, usable_cores

__all__ = ["DeviceUnavailableError", "resolve_device", "describe_device", "choose_threads",
           "synchronize", "SMALL_GRAPH_WORK"]

# Below this much work per CSR sweep ((nodes + directed edges) x channels), a training epoch
# on the CPU is a few milliseconds of many small ops: a second thread buys nothing, and when
# another process holds the other core every OpenMP barrier waits for it (the default CSBM
# run took 90-108 s per split at 2 threads on a 2-core machine with one core busy, 2.1 s at
# 1 thread). Cora (13k x 64 = 0.85M) stays below; Amherst41 (184k x 64 = 11.8M) and Cornell5
# (1.6M x 32 = 51M) are above and use every core torch was given.
SMALL_GRAPH_WORK = 4_000_000


class DeviceUnavailableError(ValueError):
    """The requested device does not exist on this machine."""


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
        raise DeviceUnavailableError(f"device {spec!r} asked for, but {why}; use --device "
                                     f"cpu, or auto to take a GPU only when there is one")
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
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = f"{_cpu_name()} ({torch.get_num_threads()} thread(s))"
    return {"device": str(device), "device_name": name, "torch": torch.__version__,
            "cuda": torch.version.cuda, "torch_geometric": _version("torch-geometric"),
            "dignn_kernels": _version("dignn-kernels")}


def _version(distribution: str) -> Optional[str]:
    from importlib import metadata
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def choose_threads(work: int, requested: Optional[int] = None) -> Tuple[int, str]:
    """The CPU thread count for a run whose sweeps do ``work`` (nodes + edges) x channels,
    and why: ``requested`` when given, 1 for a small graph, else torch's default (the cores
    this process may use)."""
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
    return max(1, min(torch.get_num_threads(), cores)), "the cores available"


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
