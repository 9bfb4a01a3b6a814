"""What the fidelity harnesses (bench/peers/fidelity_node.py, bench/peers/fidelity_graph.py) share: the
import of the authors' training code from a user's checkout, the paired statistics and the
record's header.

The authors' code (github.com/guoji-fu/DIGNN) is imported and run from the checkout the user
names (``--authors`` or ``$DIGNN_AUTHORS``), never copied: its ``nodeclassification/`` and
``graphclassification/`` folders each hold top-level modules (``models``, ``main``, ``data``,
``mlp``) and a package ``src`` of the same names, so each part is imported with its folder on
``sys.path`` and its modules removed from ``sys.modules`` again afterwards (whatever was there
put back), as :func:`peers.load_authors` does for the layer alone.
"""
from __future__ import annotations

import importlib
import math
import os
import statistics
import sys
import time
import types
from pathlib import Path
from typing import Dict, List, Sequence

import torch

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import peers  # noqa: E402  (bench/peers/peers.py: stand-ins, machine, versions, JSON writer)

PARTS = ("nodeclassification", "graphclassification")
# Top-level names the authors' folders define; removed from sys.modules around an import so
# that the node and graph parts (and this project's own modules) do not see each other's.
_THEIR_NAMES = ("src", "models", "main", "data", "baselines", "linkx_dataset", "mlp",
                "models_ppi", "torch_scatter", "torch_sparse")


def authors_path(given=None) -> Path:
    """The authors' checkout: ``given``, else ``$DIGNN_AUTHORS``.

    Raises:
        FileNotFoundError: neither names a folder holding ``nodeclassification/``.
    """
    path = given or os.environ.get("DIGNN_AUTHORS")
    if not path:
        raise FileNotFoundError("no checkout of the authors' code: pass --authors PATH or set "
                                "$DIGNN_AUTHORS (git clone https://github.com/guoji-fu/DIGNN)")
    root = Path(path).expanduser().resolve()
    if not (root / "nodeclassification").is_dir():
        raise FileNotFoundError(f"{root} holds no nodeclassification/: --authors must name a "
                                f"checkout of github.com/guoji-fu/DIGNN")
    return root


def import_authors(path, part: str, modules: Sequence[str]) -> types.SimpleNamespace:
    """Imports ``modules`` (e.g. ``("models", "main")``) of the authors' ``part`` folder.

    ``torch_scatter``/``torch_sparse`` are the real packages where they import, else this
    project's stand-ins (bench/peers/stand_ins). Where CUDA is absent, the ``torch`` their
    ``src.layers`` sees has a no-op ``cuda.synchronize`` (their backward hook calls it).

    Returns:
        A namespace with one attribute per module, and ``info`` (path, commit, part,
        stand_ins, cuda_synchronize) for the record.

    Raises:
        ValueError: an unknown part.
        FileNotFoundError: the checkout lacks the folder or a module.
    """
    if part not in PARTS:
        raise ValueError(f"part must be one of {PARTS}, got {part!r}")
    root = authors_path(path)
    folder = root / part
    for name in modules:
        if not (folder / f"{name}.py").is_file():
            raise FileNotFoundError(f"{folder / name}.py not found in the authors' checkout")
    saved = {k: m for k, m in sys.modules.items() if k.split(".")[0] in _THEIR_NAMES}
    saved_path = list(sys.path)
    used: Dict[str, str] = {}
    loaded = {}
    try:
        for k in saved:
            del sys.modules[k]
        for dep in ("torch_scatter", "torch_sparse"):
            if importlib.util.find_spec(dep) is not None:
                importlib.import_module(dep)
                used[dep] = "real " + getattr(sys.modules[dep], "__version__", "(version ?)")
            else:
                sys.modules[dep] = peers._load_module_from(
                    dep, peers.STAND_INS / dep / "__init__.py")
                used[dep] = "stand-in bench/peers/stand_ins/" + dep
        sys.path.insert(0, str(folder))
        for name in modules:
            loaded[name] = importlib.import_module(name)
        layers = sys.modules.get("src.layers")
    finally:
        for k in [k for k in sys.modules if k.split(".")[0] in _THEIR_NAMES]:
            del sys.modules[k]
        sys.modules.update(saved)
        sys.path[:] = saved_path
    if torch.cuda.is_available() or layers is None:
        sync = "torch.cuda.synchronize (CUDA available)" if layers is not None else "unused"
    else:
        layers.torch = peers._TorchWithoutCudaSync()
        sync = "no-op on the CPU"
    return types.SimpleNamespace(
        **loaded, info={"path": str(root), "commit": peers._commit_of(root), "part": part,
                        "stand_ins": used, "cuda_synchronize": sync})


def paired(ours: Sequence[float], theirs: Sequence[float]) -> Dict:
    """The paired comparison of two per-split accuracy lists (same splits, same order).

    Returns:
        dict with ``n``, both means and sample deviations, ``mean_diff`` (ours - theirs),
        ``se`` (its standard error: the deviation of the differences over sqrt(n); nan for
        one split) and ``within`` (``mean_diff >= -se``: not lower beyond the spread).

    Raises:
        ValueError: lists of different lengths or empty.
    """
    ours, theirs = list(map(float, ours)), list(map(float, theirs))
    if len(ours) != len(theirs) or not ours:
        raise ValueError(f"paired() needs two equally long non-empty lists, got {len(ours)} "
                         f"and {len(theirs)}")
    diffs = [a - b for a, b in zip(ours, theirs)]
    n = len(diffs)
    sd = statistics.stdev(diffs) if n > 1 else math.nan
    se = sd / math.sqrt(n) if n > 1 else math.nan
    mean_diff = statistics.fmean(diffs)

    def spread(v):
        return statistics.stdev(v) if len(v) > 1 else 0.0
    return {"n": n, "ours_mean": statistics.fmean(ours), "ours_std": spread(ours),
            "theirs_mean": statistics.fmean(theirs), "theirs_std": spread(theirs),
            "mean_diff": mean_diff, "se": se,
            "within": bool(n > 1 and mean_diff >= -se) or (n == 1 and mean_diff >= 0)}


def _uncommitted() -> List[str]:
    """The tracked files of the package and the harness that differ from the commit."""
    import subprocess
    try:
        out = subprocess.run(["git", "-C", str(peers.REPO), "status", "--porcelain",
                              "--untracked-files=no", "--", "python", "dignn_kernels", "bench"],
                             capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return ["unknown"]
    return [line[3:] for line in out.splitlines() if line.strip()]


def header(schema: str, argv: List[str], threads: int, authors) -> Dict:
    """The record's header: schema, command, commit (and the files that differed from it),
    date, machine, versions, authors."""
    return {"schema": schema, "command": [sys.executable] + list(argv),
            "commit": peers._git_head(), "uncommitted": _uncommitted(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                time.gmtime()),
            "machine": peers._machine(torch.device("cpu"), threads),
            "versions": peers._versions(), "authors": authors}


write_json = peers.write_json
