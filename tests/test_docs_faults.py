"""Rendering faults of the documentation, caught in its Markdown sources (no Sphinx build, well
under a second): a flag written after an en or em dash, a path of one machine in a command a
user would copy, a heading twice on one page, a line that starts with ``>`` and so renders as a
stray quote box, a ``bench/...`` script that does not exist. Each failure names the file, the
line and the fix. The site itself is built by ``bash docs/build.sh`` (CI); the Sphinx side of
the same faults (smart quotes turning ``--help`` into an en dash, one parameter list per
object) is fixed in ``docs/conf.py``, whose hooks are checked here by name."""
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"

# The pages a user reads: every Markdown source of the site and the README. The changelog
# records history as it was written (earlier paths included) and is left out.
PAGES = sorted([p for p in DOCS.rglob("*.md")
                if not {"_build", "_generated"} & set(p.parts)
                and not p.name.startswith("changelog")] + [ROOT / "README.md"])


FENCE = re.compile(r"^\s*(`{3,}|~{3,}|:{3,})")


def _prose_lines(path):
    """(line number, line) of ``path`` outside fenced blocks (code, directives)."""
    fence = None
    for n, line in enumerate(path.read_text().splitlines(), 1):
        m = FENCE.match(line)
        if m:
            mark = m.group(1)
            if fence is None:
                fence = mark
                continue
            if line.strip() and set(line.strip()) == {fence[0]} and len(line.strip()) >= len(fence):
                fence = None
                continue
        if fence is None:
            yield n, line


def _code_spans(path):
    """(line number, text) of every command a user may copy: fenced code blocks (their lines)
    and inline code spans."""
    fence = None
    for n, line in enumerate(path.read_text().splitlines(), 1):
        m = FENCE.match(line)
        if m:
            if fence is None:
                fence = m.group(1)
                continue
            if set(line.strip()) == {fence[0]} and len(line.strip()) >= len(fence):
                fence = None
                continue
        if fence is not None:
            if fence[0] == "`":
                yield n, line
            continue
        for span in re.findall(r"`([^`]+)`", line):
            yield n, span


def _rel(path):
    return path.relative_to(ROOT)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(_rel(p)))
def test_no_dash_before_a_flag(page):
    """``–help`` or ``—epochs``: a flag copied with an en or em dash is not the flag."""
    for n, line in enumerate(page.read_text().splitlines(), 1):
        for m in re.finditer(r"[\u2013\u2014]-?([A-Za-z][\w-]*)", line):
            before = line[:m.start()]
            if before and not re.search(r"[\s`(\[{'\"]$", before):
                continue  # a dash between words ("2–5", "graph—layer"), not a flag
            assert False, (f"{_rel(page)}:{n}: a dash before the flag name {m.group(1)!r} "
                           f"({m.group(0)!r}); write the flag as --{m.group(1)}, in backticks "
                           f"(`--{m.group(1)}`)")


MACHINE_PATH = re.compile(r"(?<![\w.~])/(work|home|root|tmp)/")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(_rel(p)))
def test_no_machine_paths_in_commands(page):
    """A command on a user page names paths the user has (``../shared/data``, ``$DIGNN_DATA``,
    ``<checkout of the authors' code>``), not a folder of the machine that ran it."""
    for n, text in _code_spans(page):
        m = MACHINE_PATH.search(text)
        assert not m, (f"{_rel(page)}:{n}: a path of one machine ({m.group(0)}...) in a command "
                       f"a user copies: {text.strip()!r}; write a relative path, an environment "
                       f"variable or a <placeholder> instead")


