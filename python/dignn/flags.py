"""The parse-time types of the ``dignn`` command's flags and its "did you mean": every numeric
flag of every subcommand takes one of these types, and a configuration file's values
(:mod:`dignn.config`) are checked by the same ones. Nothing here imports torch."""
from __future__ import annotations

import argparse
import difflib
import math
from typing import List, Optional

# ----------------------------------------------------- the flags' parse-time types --
# Every numeric flag of every subcommand takes one of these types: argparse refuses a value
# out of range while parsing, before any data is read, in one line naming the flag and the
# range (``dignn train: error: argument --mu: got '-1'; give a finite number > 0``).

INT64_MAX = 2**63 - 1  # the ops take their integers as int64 (dignn_kernels.checks.check_int)


class _Number:
    """The type of a numeric flag: an int or a finite float in [low, high] (an end is open
    where ``low_open`` / ``high_open``; None: unbounded; ints stay within int64). ``what``:
    the range in words where the bounds do not say it well; ``why``: a note after it."""

    def __init__(self, kind: type, low=None, high=None, *, low_open: bool = False,
                 high_open: bool = False, what: Optional[str] = None,
                 why: Optional[str] = None):
        self.kind, self.low, self.high = kind, low, high
        self.low_open, self.high_open, self.what, self.why = low_open, high_open, what, why

    def describe(self) -> str:
        """The allowed values in words, e.g. ``a number in [0, 1)``."""
        if self.what is not None:
            text = self.what
        else:
            noun = "an integer" if self.kind is int else "a finite number"
            low = None if self.low is None else \
                f"{'>' if self.low_open else '>='} {self.low:g}"
            high = None if self.high is None else \
                f"{'below' if self.high_open else 'at most'} {self.high:g}"
            if low is not None and high is not None and self.kind is float:
                text = (f"a number in {'(' if self.low_open else '['}{self.low:g}, "
                        f"{self.high:g}{')' if self.high_open else ']'}")
            else:
                text = " ".join([noun] + [b for b in (low, "and" if low and high else None,
                                                      high) if b])
        return text + (f" ({self.why})" if self.why else "")

    def check(self, value, text: Optional[str] = None):
        """``value`` if it is in range, else an ``argparse.ArgumentTypeError`` saying the
        range (and quoting ``text``, what was typed, where given)."""
        shown = repr(value if text is None else text)
        if self.kind is float and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"got {shown}; give {self.describe()}")
        low_ok = self.low is None or (value > self.low if self.low_open else value >= self.low)
        high_ok = self.high is None or (value < self.high if self.high_open
                                        else value <= self.high)
        if not (low_ok and high_ok):
            raise argparse.ArgumentTypeError(f"got {shown}; give {self.describe()}")
        if self.kind is int and abs(value) > INT64_MAX:
            raise argparse.ArgumentTypeError(f"got {shown}; give {self.describe()} and at "
                                             f"most 2**63 - 1 (an int64)")
        return value

    def parse(self, text: str):
        """The number ``text`` spells (an ``argparse.ArgumentTypeError`` if none)."""
        try:
            value = self.kind(text)
        except ValueError:
            value = None
        if value is None or (self.kind is float and not math.isfinite(value)):
            noun = "an integer" if self.kind is int else "a finite number"
            raise argparse.ArgumentTypeError(f"{text!r} is not {noun}; give "
                                             f"{self.describe()}")
        return value

    def __call__(self, text: str):
        return self.check(self.parse(text), text)

    def __repr__(self) -> str:  # argparse names the type in some messages
        return self.describe()


