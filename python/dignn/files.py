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
import zipfile
from pathlib import Path
from typing import IO, Callable, Optional, Union

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


def describe_load_error(err: BaseException) -> str:
    """One short line on why ``torch.load(weights_only=True)`` failed: torch's messages run
    over many lines and, for weights-only refusals, suggest unpickling, which a damaged or
    foreign file must not get."""
    text = str(err)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if "Weights only load failed" in text:
        detail = [line for line in lines[1:] if not line.startswith(("Please file",
                                                                     "Check the doc"))]
        return ("it holds something other than tensors and plain values"
                + (f" ({detail[0].rstrip('.')[:120]})" if detail else ""))
    first = (lines or [type(err).__name__])[0]
    return f"{type(err).__name__}: {first.split('. ')[0][:160]}"


def archive_damage(path: PathLike, required: bool = True) -> Optional[str]:
    """Why the ``torch.save`` archive at ``path`` is damaged, or None: every record is read
    and compared with the CRC-32 torch.save wrote (torch.load does not compare them, so a
    flipped bit in a tensor or in the pickled values would load as a wrong value).
    ``required``: a file that is not a zip archive is damaged (else: not checked, as
    torch.save's legacy format). An archive written without checksums
    (``torch.serialization.set_crc32_options(False)``) is not checked."""
    try:
        with zipfile.ZipFile(path) as archive:
            records = archive.infolist()
            if any(r.CRC == 0 and r.file_size > 0 for r in records):
                return None  # written without checksums
            bad = archive.testzip()
    except zipfile.BadZipFile as err:
        return f"it is not a torch.save archive ({err})" if required else None
    except (OSError, EOFError, RuntimeError, ValueError) as err:  # truncated inside a record
        return f"it cannot be read whole ({type(err).__name__}: {err})"
    return None if bad is None else f"its record {bad!r} does not match its checksum"
