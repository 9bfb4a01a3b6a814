"""Where dataset files live: the read-only data root, the writable cache PyG works in, and
the errors that say which files are missing."""
from __future__ import annotations

import os
import shutil
import urllib.error
from pathlib import Path
from typing import Callable, Optional, Sequence, Union

__all__ = ["PathLike", "DatasetUnavailableError", "default_cache_dir", "default_data_root",
           "stage", "with_download_hint"]

PathLike = Union[str, os.PathLike]


class DatasetUnavailableError(RuntimeError):
    """The dataset's files are neither under the data root nor downloadable."""



def default_cache_dir() -> Path:
    """``$DIGNN_CACHE``, else ``~/.cache/dignn``: where PyG writes processed files."""
    env = os.environ.get("DIGNN_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "dignn"


def default_data_root() -> Path:
    """``$DIGNN_DATA`` when set (read only), else the cache."""
    env = os.environ.get("DIGNN_DATA")
    return Path(env).expanduser() if env else default_cache_dir()


def stage(data_root: Optional[PathLike], cache_dir: Optional[PathLike],
           relative_raw: Sequence[str]) -> Path:
    """Copies ``<data_root>/<rel>`` into ``<cache>/<rel>`` for each raw folder or file that
    exists under the data root and is missing (or differs in size) in the cache; returns the
    cache, which PyG may then write into. The data root itself is never written."""
    cache = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    root = Path(data_root).expanduser() if data_root is not None else default_data_root()
    if not root.exists():
        raise FileNotFoundError(f"data_root {str(root)!r} does not exist; pass an existing "
                                f"folder (the layout is <root>/<name>/raw/...) or leave it "
                                f"unset to use the cache {str(cache)!r}")
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OSError(f"cannot create the dataset cache {str(cache)!r} ({err}); point "
                      f"DIGNN_CACHE (or cache_dir=) at a writable folder") from None
    if root.resolve() == cache.resolve():
        return cache
    for rel in relative_raw:
        source, target = root / rel, cache / rel
        if not source.exists():
            continue
        files = [source] if source.is_file() else sorted(p for p in source.rglob("*")
                                                         if p.is_file())
        for path in files:
            dest = target if source.is_file() else target / path.relative_to(source)
            if dest.exists() and dest.stat().st_size == path.stat().st_size:
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, dest)
    return cache


def with_download_hint(name: str, load: Callable, cache: Path, layout: str):
    """Runs a PyG constructor; a failed download becomes a clear DatasetUnavailableError."""
    try:
        return load()
    except (urllib.error.URLError, OSError, ConnectionError) as err:
        if isinstance(err, FileNotFoundError) and "raw" not in str(err):
            raise
        raise DatasetUnavailableError(
            f"dataset {name!r}: its raw files are not in the cache {str(cache)!r} and could "
            f"not be downloaded ({type(err).__name__}: {err}). Pass --data-root (or "
            f"data_root=) pointing at a folder holding {layout}, or run with network "
            f"access.") from None


