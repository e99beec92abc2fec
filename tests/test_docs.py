"""The docs (issue 29): a short README, a site that `mkdocs build --strict` builds, a CLI reference
that lists every command and option `--help` shows, runnable examples that run, and the built
site in a real headless browser."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

# One worker for the file (pytest-xdist): its module fixtures (the built site) are made once.
pytestmark = pytest.mark.xdist_group("docs")

DOCS = REPO / "docs"
RUNNABLE = re.compile(r'<!-- runnable: expect "(.*?)" -->\s*```bash\n(.*?)```', re.DOTALL)
SETUP = ["pip install torch==2.13.0 && pip install -e '.[agent]' && kernelagent eval benchmarks/level1/1_relu.py "
         "benchmarks/solutions/level1/1_relu.py",
         "pip install torch==2.13.0 && pip install -e '.[test,rl]' && python -m pytest -q"]


def docs_hooks():
    """docs/hooks.py, the module MkDocs runs to generate the reference pages."""
    sys.path.insert(0, str(DOCS))
    try:
        import hooks
    finally:
        sys.path.remove(str(DOCS))
    return hooks


def test_the_readme_is_short_and_keeps_the_two_setup_commands():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 150
    for command in SETUP:
        assert command in text
    for link in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (REPO / link).is_file(), f"README links to a missing page: {link}"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


def test_the_site_builds_strictly(site):
    for page in ("index.html", "getting-started.html", "reference/cli.html", "reference/api.html",
                 "reference/statuses.html", "guides/whole-models.html"):
        assert (site / page).is_file(), page
    api = (site / "reference/api.html").read_text()
    assert "Evaluator" in api and "EvalConfig" in api  # mkdocstrings rendered the docstrings


def page_text(path: Path) -> str:
    """The text a browser shows for a page (tags dropped, entities decoded)."""
    from html.parser import HTMLParser

    class Text(HTMLParser):
        def __init__(self) -> None:
            super().__init__(convert_charrefs=True)
            self.parts: list[str] = []

        def handle_data(self, data: str) -> None:
            self.parts.append(data)

    parser = Text()
    parser.feed(path.read_text(encoding="utf-8"))
    return " ".join("".join(parser.parts).split())


# Placeholders of the CLI's help, as a reader must see them in the built reference (issue 43:
# written as raw HTML tags, `runs/<timestamp>-<problem>` showed as `runs/-`).
PLACEHOLDERS = ["runs/<timestamp>-<problem>", "CDIR/<problem-stem>.py", "runs/bench/<run id>",
                "openai/<name> with --api-base"]


def test_the_cli_reference_shows_its_placeholders(site):
    text = page_text(site / "reference" / "cli.html")
    for placeholder in PLACEHOLDERS:
        assert placeholder in text, placeholder
    assert "runs/-" not in text


def _help_tree():
    """{command path: option names} from the same click objects `--help` prints."""
    from typer.testing import CliRunner

    from kernelagent.cli import app

    out = {}

    def walk(path):
        result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
        assert result.exit_code == 0, (path, result.output)
        text = result.output
        out[" ".join(["kernelagent", *path])] = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", text))
        commands = re.search(r"^Commands:\n(.*?)(?:\n\s*\n|\Z)", text, re.DOTALL | re.MULTILINE)
        if commands:
            for line in commands.group(1).splitlines():
                name = re.match(r"^  ([a-z][a-z0-9-]*)(?:\s|$)", line)
                if name:
                    walk([*path, name.group(1)])

    walk([])
    return out


def test_the_cli_reference_lists_every_command_and_option_help_shows():
    hooks = docs_hooks()
    reference = hooks.cli_markdown()
    sections = dict(re.findall(r"^## `([^`]+)`\n(.*?)(?=^## `|\Z)", reference, re.MULTILINE | re.DOTALL))
    tree = _help_tree()
    assert {"kernelagent optimize", "kernelagent plan", "kernelagent mcp", "kernelagent export sft"} <= set(tree)
    assert set(tree) == set(sections), set(tree) ^ set(sections)
    for command, options in tree.items():
        missing = [o for o in options if o not in sections[command]]
        assert not missing, f"{command}: {missing} are in --help but not in the reference"


def runnable_blocks():
    for path in [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]:
        for expect, block in RUNNABLE.findall(path.read_text()):
            yield pytest.param(expect, block, id=f"{path.relative_to(REPO)}:{block.split()[1]}")


@pytest.mark.parametrize("expect,block", list(runnable_blocks()))
def test_runnable_examples_run(expect, block, tmp_path):
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "CUDA_VISIBLE_DEVICES": "", "TMPDIR": str(tmp_path), "KERNELAGENT_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHONPATH": str(REPO)}
    proc = subprocess.run(["bash", "-e", "-c", block], cwd=REPO, capture_output=True, text=True, timeout=600, env=env)
    output = proc.stdout + proc.stderr
    assert expect in output, f"expected {expect!r} from:\n{block}\ngot (exit {proc.returncode}):\n{output[-3000:]}"


def test_runnable_examples_exist():
    assert len(list(runnable_blocks())) >= 3


def test_the_site_in_a_real_browser(site, tmp_path):
    """Headless Chromium loads the index, follows the navigation to three pages, finds their headings."""
    from tests.test_report_browser import CHROMIUM, Browser, open_page

    if CHROMIUM is None:
        pytest.skip("no chromium on this machine (apt-get install chromium)")
    browser = Browser(tmp_path)
    try:
        open_page(browser, site / "index.html")
        assert browser.evaluate("document.querySelector('h1').textContent").strip().startswith("kernelagent")
        links = browser.evaluate("JSON.stringify(Array.from(document.querySelectorAll('nav a.md-nav__link'))"
                                 ".map(a => [a.textContent.trim(), a.href]))")
        targets = {text: href for text, href in __import__("json").loads(links) if href.startswith("file:")}
        for title, expected in (("Getting started", "Getting started"),
                                ("Optimising your own model", "Optimising your own model"),
                                ("How a verdict is decided", "How a verdict is decided")):
            assert title in targets, sorted(targets)
            browser.events.clear()
            browser.call("Page.navigate", url=targets[title])
            browser.wait_for("Page.loadEventFired")
            heading = browser.evaluate("document.querySelector('article h1').textContent").strip()
            assert heading.startswith(expected), heading
        # The rendered CLI reference, as the browser lays it out: its placeholders are text.
        browser.events.clear()
        browser.call("Page.navigate", url=(site / "reference" / "cli.html").as_uri())
        browser.wait_for("Page.loadEventFired")
        shown = " ".join(str(browser.evaluate("document.querySelector('article').innerText")).split())
        for placeholder in PLACEHOLDERS:
            assert placeholder in shown, placeholder
        assert not browser.errors()
    finally:
        browser.close()


def test_the_statuses_page_covers_every_status_flag_kind_and_exit_code():
    hooks = docs_hooks()
    from kernelagent import errors
    from kernelagent.harness.result import SEVERITY, Status

    page = hooks.status_markdown()
    for name, value in vars(Status).items():
        if name.isupper() and isinstance(value, str):
            assert f"| `{value}` |" in page and value in hooks.STATUS_TODO, value
    for kind in SEVERITY:
        assert f"| `{kind}` |" in page, kind
    for name, value in vars(errors).items():
        if name.startswith("EXIT_"):
            assert f"| {value} | `{name}` |" in page
