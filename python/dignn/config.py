"""Configuration files of ``dignn train --config run.toml``, and ``--print-config``.

A configuration file is TOML (read with the standard library's :mod:`tomllib`): one key per
flag of ``dignn train``, the flag's name without its leading dashes (``data-root`` and
``data_root`` are the same key), with the value the flag takes: a string, an integer, a number,
``true``/``false`` for a switch (``progress = false`` is ``--no-progress``; ``no-progress =
true`` says the same), and a list (``splits = [0, 1, 2]``) or the flag's comma-separated text
(``splits = "0,1,2"``) for a list. Flags given on the command line override the file. Each
value is checked as the flag's is (its type, its range, its choices); an unknown key is
refused naming the key, the file and the closest keys. Paths are read as on the command line
(relative to the working directory).

``--print-config`` prints the resolved options (file, then command line) as TOML that
``--config`` reads back (:func:`to_toml`); options left at their defaults of None (the preset's
value) are listed as comments. Nothing here imports torch.
"""
from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path
from typing import Dict, List, Optional, Tuple

__all__ = ["ConfigError", "load_config", "read_toml", "config_keys", "to_toml",
           "resolved_options"]

# The options of `dignn train` that are not settings of a run (never keys of a file).
NOT_KEYS = {"help", "config", "print_config"}


class ConfigError(ValueError):
    """A configuration file that cannot be used: what is wrong, naming the file and the key."""


def _key(text: str) -> str:
    """A key as the flag spells it: ``data_root`` -> ``data-root``."""
    return text.strip().replace("_", "-")


def config_keys(parser: argparse.ArgumentParser) -> Dict[str, Tuple[argparse.Action, bool]]:
    """{key: (the action, negated)} of every flag of ``parser`` a file may set: ``--data-root``
    as ``data-root``; a switch's ``--no-progress`` as ``no-progress`` (negated)."""
    keys: Dict[str, Tuple[argparse.Action, bool]] = {}
    for action in parser._actions:
        if action.dest in NOT_KEYS or not action.option_strings or \
                action.dest is argparse.SUPPRESS:
            continue
        for flag in action.option_strings:
            if not flag.startswith("--"):
                continue
            name = flag[2:]
            negated = isinstance(action, argparse.BooleanOptionalAction) and \
                name.startswith("no-")
            keys[name] = (action, negated)
    return keys


def _is_switch(action: argparse.Action) -> bool:
    return action.nargs == 0


def _expected(action: argparse.Action) -> str:
    """The TOML type of a flag's value, in words."""
    from .flags import _Number, _Numbers, _threads
    if _is_switch(action):
        return "true or false"
    kind = action.type
    if isinstance(kind, _Numbers):
        items = "integers" if kind.item.kind is int else "numbers"
        return (f"a list of {items} such as [{kind.example.replace(',', ', ')}] (or the "
                f"text {kind.example!r})")
    if isinstance(kind, _Number):
        return "an integer" if kind.kind is int else "a number"
    if kind is _threads:
        return "an integer"
    return "a string"


def _toml_type(value) -> str:
    if isinstance(value, bool):
        return f"{str(value).lower()} (a boolean)"
    if isinstance(value, int):
        return f"{value} (an integer)"
    if isinstance(value, float):
        return f"{value!r} (a number)"
    if isinstance(value, str):
        return f"{value!r} (a string)"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a table"
    return type(value).__name__


def _convert(action: argparse.Action, value, where: str):
    """The value ``action`` stores for the file's ``value``, checked as the command line
    checks the flag's text; a :class:`ConfigError` saying the expected type or range."""
    from .flags import _Number, _Numbers, _threads
    expected = _expected(action)

    def wrong():
        return ConfigError(f"{where} must be {expected}, got {_toml_type(value)}")

    def checked(text: str):
        try:
            out = action.type(text) if action.type is not None else text
        except argparse.ArgumentTypeError as err:
            raise ConfigError(f"{where}: {err}") from None
        if action.choices is not None and out not in action.choices:
            from .flags import _close_names
            raise ConfigError(f"{where}: invalid choice {out!r}"
                              f"{_close_names(str(out), action.choices)} (choose from "
                              f"{', '.join(map(str, action.choices))})")
        return out

    if _is_switch(action):
        if not isinstance(value, bool):
            raise wrong()
        return value
    kind = action.type
    if isinstance(kind, _Numbers):
        if isinstance(value, str):
            return checked(value)
        if not isinstance(value, list) or not value or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
            raise wrong()
        if kind.item.kind is int and any(isinstance(v, float) for v in value):
            raise wrong()
        return checked(",".join(repr(v) for v in value))
    if isinstance(kind, _Number) or kind is _threads:
        integer = kind is _threads or kind.kind is int
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                (integer and isinstance(value, float)):
            raise wrong()
        if isinstance(kind, _Number):
            number = float(value) if kind.kind is float else value
            try:
                return kind.check(number, repr(value))
            except argparse.ArgumentTypeError as err:
                raise ConfigError(f"{where}: {err}") from None
        return checked(str(value))
    if not isinstance(value, str):
        raise wrong()
    return checked(value)


