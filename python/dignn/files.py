"""Files a run writes (checkpoints, JSON records, figures, partitions): written whole or not
at all, checked before any work, and no temporaries left behind.

A file is written to a temporary beside it, ``.<name>.<host>.<pid>.tmp``, then renamed over
it, so that readers see the old file or the new one, never half of one; a write that fails,
or is interrupted (Ctrl-C), removes its temporary and leaves the old file as it was. The
temporary's name is at most :data:`TEMPORARY_NAME_MAX` bytes whatever the target's: a
``<name>`` or ``<host>`` over 40 bytes is cut to its start and a hash of the whole, so that
every name the file system takes for the target also works for its temporary. A process
killed in the middle of a write (``kill -9``) cannot clean up: the next write to the same
path (and a run that checkpoints there) removes the temporaries of that path whose process
is gone, when they were made on this host (a pid means nothing on another host sharing the
folder) and their process no longer runs (a live one, of any user, is still writing its
own). Temporaries named ``.<name>.<pid>.tmp``, as versions before the host was in the name
wrote them, are judged by their pid alone.

A write that fails raises :class:`WriteError`, which names the path and the system's
reason and says what to do; :func:`check_writable` refuses, before any work, the paths that
cannot be written at all (a folder, a folder that takes no files, a name longer than the
file system takes).
"""
from __future__ import annotations

import errno
import hashlib
import os
import re
import signal
import socket
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Callable, Optional, Union

from dignn_kernels.archive import archive_damage, describe_load_error

__all__ = ["check_writable", "write_atomically", "temporary_path", "remove_stale_temporaries",
           "describe_load_error", "archive_damage", "WriteError", "TEMPORARY_NAME_MAX"]

PathLike = Union[str, os.PathLike]

# A part of a temporary's name (the target's name, the host) longer than this many bytes is
# cut to its start and a hash of the whole.
_PART_MAX = 40
#: The most bytes of a temporary's name: a dot, two parts, a pid of up to 7 digits (Linux's
#: pid_max is at most 2**22) and the dots and ``.tmp`` between them; below every file
#: system's name limit in use (255 bytes on most, 143 on eCryptfs).
TEMPORARY_NAME_MAX = 1 + 2 * (_PART_MAX + 1) + 7 + 4


def _bounded(text: str) -> str:
    """``text``, or when it is over ``_PART_MAX`` bytes its start and a hash of the whole
    (``<start>~<12 hex digits>``) in ``_PART_MAX`` bytes."""
    data = os.fsencode(text)
    if len(data) <= _PART_MAX:
        return text
    digest = hashlib.sha256(data).hexdigest()[:12]
    start = text
    while len(os.fsencode(start)) > _PART_MAX - len(digest) - 1:  # whole characters
        start = start[:-1]
    return f"{start}~{digest}"


def _host() -> str:
    """This host's name, as it appears in a temporary's name."""
    return _bounded(re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname() or "host"))


