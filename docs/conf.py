"""Sphinx configuration of the dignn-kernels documentation.

Build: ``bash docs/build.sh`` (HTML with warnings as errors, then every code example as a
doctest). The measured tables are rendered from ``bench/results/`` at build time by
``docs/render_results.py`` into ``docs/_generated/`` (ignored by git).
"""
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import render_results  # noqa: E402  (docs/render_results.py)

render_results.write_all(HERE / "_generated")


def _write_cli_help(out: Path) -> None:
    """``dignn <command> --help`` of every command, as the parser prints it (80 columns), so
    that the CLI page shows the options of the installed code, not a copy."""
    import argparse
    os.environ["COLUMNS"] = "80"
    from dignn.cli import build_parser

    def walk(parser, name):
        yield name, parser.format_help()
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub, subparser in action.choices.items():
                    yield from walk(subparser, f"{name} {sub}")

    for name, text in walk(build_parser(), "dignn"):
        path = out / (name.replace(" ", "_") + ".txt")
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)


_write_cli_help(HERE / "_generated")

# The public names of each documented module, from its ``__all__`` (so that a new public name
# appears in the reference without an edit here): one autodoc directive per name.
API_MODULES = ("dignn_kernels", "dignn_kernels.ops", "dignn_kernels.distributed", "dignn")


def _summary(obj) -> str:
    """The first paragraph of a docstring on one line (autosummary's first sentence stops at
    abbreviations such as "eq. 10")."""
    import inspect

    doc = inspect.getdoc(obj) or ""
    if type(obj).__doc__ == doc and not callable(obj):  # a constant: its type's docstring
        return ""
    import re

    text = " ".join(doc.split("\n\n")[0].split())
    # the first sentence: a period and a capital after it, not an abbreviation ("eq. 10")
    end = re.search(r"(?<!\beq)(?<!e\.g)(?<!i\.e)\.\s+(?=[A-Z])", text)
    text = text[:end.start() + 1] if end else text
    return text[:-1] if text.endswith("::") else text  # "Example::" starts a literal block


def _write_api(out: Path) -> None:
    import importlib
    import inspect
    import types

    for modname in API_MODULES:
        module = importlib.import_module(modname)
        names = list(module.__all__)
        lines = [f".. currentmodule:: {modname}", "", ".. list-table::", "   :widths: 30 70",
                 ""]
        for name in names:
            obj = getattr(module, name)
            role = "mod" if isinstance(obj, types.ModuleType) else "obj"
            target = obj.__name__ if role == "mod" else name
            summary = _summary(obj) or f"``{obj!r}``"
            lines += [f"   * - :py:{role}:`{name} <{target}>`", f"     - {summary}"]
        lines.append("")
        for name in names:
            obj = getattr(module, name)
            if isinstance(obj, types.ModuleType):
                if obj.__name__ in API_MODULES:  # a page of its own
                    lines += [f".. rubric:: {name}", "",
                              f"The :mod:`{obj.__name__}` module: see :doc:`{name}`.", ""]
                else:
                    lines += [f".. rubric:: {name}", "",
                              f".. automodule:: {obj.__name__}", "   :no-members:", "",
                              f".. currentmodule:: {modname}", ""]
                continue
            if inspect.isclass(obj):
                directive = ("autoexception" if issubclass(obj, BaseException) else "autoclass")
                lines += [f".. {directive}:: {name}", ""]
            elif callable(obj):
                lines += [f".. autofunction:: {name}", ""]
            elif _summary(obj):
                lines += [f".. autodata:: {name}", ""]
            else:  # a constant without a doc comment: its value
                lines += [f".. py:data:: {name}", f"   :value: {obj!r}", ""]
        path = out / f"api_{modname.replace('.', '_')}.rst"
        text = "\n".join(lines) + "\n"
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)


_write_api(HERE / "_generated")

# Pages that other parts of the project write; a title-only placeholder keeps the toctree
# whole where one is missing from a checkout.
for _page, _title in (("internals/adding-a-solver.md", "Adding a solver"),
                      ("internals/adding-a-backend.md", "Adding a backend"),
                      ("internals/testing.md", "How the tests are layered")):
    if not (HERE / _page).is_file():
        (HERE / _page).write_text(f"# {_title}\n")

# The Triton backend's tests run in its interpreter on a CPU; the examples never use it, but
# importing the package must not try to reach a GPU compiler.
os.environ.setdefault("TRITON_INTERPRET", "1")

project = "dignn-kernels"
author = "the dignn-kernels authors"
copyright = "2026, the dignn-kernels authors"
try:
    from importlib.metadata import version as _version
    release = _version("dignn-kernels")
except Exception:  # pragma: no cover - a docs build without the package installed
    release = "0.1.0"
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.doctest",
    "sphinx.ext.intersphinx",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_generated", "Thumbs.db", ".DS_Store"]

# MyST: ```{directive} fences, $math$, definition lists, heading anchors for links.
myst_enable_extensions = ["colon_fence", "dollarmath", "deflist"]
myst_heading_anchors = 3

# autodoc / napoleon: Google-style docstrings, members in source order, signatures with types.
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": False}
autosummary_generate = False

# Cross references to torch and Python objects are resolved where the inventories are
# available offline; unresolved ones are not errors (nitpicky off).
nitpicky = False
intersphinx_mapping = {}

# doctest: every example runs on the CPU, small graphs, seconds.
doctest_global_setup = """
import torch
torch.manual_seed(0)
torch.set_num_threads(1)
"""
doctest_default_flags = (__import__("doctest").ELLIPSIS
                         | __import__("doctest").NORMALIZE_WHITESPACE)

html_theme = "furo"
html_title = f"dignn-kernels {release}"
html_static_path = []
html_theme_options = {"navigation_with_keys": True}
