"""Files a run writes (checkpoints, JSON records, figures, partitions): written whole or not
at all, checked before any work, and no temporaries left behind.

A file is written to a temporary beside it, ``.<name>.<host>.<pid>.tmp``, then renamed over
it, so that readers see the old file or the new one, never half of one; a write that fails
removes its temporary. A process killed in the middle of a write (``kill -9``) cannot clean
up: the next write to the same path (and a run that checkpoints there) removes the
temporaries of that path whose process is gone, when they were made on this host (a pid means
nothing on another host sharing the folder) and their process no longer runs (a live one, of
any user, is still writing its own). Temporaries named ``.<name>.<pid>.tmp``, as versions
before the host was in the name wrote them, are judged by their pid alone.
"""
from __future__ import annotations

import os
import re
import socket
import tempfile
from pathlib import Path
from typing import IO, Callable, Optional, Union

from dignn_kernels.archive import archive_damage, describe_load_error

__all__ = ["check_writable", "write_atomically", "temporary_path", "remove_stale_temporaries",
           "describe_load_error", "archive_damage"]

PathLike = Union[str, os.PathLike]


def _host() -> str:
    """This host's name, as it may appear in a file name."""
    return re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname() or "host")


def temporary_path(path: PathLike, pid: Optional[int] = None) -> Path:
    """The temporary that :func:`write_atomically` writes ``path`` to in process ``pid``
    (default: this one)."""
    path = Path(path)
    return path.with_name(f".{path.name}.{_host()}.{os.getpid() if pid is None else pid}.tmp")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True  # another user's process (or not a pid we can judge): leave it alone
    return True


def remove_stale_temporaries(path: PathLike) -> int:
    """Removes the temporaries of ``path`` left by killed writers of this host; returns how
    many it removed."""
    path = Path(path)
    # also the names without a host, of the versions before it was in the name
    pattern = re.compile(r"\." + re.escape(path.name) + r"\.(?:" + re.escape(_host()) +
                         r"\.)?([0-9]+)\.tmp")
    removed = 0
    try:
        entries = list(os.scandir(path.parent if str(path.parent) else "."))
    except OSError:
        return 0
    for entry in entries:
        match = pattern.fullmatch(entry.name)
        if match is None:
            continue
        pid = int(match.group(1))
        if pid == os.getpid() or _alive(pid):
            continue
        try:
            os.unlink(entry.path)
            removed += 1
        except FileNotFoundError:  # another process cleaned it first
            pass
    return removed


def write_atomically(path: PathLike, write: Callable[[IO[bytes]], None],
                     sync: bool = False) -> Path:
    """Calls ``write(f)`` on a temporary file beside ``path`` and renames it to ``path``
    (creating ``path``'s folder when missing); on any failure the temporary is removed and
    ``path`` is as it was. ``sync``: flush the data to the disk before the rename (a
    checkpoint that must survive a power loss)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path)
    temporary = temporary_path(path)
    try:
        with open(temporary, "wb") as f:
            write(f)
            if sync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(temporary, path)
    finally:
        try:
            os.unlink(temporary)
        except FileNotFoundError:  # renamed: the write succeeded
            pass
    return path


def check_writable(path: PathLike, what: str, example: str = "run.json") -> Path:
    """Refuses, with a :class:`ValueError` naming ``what`` (the option, e.g. ``--json``) and
    the fix, a path that could not be written: a folder, something not a regular file, or a
    path whose nearest existing folder does not take new files. Creates and leaves nothing
    (a probe file is made and removed at once in that folder)."""
    text = os.fspath(path)
    if not text.strip():
        raise ValueError(f"{what} is empty; give a file path such as {example}")
    target = Path(text).expanduser()
    if target.is_dir():
        raise ValueError(f"{what} {text!r} is a folder; give a file path, e.g. "
                         f"{str(target / example)!r}")
    if target.exists() and not target.is_file():
        raise ValueError(f"{what} {text!r} exists and is not a regular file; give the path "
                         f"of a file to write")
    folder = target.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise ValueError(f"{what} {text!r} cannot be written: {str(folder)!r} is a file, not "
                         f"a folder; give a path in a folder")
    try:
        fd, probe = tempfile.mkstemp(prefix=".dignn-write-test-", dir=folder)
    except OSError as err:
        raise ValueError(f"{what} {text!r} cannot be written: the folder {str(folder)!r} does "
                         f"not take new files ({err.strerror or err}); give a path in a "
                         f"writable folder") from None
    os.close(fd)
    os.unlink(probe)
    return target
