"""The benchmarks' one results format: a JSON record with its schema, the command, the commit, the
date, the machine and the versions (bench/README.md), written atomically.

Every script of bench/ that writes a record takes its header from here; the groups' scripts put
this folder on ``sys.path`` (``sys.path.insert(0, str(Path(__file__).resolve().parents[1]))``)
and ``import record``.
"""
import contextlib
import datetime
import json
import os
import platform
import subprocess
import tempfile
from pathlib import Path

import torch
from torch import Tensor

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent


def json_default(obj):
    """What ``json.dump`` cannot write by itself: dtypes, devices and paths as strings, tensors
    as lists."""
    if isinstance(obj, (torch.dtype, torch.device, Path)):
        return str(obj)
    if isinstance(obj, Tensor):
        return obj.tolist()
    raise TypeError(f"{type(obj).__name__} is not JSON serialisable")


def write_json(doc: dict, path) -> None:
    """Writes ``doc`` atomically: a temporary file in the same folder, then os.replace."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(doc, fh, indent=1, default=json_default)
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def machine(device, threads) -> dict:
    """{"cpu": model name, "threads": torch's thread count, "device": "cpu" or the GPU's name}."""
    cpu = platform.processor()
    with contextlib.suppress(OSError):
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    dev = torch.cuda.get_device_name() if torch.device(device).type == "cuda" else "cpu"
    return {"cpu": cpu, "threads": threads, "device": dev}


def versions() -> dict:
    """torch, numpy, torch_geometric and torchdeq versions ("absent" where not importable)."""
    import numpy
    out = {"torch": torch.__version__, "numpy": numpy.__version__}
    try:
        import torch_geometric
        out["torch_geometric"] = torch_geometric.__version__
    except ImportError:
        out["torch_geometric"] = "absent"
    try:
        from importlib.metadata import version
        import torchdeq  # noqa: F401
        out["torchdeq"] = version("torchdeq")
    except Exception:
        out["torchdeq"] = "absent"
    return out


def git_head() -> str:
    """The checkout's commit ("unknown" outside a git checkout)."""
    try:
        out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def now() -> str:
    """The date and time in UTC, ISO 8601 to the second."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