POSITIVE = _Number(float, 0, low_open=True)
NON_NEGATIVE = _Number(float, 0)
PROBABILITY = _Number(float, 0, 1, high_open=True)
POSITIVE_INT = _Number(int, 1)
INDEX = _Number(int, 0)
SHARE = _Number(float, 0, 1, low_open=True, high_open=True)
# Each split trains a model: more than this is a typo (or an attempt to exhaust memory).
MAX_SPLITS = 1000
NUM_SPLITS = _Number(int, 1, MAX_SPLITS, why="each split trains a model")
# A collective's wait (seconds): beyond about a year it bounds nothing, and far beyond it
# datetime.timedelta, which carries it to torch.distributed, overflows.
MAX_TIMEOUT = 3.2e7
TIMEOUT = _Number(float, 0, MAX_TIMEOUT, low_open=True, why="seconds")


def _seed_type() -> _Number:
    from .presets import _SEED_LIMIT  # the one bound of the seed, with its reason, there
    return _Number(int, -_SEED_LIMIT, _SEED_LIMIT, low_open=True, high_open=True,
                   what="an integer of magnitude below 2**62")


def _threads(text: str) -> int:
    """``--threads``: a positive integer, at most a few per core this process may use."""
    from .catalog import MAX_THREADS_PER_CORE, usable_cores
    cores = usable_cores()
    return _Number(int, 1, MAX_THREADS_PER_CORE * cores,
                   why=f"{MAX_THREADS_PER_CORE} per core; this process may use {cores} "
                       f"cores")(text)


class _Numbers:
    """The type of a comma-separated list of numbers of one :class:`_Number` type (``count``
    of them where given), e.g. ``0,1,2``."""

    def __init__(self, item: _Number, example: str, count: Optional[int] = None):
        self.item, self.example, self.count = item, example, count

    def describe(self) -> str:
        many = f"{self.count}" if self.count else "comma-separated"
        return f"{many} values such as {self.example}, each {self.item.describe()}"

    def __call__(self, text: str) -> list:
        parts = [v.strip() for v in text.split(",") if v.strip() != ""]
        if not parts or (self.count and len(parts) != self.count):
            raise argparse.ArgumentTypeError(f"got {text!r}; give {self.describe()}")
        values = []
        for v in parts:
            try:
                values.append(self.item(v))
            except argparse.ArgumentTypeError as err:
                raise argparse.ArgumentTypeError(f"in {text!r}: {err}") from None
        return values

    def __repr__(self) -> str:
        return self.describe()


class _SplitRatio(_Numbers):
    """``--split-ratio``: three shares train,val,test, each in (0, 1), summing to at most 1
    (what :func:`dignn.data.custom.load_user_file` takes)."""

    def __init__(self):
        super().__init__(SHARE, "0.6,0.2,0.2", count=3)

    def describe(self) -> str:
        return f"three shares train,val,test such as {self.example}, each " \
               f"{self.item.describe()}, summing to at most 1"

    def __call__(self, text: str) -> list:
        values = super().__call__(text)
        if sum(values) > 1.0 + 1e-9:  # (the loader's own tolerance)
            raise argparse.ArgumentTypeError(f"got {text!r}, which sums to {sum(values):g}; "
                                             f"give {self.describe()}")
        return values


SPLIT_LIST = _Numbers(INDEX, "0,1,2")
MU_LIST = _Numbers(POSITIVE, "1,1.25,2")
SPLIT_RATIO = _SplitRatio()


# ----------------------------------------------------------- names: did you mean --

def _close(text: str, names, n: int = 3) -> List[str]:
    """The names of ``names`` close to ``text``: difflib's, else those of the same letters
    in another order (``gc``: cg) and those ``text`` begins (``ander``: anderson)."""
    text, names = str(text).lower(), [str(name) for name in names]
    close = difflib.get_close_matches(text, names, n=n)
    if not close and len(text) >= 2:
        close = [name for name in names if sorted(name.lower()) == sorted(text) or
                 name.lower().startswith(text)]
    return close[:n]


def _close_names(text: str, names) -> str:
    """`` (did you mean a or b?)`` for the names of ``names`` close to ``text``, else ``""``."""
    close = _close(text, names)
    return f" (did you mean {' or '.join(close)}?)" if close else ""
