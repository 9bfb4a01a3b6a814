"""Where dataset files live: the read-only data root, the writable cache PyG works in, and
the errors that say which files are missing and where PyG would download them from."""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple, TypeVar, Union

__all__ = ["PathLike", "DatasetUnavailableError", "DatasetUnreadableError", "RawFiles", "default_cache_dir",
           "default_data_root", "stage", "load_staged", "require_complete",
           ]

PathLike = Union[str, os.PathLike]
T = TypeVar("T")


class DatasetUnavailableError(RuntimeError):
    """The dataset's files are neither under the data root nor in the cache, and could not
    be downloaded."""


@dataclass(frozen=True)
class RawFiles:
    """A group of raw files PyG reads from one folder, and where it downloads them from.

    ``folder`` is relative to the data root (PyG's layout, e.g. ``"CiteSeer/geom-gcn/raw"``);
    ``url`` names the download: a single file's address, or a pattern with ``<file>`` standing
    for each of ``names``."""

    folder: str
    names: Tuple[str, ...]
    url: str


def default_cache_dir() -> Path:
    """``$DIGNN_CACHE``, else ``~/.cache/dignn``: where PyG writes processed files."""
    env = os.environ.get("DIGNN_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "dignn"


def default_data_root() -> Path:
    """``$DIGNN_DATA`` when set (read only), else the cache."""
    env = os.environ.get("DIGNN_DATA")
    return Path(env).expanduser() if env else default_cache_dir()


def _roots(data_root: Optional[PathLike], cache_dir: Optional[PathLike]) -> Tuple[Path, Path]:
    """(data root, cache). A data root that was given (``data_root=`` / ``--data-root``, or
    ``$DIGNN_DATA``) must exist; with none given the data root is the cache itself."""
    cache = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    if data_root is not None:
        root, given_as = Path(data_root).expanduser(), "data_root (--data-root)"
    elif os.environ.get("DIGNN_DATA"):
        root, given_as = default_data_root(), "the data root $DIGNN_DATA"
    else:
        return cache, cache
    if not root.exists():
        raise FileNotFoundError(
            f"{given_as} {str(root)!r} was given but does not exist; pass an existing folder "
            f"laid out as <root>/<name>/raw/..., or give no data root at all to use only the "
            f"cache {str(cache)!r} (which PyG fills by downloading)")
    if not root.is_dir():
        raise NotADirectoryError(
            f"{given_as} {str(root)!r} is a file, not a folder; pass the folder laid out as "
            f"<root>/<name>/raw/... (a dataset file goes to --dataset FILE)")
    return root, cache


def stage(data_root: Optional[PathLike], cache_dir: Optional[PathLike],
          relative_raw: Sequence[Union[str, Tuple[str, str]]]) -> Path:
    """Copies ``<data_root>/<rel>`` into ``<cache>/<rel>`` for each raw folder or file that
    exists under the data root and is missing (or differs in size) in the cache; returns the
    cache (created when missing), which PyG may then write into. The data root itself is
    never written. An entry ``(source, target)`` copies ``<data_root>/<source>`` to
    ``<cache>/<target>`` (another spelling of a folder)."""
    root, cache = _roots(data_root, cache_dir)
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OSError(f"cannot create the dataset cache {str(cache)!r} ({err}); point "
                      f"DIGNN_CACHE (or cache_dir= / --cache-dir) at a writable folder") from None
    if root.resolve() == cache.resolve():
        return cache
    for rel in relative_raw:
        source_rel, target_rel = (rel, rel) if isinstance(rel, str) else rel
        source, target = root / source_rel, cache / target_rel
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


def _missing(cache: Path, raw: Sequence[RawFiles]) -> List[str]:
    return [f"{g.folder}/{n}" for g in raw for n in g.names if not (cache / g.folder / n).exists()]


def _unavailable(name: str, root: Path, cache: Path, raw: Sequence[RawFiles], why: str,
                 offline_note: str = "") -> DatasetUnavailableError:
    where = (f"the cache {str(cache)!r} (no data root was given)" if root == cache else
             f"the data root {str(root)!r} and the cache {str(cache)!r}")
    lines = [f"dataset {name!r} is not available: {why}. Looked in {where}.",
             "PyG reads these files (layout <root>/<folder>/<file>):"]
    for group in raw:
        lines.append(f"  {group.folder}/: {', '.join(group.names)}")
        saved_as = (f" (saved as {group.names[0]})" if len(group.names) == 1 and "<file>" not in
                    group.url and not group.url.endswith("/" + group.names[0]) else "")
        lines.append(f"    downloaded from {group.url}{saved_as}")
    missing = _missing(cache, raw)
    present = sum(len(g.names) for g in raw) - len(missing)
    if present:
        lines.append(f"  missing from the cache: {', '.join(missing)}")
    if offline_note:
        lines.append(offline_note)
    lines.append("Put these files in a folder with this layout and pass --data-root DIR (or "
                 "data_root=DIR), or run with network access so that PyG downloads them "
                 "into the cache.")
    return DatasetUnavailableError("\n".join(lines))


def load_staged(name: str, data_root: Optional[PathLike], cache_dir: Optional[PathLike],
                raw: Sequence[RawFiles], construct: Callable[[Path], T],
                also_stage: Sequence[Union[str, Tuple[str, str]]] = (),
                offline_note: str = "") -> T:
    """Stages ``raw``'s folders (and ``also_stage``) from the data root into the cache, then
    runs ``construct(cache)`` (a PyG dataset class, which downloads what is missing as usual).
    A failure while raw files are missing (a download that failed) becomes a
    :class:`DatasetUnavailableError` naming every file, its folder and its URL."""
    root, cache = _roots(data_root, cache_dir)
    # ``raw``'s folders last: where two spellings of a folder hold the same file, PyG's wins
    stage(data_root, cache_dir, list(also_stage) + [g.folder for g in raw])
    try:
        return construct(cache)
    except OSError as err:  # urllib's URLError, aiohttp's connection errors, missing files
        if not _missing(cache, raw):
            raise _unreadable(name, root, cache, raw, err) from err
        raise _unavailable(name, root, cache, raw,
                           f"some of its raw files are missing and PyG could not download "
                           f"them ({type(err).__name__}: {err})", offline_note) from None
    except (DatasetUnavailableError, ImportError, MemoryError):
        raise
    except Exception as err:  # noqa: BLE001 - a parser's failure on a damaged file
        raise _unreadable(name, root, cache, raw, err) from err


class DatasetUnreadableError(ValueError):
    """A dataset's files are there but cannot be read (damaged, truncated, of another
    format)."""


def _unreadable(name: str, root: Path, cache: Path, raw: Sequence[RawFiles],
                err: BaseException) -> DatasetUnreadableError:
    folders = sorted({str(cache / g.folder.split("/")[0]) for g in raw})
    where = "" if root == cache else f" (copied from the data root {str(root)!r})"
    first = (str(err).strip().splitlines() or [""])[0][:200]
    return DatasetUnreadableError(
        f"dataset {name!r} cannot be read from its files in the cache{where}: "
        f"{type(err).__name__}: {first}; they are damaged or not the expected format: put "
        f"intact copies under --data-root and delete {', '.join(folders)} so that they are "
        f"copied (or downloaded) again")


def require_complete(name: str, data_root: Optional[PathLike], cache_dir: Optional[PathLike],
                     raw: Sequence[RawFiles]) -> None:
    """For a dataset class that only checks some of its raw files before processing (and
    would process an incomplete folder without complaint): when the cache holds some of
    ``raw`` but not all, raises the DatasetUnavailableError that lists them."""
    root, cache = _roots(data_root, cache_dir)
    missing = _missing(cache, raw)
    if missing and len(missing) < sum(len(g.names) for g in raw):
        raise _unavailable(name, root, cache, raw,
                           f"its raw folder is incomplete ({', '.join(missing)} missing)")