def read_toml(path, flag: str, error: type = ValueError, example: str = "") -> Dict:
    """The table of the TOML file a flag names, or ``error`` (one line naming the flag and the
    file: missing, a folder, unreadable, not TOML, not UTF-8)."""
    import tomllib
    shown = os.fspath(path)
    try:
        with open(Path(shown).expanduser(), "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise error(f"{flag} {shown!r}: no such file") from None
    except IsADirectoryError:
        raise error(f"{flag} {shown!r} is a folder; give a TOML file"
                    + (f" {example}" if example else "")) from None
    except OSError as err:
        raise error(f"{flag} {shown!r} cannot be read: {err.strerror or err}") from None
    except tomllib.TOMLDecodeError as err:
        raise error(f"{flag} {shown!r} is not valid TOML: {err}") from None
    except UnicodeDecodeError:
        raise error(f"{flag} {shown!r} is not valid TOML: not UTF-8 text") from None


def load_config(path, parser: argparse.ArgumentParser) -> Dict[str, object]:
    """{dest: value} of the configuration file ``path`` for the options of ``parser``
    (``dignn train``'s), every value checked as its flag's.

    Raises:
        ConfigError: the file cannot be read, is not TOML, or has an unknown key or a value
            of the wrong type or out of range (one line: the file, the key, the fix).
    """
    data = read_toml(path, "--config", ConfigError, "such as run.toml")
    shown = os.fspath(path)
    keys = config_keys(parser)
    values: Dict[str, object] = {}
    given: Dict[str, str] = {}  # dest -> the key that set it
    for raw, value in data.items():
        key = _key(raw)
        if key not in keys:
            from .flags import _close
            close = _close(key, [k for k in keys if not keys[k][1]], n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ConfigError(f"{shown}: unknown key {raw!r}{hint}; the keys are the flags "
                              f"of dignn train without their dashes (dignn train --help)")
        action, negated = keys[key]
        where = f"{shown}: key {raw!r} (--{key})"
        if isinstance(value, dict):
            raise ConfigError(f"{where} holds a table; a config file is flat: one key = value "
                              f"per flag")
        converted = _convert(action, value, where)
        if negated:
            converted = not converted
        if action.dest in given:
            raise ConfigError(f"{shown}: keys {given[action.dest]!r} and {raw!r} set the same "
                              f"option --{action.option_strings[0][2:]}; keep one")
        given[action.dest] = raw
        values[action.dest] = converted
    return values


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):  # never a flag's value (each is checked finite)
            return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    # a TOML basic string: JSON's escapes are TOML's (\" \\ \n \t \uXXXX ...)
    return json.dumps(str(value), ensure_ascii=False)


def resolved_options(args: argparse.Namespace, parser: argparse.ArgumentParser
                     ) -> List[Tuple[str, object]]:
    """(key, value) of every option of ``parser`` in ``args``, in the parser's order."""
    out = []
    for action in parser._actions:
        if action.dest in NOT_KEYS or not action.option_strings or \
                not hasattr(args, action.dest):
            continue
        flag = next((f for f in action.option_strings if f.startswith("--") and
                     not (isinstance(action, argparse.BooleanOptionalAction) and
                          f.startswith("--no-"))), None)
        if flag is None:
            continue
        out.append((flag[2:], getattr(args, action.dest)))
    return out


def to_toml(args: argparse.Namespace, parser: argparse.ArgumentParser,
            header: Optional[str] = None) -> str:
    """The options of ``args`` as TOML that :func:`load_config` reads back to the same
    values; an option that is None (left to the preset or the loader) is a comment."""
    lines = [f"# {line}" for line in (header or "").splitlines()]
    for key, value in resolved_options(args, parser):
        if value is None:
            lines.append(f"# {key} =  (not set)")
        else:
            lines.append(f"{key} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"