def _render_results():
    spec = importlib.util.spec_from_file_location("render_results", DOCS / "render_results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_no_machine_paths_in_rendered_tables():
    """The rendered tables and their notes likewise; the provenance lines (``- `bench/results/
    ...```) quote the command as the run recorded it and are exempt."""
    render = _render_results()
    for name, table in render.TABLES.items():
        for n, line in enumerate(table().splitlines(), 1):
            if line.startswith("- `bench/results/"):
                continue
            m = MACHINE_PATH.search(line)
            assert not m, (f"docs/render_results.py, table {name!r}, line {n}: a path of one "
                           f"machine ({m.group(0)}...): {line.strip()[:120]!r}; render it "
                           f"without the machine's folders")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(_rel(p)))
def test_no_heading_twice_on_a_page(page):
    """A heading twice on one page shows one section twice (and its anchor twice)."""
    seen = {}
    for n, line in _prose_lines(page):
        m = re.match(r"^(#{1,6})\s+(.+?)\s*#*\s*$", line)
        if not m:
            continue
        key = (len(m.group(1)), m.group(2))
        assert key not in seen, (f"{_rel(page)}:{n}: the heading {line.strip()!r} is also at "
                                 f"line {seen[key]}; merge the two sections or rename one")
        seen[key] = n


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(_rel(p)))
def test_no_stray_quote_box(page):
    """A line that starts with ``>`` is a block quote in Markdown, also in the middle of a
    paragraph (a wrapped ``>= 0`` or ``> lambda_max``). A quote is meant when it starts a
    paragraph (a blank line or another quote line before it) with ``> `` and words."""
    previous = ""
    for n, line in _prose_lines(page):
        stripped = line.lstrip()
        if stripped.startswith(">") and len(line) - len(stripped) < 4:
            meant = (not previous.strip() or previous.lstrip().startswith(">")) and \
                re.match(r">\s+[\w*\"'`(]", stripped) and not re.match(r">\s*[=>]", stripped)
            assert meant, (f"{_rel(page)}:{n}: the line starts with '>' and renders as a quote "
                           f"box: {line.strip()[:60]!r}; rewrap the paragraph so that the line "
                           f"does not start with it, or write it in words or math (`>=`, $\\ge$)")
        previous = line


BENCH_SCRIPT = re.compile(r"bench/[\w./-]+?\.(?:py|sh)\b")


@pytest.mark.parametrize("page", PAGES + [ROOT / "pyproject.toml"],
                         ids=lambda p: str(_rel(p)))
def test_bench_scripts_exist(page):
    """Every ``bench/...py`` (or ``.sh``) a page names is a file of the checkout: the
    benchmarks live in groups (``bench/layer/``, ``bench/solvers/``, ``bench/peers/``,
    ``bench/accuracy/``, ``bench/distributed/``, ``bench/gpu/``; bench/README.md)."""
    groups = {p.name: p for p in (ROOT / "bench").glob("*/*")}
    for n, line in enumerate(page.read_text().splitlines(), 1):
        for path in BENCH_SCRIPT.findall(line):
            if (ROOT / path).is_file():
                continue
            moved = groups.get(Path(path).name)
            fix = (f"it is now {_rel(moved)}" if moved else
                   "name an existing script (see bench/README.md)")
            assert False, f"{_rel(page)}:{n}: {path} does not exist; {fix}"


def test_sphinx_keeps_flags_and_one_parameter_list():
    """The two faults that only the build makes: Sphinx's smart quotes turn ``--help`` outside
    a literal into an en dash (a caption such as "dignn --help"), and autodoc repeats a
    docstring's parameters under a later "Raises:" section. docs/conf.py undoes both."""
    conf = (DOCS / "conf.py").read_text()
    assert "_flags_keep_hyphens" in conf and '"doctree-read", _flags_keep_hyphens' in conf, (
        "docs/conf.py: connect _flags_keep_hyphens to doctree-read (or set "
        "smartquotes_action without 'D'), else 'dignn --help' renders as 'dignn –help'")
    assert '"object-description-transform", _one_parameter_list' in conf, (
        "docs/conf.py: connect _one_parameter_list to object-description-transform after "
        "autodoc (priority 600), else the layer's parameters are listed twice")
