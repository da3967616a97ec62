"""Every Python example in the docs runs, or says why it does not.

Each literal block of every page under docs/ (``::`` and ``.. code-block::``)
is either Python, run here as a file of its own (under pytest where it
defines tests), or not Python (a shell command, output, a CI file), or one
listed in NOT_RUN with the reason. ``.. literalinclude::`` may only show
files under examples/, which the example suite runs (test_examples.py and
README's ``python -m pytest examples``). Needs nothing but distspawn and
pytest: the pages are read as text, not built.
"""

import ast
import re
import textwrap
from pathlib import Path

import pytest

from harness import run_python

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
NOT_PYTHON = {"yaml", "console", "text", "ini", "toml", "shell", "bash", "none", "rst"}
# (page, first line of the block) -> why it is not run here
NOT_RUN: dict[tuple[str, str], str] = {}


def literal_blocks(page: Path) -> list[tuple[str, str, str]]:
    """(language or "", first line, dedented text) of each literal block of a page."""
    lines = page.read_text().splitlines()
    blocks = []
    for at, line in enumerate(lines):
        stripped = line.strip()
        directive = re.match(r"\.\. code-block::\s*(\S*)", stripped)
        if directive:
            language = directive.group(1) or "python"
        elif stripped.endswith("::") and not stripped.startswith(".."):
            language = ""
        else:
            continue
        indent = len(line) - len(line.lstrip())
        body = []
        for later in lines[at + 1:]:
            if later.strip() and len(later) - len(later.lstrip()) <= indent:
                break
            body.append(later)
        text = textwrap.dedent("\n".join(b for b in body
                                         if not re.match(r"\s+:\w[\w-]*:", b))).strip("\n")
        if text:
            blocks.append((language, text.splitlines()[0], text))
    return blocks


def is_python(language: str, text: str) -> bool:
    if language:
        return language not in NOT_PYTHON
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return False
    # A bare expression such as "[pytest]" parses too; code imports or defines.
    return any(isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef))
               for node in tree.body)


def python_blocks() -> list[tuple[str, str, str]]:
    found = []
    for page in sorted(DOCS.rglob("*.rst")):
        for language, first, text in literal_blocks(page):
            if is_python(language, text):
                found.append((str(page.relative_to(DOCS)), first, text))
    return found


BLOCKS = python_blocks()


def test_the_docs_have_python_examples_and_no_stale_exemptions():
    # the tutorial's first test is found as Python (the block finder works)
    assert any(page == "tutorial/first-test.rst" for page, _, _ in BLOCKS), BLOCKS
    keys = {(page, first) for page, first, _ in BLOCKS}
    assert set(NOT_RUN) <= keys, f"NOT_RUN names blocks no page has: {set(NOT_RUN) - keys}"


def test_literalinclude_shows_only_files_the_example_suite_runs():
    for page in DOCS.rglob("*.rst"):
        for included in re.findall(r"\.\. literalinclude::\s*(\S+)", page.read_text()):
            path = (page.parent / included).resolve()
            assert path.is_file(), (page, included)
            assert path.parent == ROOT / "examples", (page, included)


@pytest.mark.parametrize("page,first,text", BLOCKS, ids=[f"{p}:{f[:40]}" for p, f, _ in BLOCKS])
def test_each_python_example_runs(page, first, text, tmp_path):
    if (page, first) in NOT_RUN:
        pytest.skip(NOT_RUN[(page, first)])
    script = tmp_path / "test_docs_block.py"
    script.write_text(text + "\n")
    has_tests = re.search(r"^\s*def test_", text, re.M) is not None
    args = (["-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", str(script)]
            if has_tests else [str(script)])
    run = run_python(args, cwd=tmp_path)
    assert run.returncode == 0, f"{page}: the block starting {first!r}:\n{run.output}"
    if has_tests:
        assert re.search(r"\d+ (passed|skipped)", run.output), run.output
    assert run.leftover_files == [] and run.leftover_pids == []
