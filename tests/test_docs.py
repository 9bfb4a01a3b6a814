"""The documentation's checks that need no Sphinx: the README's headline table is the rendering
of the committed results (a number cannot drift from its measurement), the README keeps the
commands CI parses, every rendered table reads its result files, and the "has not run / has not
been measured" statements live on one page. The site itself, with every example as a doctest,
is built by ``bash docs/build.sh`` (CI)."""
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def _render_results():
    # docs/render_results.py is a script of the docs, not a module of the package: load it by
    # path (it needs only the standard library and bench/results/).
    spec = importlib.util.spec_from_file_location("render_results", DOCS / "render_results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


render = _render_results()
README = (ROOT / "README.md").read_text()


def test_readme_headline_table_is_the_rendering_of_the_results():
    block = render.readme_block(README)
    assert block is not None, (
        f"README.md has no headline block: it starts with {render.README_START!r}")
    assert block == render.headline(), (
        "README.md's headline table differs from bench/results: run "
        "`python docs/render_results.py --update-readme`")


def test_readme_keeps_the_commands_ci_parses():
    lines = README.splitlines()
    assert "pip install torch && pip install . && dignn train" in README
    marker = "<!-- test-command: .ci/run runs the next line exactly -->"
    assert marker in lines
    i = lines.index(marker)
    assert lines[i + 1].startswith("```")
    # the test command (CI may add a flag to its pytest, e.g. -n auto)
    assert lines[i + 2].startswith('pip install torch && pip install ".[test]" && pytest ')
    assert lines[i + 2].endswith(" tests")
    assert lines[i + 3] == "```"


def test_readme_is_the_front_door():
    assert len(README.splitlines()) <= 150


@pytest.mark.parametrize("name", sorted(render.TABLES))
def test_every_table_renders_from_its_result_files(name):
    text = render.TABLES[name]()
    table = [line for line in text.splitlines() if line.startswith("|")]
    assert len(table) >= 3, f"{name}: no rows"
    widths = {line.count("|") for line in table}
    assert len(widths) == 1, f"{name}: rows of different widths"
    # each table says where its numbers come from: file, device, commit, date, command
    provenance = [line for line in text.splitlines() if line.startswith("- `bench/results/")]
    assert provenance, f"{name}: no provenance"
    for line in provenance:
        for field in ("device", "commit", "date", "command"):
            assert field in line, f"{name}: provenance without {field}: {line}"
        path = ROOT / line.split("`")[1]
        assert path.is_file(), f"{name}: names a result file that does not exist: {path}"


def test_pages_include_only_rendered_tables():
    generated = set(render.TABLES) | {"headline"}
    for page in DOCS.rglob("*.md"):
        if "_build" in page.parts or "_generated" in page.parts:
            continue
        for name in re.findall(r"_generated/(\w+)\.md", page.read_text()):
            assert name in generated, f"{page}: includes _generated/{name}.md, which no " \
                                      f"function of docs/render_results.py writes"


STATUS_PHRASES = re.compile(r"(has|have) not (yet )?(been )?(run|measured|timed)|not yet "
                            r"(run|measured|timed)|no GPU has", re.IGNORECASE)


def test_what_has_not_run_is_stated_on_the_status_page_only():
    pages = [ROOT / "README.md", ROOT / "bench" / "README.md"]
    pages += [p for p in DOCS.rglob("*.md") if "_build" not in p.parts
              and "_generated" not in p.parts and p.name not in ("status.md", "changelog.md")]
    for page in pages:
        for n, line in enumerate(page.read_text().splitlines(), 1):
            assert not STATUS_PHRASES.search(line), (
                f"{page}:{n}: a 'has not run / not measured' statement belongs on "
                f"docs/status.md (once): {line.strip()}")


def test_api_reference_covers_every_public_module():
    conf_text = (DOCS / "conf.py").read_text()
    for module in ("dignn_kernels", "dignn_kernels.ops", "dignn_kernels.distributed", "dignn"):
        assert f'"{module}"' in conf_text, f"docs/conf.py's API_MODULES lacks {module}"
        page = DOCS / "api" / (module.split(".")[-1] + ".rst")
        assert page.is_file(), f"no API page for {module}"
        assert f"_generated/api_{module.replace('.', '_')}.rst" in page.read_text()


def test_readme_example_runs(capsys):
    blocks = re.findall(r"```python\n(.*?)```", README, flags=re.DOTALL)
    assert len(blocks) == 1, "the README has one Python example"
    assert len(blocks[0].strip().splitlines()) <= 12
    exec(compile(blocks[0], "README.md", "exec"), {})
    iterations, relative_residual, backend = capsys.readouterr().out.split()
    assert int(iterations) >= 1 and float(relative_residual) >= 0 and backend


@pytest.mark.parametrize("name", sorted(render.TABLES))
def test_rendered_commands_are_portable(name):
    """A recorded command as a reader copies it: no absolute path of the machine that
    measured, and every bench/ script it names exists in this checkout."""
    import re
    text = render.TABLES[name]()
    for path in re.findall(r"(?<![\w./~-])/(?:work|root|home|tmp|opt|mnt)/[^\s`]*", text):
        raise AssertionError(f"{name}: absolute path {path!r} in a rendered command: "
                             f"docs/render_results.py's _portable should map it")
    for script in re.findall(r"\bbench/[\w./-]+\.(?:py|sh)\b", text):
        assert (ROOT / script).exists(), f"{name}: {script} does not exist"


def test_portable_maps_the_measuring_machine_away():
    got = render._portable("dignn train --data-root /work/shared/data/x --cache-dir /work/cache "
                           "--json /tmp/runs/a.json DIGNN_AUTHORS=/opt/authors "
                           "/usr/bin/python3 bench/peers.py")
    assert got == ("dignn train --data-root ../shared/data/x --cache-dir cache --json a.json "
                   "DIGNN_AUTHORS=authors python bench/peers/peers.py")
