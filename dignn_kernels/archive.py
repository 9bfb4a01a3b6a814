"""Reading ``torch.save`` archives that may be damaged or foreign: one short reason instead of
torch's tracebacks, and the checksums torch.load does not compare. Used by every loader of a
file a user passes: partitions (:mod:`dignn_kernels.distributed`), checkpoints and dataset
files (:mod:`dignn`)."""
from __future__ import annotations

import os
import zipfile
from typing import Callable, Optional, Union

import torch

__all__ = ["describe_load_error", "archive_damage", "load_checked"]


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


def archive_damage(path: Union[str, os.PathLike], required: bool = True) -> Optional[str]:
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


def load_checked(path: Union[str, os.PathLike], refuse: Callable[[str], Exception],
                 **load_args):
    """``torch.load(path, weights_only=True, **load_args)`` of an archive whose checksums
    match (:func:`archive_damage`); a damaged or unreadable file raises ``refuse(reason)``,
    the caller's exception naming the file and the fix. Never unpickles code."""
    damage = archive_damage(path)
    if damage is not None:
        raise refuse(damage)
    try:
        return torch.load(path, weights_only=True, **load_args)
    except Exception as err:  # noqa: BLE001 - truncated, damaged, foreign: all refused
        raise refuse(f"it cannot be read ({describe_load_error(err)})") from None
