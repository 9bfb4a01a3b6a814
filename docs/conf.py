"""Sphinx configuration of the dignn-kernels documentation.

Build: ``bash docs/build.sh`` (HTML with warnings as errors, then every code example as a
doctest). The measured tables are rendered from ``bench/results/`` at build time by
``docs/render_results.py`` into ``docs/_generated/`` (ignored by git).
"""
import os
import re
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
            if role == "obj" and getattr(obj, "__module__", None) in _MODULE_PAGES:
                summary = _link_pointer(summary, obj.__module__)
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


# The modules the reference points to. A docstring that says "module docstring" points to
# its own module's docstring, and ``:mod:`` roles name modules; the API pages above render the
# docstrings of API_MODULES and of the modules in their ``__all__``, so every other module
# that a rendered docstring points to (and, in turn, those that its docstring points to) gets
# a section with its docstring on the generated "Modules" page (api/modules.rst), and
# "module docstring" reads "docstring of <a link to the module>" (``_link_module_pointers``).
_POINTER = "module docstring"
_MOD_ROLE = re.compile(r":mod:`(?:[^`<]*<)?~?(\.*[\w.]+)>?`")


def _module_named(target: str, context: str):
    """The importable module of this project that ``:mod:`target``` in a docstring of module
    ``context`` names (as Sphinx looks it up: relative to ``context`` with a leading dot,
    else as written, inside ``context`` or beside it), or None."""
    import importlib

    if target.startswith("."):
        base, target = context, target[1:]
        while target.startswith("."):
            base, target = base.rpartition(".")[0], target[1:]
        candidates = [f"{base}.{target}"]
    else:
        candidates = [target, f"{context}.{target}", f"{context.rpartition('.')[0]}.{target}"]
    for name in candidates:
        if name.split(".")[0] not in ("dignn", "dignn_kernels") or \
                any(part.startswith("_") for part in name.split(".")):
            continue
        try:
            importlib.import_module(name)
        except Exception:  # not a module (a class, a function), or not importable here
            continue
        return name
    return None


def _docstrings(obj):
    """(module name, docstring) of ``obj`` and, for a class, of its public methods and
    properties: what autodoc renders of it."""
    import inspect

    module = getattr(obj, "__module__", None)
    items = [obj]
    if inspect.isclass(obj):
        for name, member in vars(obj).items():
            if not name.startswith("_") or name == "__init__":
                items.append(member.fget if isinstance(member, property) else
                             getattr(member, "__func__", member))
    for item in items:
        doc = inspect.getdoc(item) if (callable(item) or item is obj) else None
        if doc:
            yield getattr(item, "__module__", None) or module, doc


def _pointed_modules():
    """(The modules whose docstrings the API pages render, the modules that the rendered
    docstrings point to and no API page renders, sorted)."""
    import importlib
    import types

    rendered, texts = set(API_MODULES), []
    for modname in API_MODULES:
        module = importlib.import_module(modname)
        texts.append((modname, module.__doc__ or ""))
        for name in module.__all__:
            obj = getattr(module, name)
            if isinstance(obj, types.ModuleType):
                rendered.add(obj.__name__)
                texts.append((obj.__name__, obj.__doc__ or ""))
            elif callable(obj):
                texts += [(context or modname, doc) for context, doc in _docstrings(obj)]
    pointed, todo = set(), texts
    while todo:
        found = set()
        for context, doc in todo:
            if _POINTER in doc and context:
                found.add(context)
            found.update(filter(None, (_module_named(target, context)
                                       for target in _MOD_ROLE.findall(doc))))
        found -= rendered | pointed
        pointed |= found
        todo = [(name, importlib.import_module(name).__doc__ or "") for name in found]
    return rendered, sorted(pointed)


_RENDERED_MODULES, MODULE_NOTES = _pointed_modules()


def _write_module_notes(out: Path) -> None:
    """The "Modules" page's body: per package, one section per module of MODULE_NOTES with
    its docstring (``automodule``, no members: those the API pages list)."""
    lines = []
    for package in ("dignn_kernels", "dignn"):
        names = [m for m in MODULE_NOTES if m.split(".")[0] == package]
        if not names:
            continue
        lines += [f"``{package}``", "-" * (len(package) + 4), ""]
        for name in names:
            lines += [f"``{name}``", "~" * (len(name) + 4), "",
                      f".. automodule:: {name}", "   :no-members:"]
            parent, _, last = name.rpartition(".")
            if getattr(sys.modules[parent], last, None) is not sys.modules[name]:
                # the package's attribute of that name is not the module (the function
                # dignn_kernels.distributed.partition): one name, one target
                lines.append("   :no-index:")
            lines.append("")
    path = out / "api_modules.rst"
    text = "\n".join(lines) + "\n"
    if not path.is_file() or path.read_text() != text:
        path.write_text(text)


_write_module_notes(HERE / "_generated")
# Where a module's docstring is on the site: its API page, or the "Modules" page.
_MODULE_PAGES = _RENDERED_MODULES | set(MODULE_NOTES)


def _link_pointer(text: str, module: str) -> str:
    """``text`` with "(the) module docstring" as "(the) docstring of" a link to ``module``."""
    return text.replace(_POINTER, f"docstring of :mod:`{module}`")


_write_api(HERE / "_generated")