def temporary_path(path: PathLike, pid: Optional[int] = None) -> Path:
    """The temporary that :func:`write_atomically` writes ``path`` to in process ``pid``
    (default: this one): in ``path``'s folder, a name of at most
    :data:`TEMPORARY_NAME_MAX` bytes.

    Example:
        >>> from dignn.files import TEMPORARY_NAME_MAX, temporary_path
        >>> temporary_path("runs/r.json", pid=12).name.endswith(".12.tmp")
        True
        >>> len(temporary_path("r" * 250 + ".json").name) <= TEMPORARY_NAME_MAX
        True
    """
    path = Path(path)
    return path.with_name(f".{_bounded(path.name)}.{_host()}."
                          f"{os.getpid() if pid is None else pid}.tmp")


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
    # also the names without a host, of the versions before it was in the name, and with the
    # whole name, of the versions before it was bounded
    names = "|".join(re.escape(n) for n in {_bounded(path.name), path.name})
    pattern = re.compile(r"\.(?:" + names + r")\.(?:" + re.escape(_host()) +
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
        except OSError:  # another process cleaned it first, or it is not ours to remove
            pass
    return removed


class WriteError(OSError):
    """A file could not be written. Its text names the path, the system's reason and what to
    do; :meth:`describe` also names the option that chose the path. The file at ``path``,
    if there was one, is as it was (the write went to a temporary, now removed).

    Attributes:
        path: the path that was to be written.
        errno, strerror: the system's error.

    Example:
        >>> import errno
        >>> from dignn.files import WriteError
        >>> err = WriteError("out/run.json", OSError(errno.ENOSPC, "No space left on device"))
        >>> print(err.describe("--json"))
        --json 'out/run.json' could not be written: No space left on device; free space there
        or give a path on another disk with --json (nothing was written)
    """

    _FIXES = {errno.ENOSPC: "free space there or give a path on another disk",
              errno.EDQUOT: "free space within your quota or give a path on another disk",
              errno.EFBIG: "raise the file size limit (ulimit -f) or give a path on a file "
                           "system that takes larger files",
              errno.EROFS: "give a path on a writable file system",
              errno.EACCES: "give a path in a folder you may write to",
              errno.EPERM: "give a path in a folder you may write to",
              errno.ENAMETOOLONG: "give a shorter path",
              errno.ENOTDIR: "give a path whose folders are folders, not files",
              errno.EISDIR: "give a file path, not a folder"}

    def __init__(self, path: PathLike, err: OSError):
        super().__init__(err.errno, err.strerror or str(err))
        self.path = Path(path)
        self.existed = _exists(self.path)

    def describe(self, option: Optional[str] = None) -> str:
        """The error in one line, naming ``option`` (e.g. ``--json``), the flag that chose
        the path, where given."""
        fix = self._FIXES.get(self.errno, "give another path")
        where = f"{option} {str(self.path)!r}" if option else repr(str(self.path))
        kept = "the file there is unchanged" if self.existed else "nothing was written"
        return (f"{where} could not be written: {self.strerror}; {fix}"
                f"{f' with {option}' if option else ''} ({kept})")

    def __str__(self) -> str:
        return self.describe()

    def __reduce__(self):  # (pickled across processes as itself)
        return (WriteError, (self.path, OSError(self.errno, self.strerror)))


def _exists(path: Path) -> bool:
    try:
        return os.path.lexists(path)
    except (OSError, ValueError):
        return False


@contextmanager
def _interrupts_deferred():
    """Holds back Ctrl-C (SIGINT) until the block ends, so that the removal of a temporary
    is not itself cut short; the interrupt then raises as usual. Only the main thread sets
    signal handlers; elsewhere the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught = []
    try:
        previous = signal.signal(signal.SIGINT, lambda *sig: caught.append(sig))
    except (ValueError, OSError):  # not a Python-managed handler: leave it alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught:  # delivered again, to the handler now in place
            signal.raise_signal(signal.SIGINT)


def write_atomically(path: PathLike, write: Callable[[IO[bytes]], None],
                     sync: bool = False) -> Path:
    """Calls ``write(f)`` on a temporary file beside ``path`` and renames it to ``path``
    (creating ``path``'s folder when missing); on any failure, Ctrl-C included, the
    temporary is removed and ``path`` is as it was. ``sync``: flush the data to the disk
    before the rename (a checkpoint that must survive a power loss).

    Raises:
        WriteError: the system refused the write (no space, a file size limit, a read-only
            folder, ...): an OSError that names the path.

    Example:
        >>> import pathlib, tempfile
        >>> from dignn.files import write_atomically
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     path = write_atomically(pathlib.Path(folder) / "r.json", lambda f: f.write(b"{}"))
        ...     print(path.read_bytes(), sorted(p.name for p in path.parent.iterdir()))
        b'{}' ['r.json']
    """
    path = Path(path)
    temporary = temporary_path(path)
    try:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except FileExistsError:  # a file where the folder should be
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR)) from None
        remove_stale_temporaries(path)
        with open(temporary, "wb") as f:
            write(f)
            if sync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(temporary, path)
    except BaseException as err:
        with _interrupts_deferred():
            try:
                os.unlink(temporary)
            except OSError:  # never made, or not ours to remove
                pass
        system = _system_error(err)
        if system is not None:
            raise WriteError(path, system) from err
        raise
    return path


def _system_error(err: BaseException) -> Optional[OSError]:
    """The system's refusal behind a failed write: ``err`` itself, or the OSError that a
    writer's later error arose from (torch.save, failing to write, raises a RuntimeError
    while closing its archive); None for anything else (a bug, Ctrl-C)."""
    if isinstance(err, WriteError) or not isinstance(err, Exception):
        return None
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, OSError):
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


def _limit(folder: Path, name: str, default: int) -> int:
    """The file system's ``os.pathconf`` limit ``name`` at ``folder`` (``default`` where it
    says none)."""
    try:
        value = os.pathconf(folder, name)
    except (OSError, ValueError, AttributeError):
        return default
    return value if value and value > 0 else default


def _nearest_folder(target: Path) -> Path:
    """The nearest existing ancestor of ``target`` (its parent when that exists); a path
    that cannot be looked at counts as missing."""
    folder = target.parent
    while not _exists(folder) and folder != folder.parent:
        folder = folder.parent
    return folder


def check_writable(path: PathLike, what: str, example: str = "run.json") -> Path:
    """Refuses, with a :class:`ValueError` naming ``what`` (the option, e.g. ``--json``) and
    the fix, a path that could not be written: a folder, something not a regular file, a
    name (of the file or of a folder to make) longer than the file system takes, a path
    longer than the system takes, or a path whose nearest existing folder does not take new
    files. Creates and leaves nothing (a probe file is made and removed at once in that
    folder).

    Example:
        >>> from dignn.files import check_writable
        >>> check_writable("r" * 300 + ".json", "--json")
        Traceback (most recent call last):
        ...
        ValueError: --json 'rrr...json' cannot be written: its name is 305 bytes, more than
        the ... the file system there takes; give a shorter name with --json
    """
    text = os.fspath(path)
    if isinstance(text, bytes):
        text = os.fsdecode(text)
    if not text.strip():
        raise ValueError(f"{what} is empty; give a file path such as {example}")
    shown = text if len(text) <= 80 else f"{text[:40]}...{text[-20:]}"
    if "\0" in text:
        raise ValueError(f"{what} {shown!r} holds a NUL character, which no path may hold; "
                         f"give another path with {what}")
    target = Path(text).expanduser()
    folder = _nearest_folder(target)
    name_max = _limit(folder, "PC_NAME_MAX", 255)
    below = target.relative_to(folder).parts if folder in target.parents else ()
    for part in below:  # the names this write creates (missing folders, the file)
        size = len(os.fsencode(part))
        if size > name_max:
            whose = "its name" if part == target.name else f"the folder name {part[:40]!r}"
            raise ValueError(f"{what} {shown!r} cannot be written: {whose} is {size} bytes, "
                             f"more than the {name_max} the file system there takes; give a "
                             f"shorter name with {what}")
    path_max = _limit(folder, "PC_PATH_MAX", 4096)
    longest = max(len(os.fsencode(str(p))) for p in (target, temporary_path(target)))
    if longest >= path_max:
        raise ValueError(f"{what} {shown!r} cannot be written: the path is {longest} bytes "
                         f"(with its temporary's name), more than the {path_max - 1} the "
                         f"system takes; give a shorter path with {what}")
    if target.is_dir():
        raise ValueError(f"{what} {text!r} is a folder; give a file path, e.g. "
                         f"{str(target / example)!r}")
    if target.exists() and not target.is_file():
        raise ValueError(f"{what} {text!r} exists and is not a regular file; give the path "
                         f"of a file to write")
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