def _link_module_pointers(app, what, name, obj, options, lines):
    """"module docstring" in a rendered docstring becomes a link to that module's docstring
    (on its API page, or on the "Modules" page)."""
    module = getattr(obj, "__module__", None)
    if what == "module" or module not in _MODULE_PAGES:
        return
    lines[:] = [_link_pointer(line, module) for line in lines]


# Module docstrings write math as plain text (``||x||``, ``|p_i . p_j|``, ``a * b``), which
# reST reads as substitutions and emphasis. On the "Modules" page, ``|`` and every ``*`` that
# does not pair into *emphasis* are escaped, outside inline literals, roles, literal blocks
# (after ``::``) and doctests, so that each docstring shows as written.
_INLINE_KEPT = re.compile(r"(:[\w:]+:`[^`]*`|``.+?``|`[^`]+`_{0,2})", re.S)
_EMPHASIS = re.compile(r"(?<![\w*\\])(\*\*?)(?=\S)([^*\n]*?\S)\1(?![\w*])")


def _plain_text(text: str) -> str:
    """``text`` (not inside a literal) with its ``|`` and unpaired ``*`` escaped."""
    out, end = [], 0
    for match in _EMPHASIS.finditer(text):
        out += [text[end:match.start()].replace("*", r"\*"), match.group(0)]
        end = match.end()
    out.append(text[end:].replace("*", r"\*"))
    return "".join(out).replace("|", r"\|")


def _escape_plain_math(app, what, name, obj, options, lines):
    """The docstring of a module of the "Modules" page with its plain-text math escaped."""
    if what != "module" or name not in MODULE_NOTES:
        return
    out, prose = [], []
    literal_indent = None  # the indent of the paragraph whose "::" opened a literal block
    in_doctest = False

    def flush():
        if prose:
            parts = _INLINE_KEPT.split("\n".join(prose))
            parts[::2] = [_plain_text(part) for part in parts[::2]]
            out.extend("".join(parts).split("\n"))
            prose.clear()

    for line in lines:
        indent = len(line) - len(line.lstrip())
        if literal_indent is not None:
            if not line.strip() or indent > literal_indent:
                out.append(line)
                continue
            literal_indent = None
        if in_doctest:
            if line.strip():
                out.append(line)
                continue
            in_doctest = False
        if line.lstrip().startswith(">>>"):
            flush()
            in_doctest = True
            out.append(line)
            continue
        prose.append(line)
        if line.rstrip().endswith("::"):
            flush()
            literal_indent = indent
    flush()
    lines[:] = out


def _one_parameter_list(app, domain, objtype, contentnode):
    """One "Parameters" list per object. With ``autodoc_typehints = "description"`` autodoc
    adds the signature's types to every field list of a docstring, so a docstring whose
    "Raises:" section follows prose (the layer's) showed its parameters a second time, as bare
    types under "Raises". Runs after autodoc's merge (priority 600 > 500): a ``param``,
    ``type`` or ``rtype`` field that an earlier field list of the same object already has is
    dropped, and a field list left empty goes."""
    from docutils import nodes

    lists = [n for n in contentnode if isinstance(n, nodes.field_list)]
    if len(lists) < 2:
        return

    def names(field_list):
        return [field[0].astext().split() or [""] for field in field_list]

    # the return type stays beside the "Returns:" text where there is one, else in the first list
    rtype_home = next((i for i, fl in enumerate(lists)
                       if any(n[0] in ("return", "returns") for n in names(fl))), 0)
    seen = set()
    for i, field_list in enumerate(lists):
        for field in list(field_list):
            parts = field[0].astext().split()
            if not parts or parts[0] not in ("param", "type", "rtype"):
                continue
            if parts[0] == "rtype":
                if i != rtype_home:
                    field_list.remove(field)
                continue
            key = (parts[0], parts[-1])
            if key in seen:
                field_list.remove(field)
            seen.add(key)
        if not len(field_list):
            contentnode.remove(field_list)


_FLAG_DASH = re.compile(r"(?:^|(?<=[\s(\[{/'\"\u2018\u201c]))\u2013(?=[A-Za-z])")


def _flags_keep_hyphens(app, doctree):
    """``--help`` written outside a literal (a caption, a docstring's prose) stays two
    hyphens: Sphinx's smart quotes turn ``--`` into an en dash, which a shell does not take
    when the flag is copied. An en dash that starts a word (a flag) goes back to ``--``; the
    separators of field lists ("name (type) -- text") keep theirs (a space follows them)."""
    from docutils import nodes

    for node in list(doctree.findall(nodes.Text)):
        text = str(node)
        if "\u2013" in text:
            fixed = _FLAG_DASH.sub("--", text)
            if fixed != text:
                node.parent.replace(node, nodes.Text(fixed))


def setup(app):
    app.connect("doctree-read", _flags_keep_hyphens)
    app.connect("autodoc-process-docstring", _link_module_pointers)
    app.connect("autodoc-process-docstring", _escape_plain_math)
    app.connect("object-description-transform", _one_parameter_list, priority=600)

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
    # MathJax from the package's own copy, served from _static/mathjax/ of the built site:
    # the pages' equations typeset without a network (a CDN script shows raw \( ... \)).
    "sphinx-mathjax-offline",
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
html_static_path = ["_static"]
# Wide tables (the measured ones) scroll sideways inside the page instead of overflowing it.
html_css_files = ["tables.css"]
html_theme_options = {"navigation_with_keys": True}
