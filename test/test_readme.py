"""README.rst must stay true: its commands are the ones CI runs."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


TEST_COMMAND = "python -m pytest test -q -rs -n 2 --dist worksteal"
SETUP_COMMAND = 'pip install torch==2.13.0 && pip install -e ".[test]"'


def test_ci_sets_up_a_new_venv_as_the_readme_says_then_runs_its_test_command():
    readme = (ROOT / "README.rst").read_text()
    assert f"\n    {TEST_COMMAND}\n" in readme
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    # A brand-new venv, README's set-up, README's test command, in that order.
    venv = ci_lines.index('python3 -m venv "$work/torch213"')
    activate = ci_lines.index('source "$work/torch213/bin/activate"', venv)
    setup = ci_lines.index(SETUP_COMMAND, activate)
    assert ci_lines.index(TEST_COMMAND, setup) > setup


def test_readme_quick_start_installs_pinned_torch_then_runs_the_examples():
    readme = (ROOT / "README.rst").read_text()
    assert f"    {SETUP_COMMAND}\n" in readme
    assert "    python -m pytest examples\n" in readme
    assert (ROOT / "examples" / "test_allreduce.py").exists()


def readme_code_blocks() -> list[tuple[str, str]]:
    """Each literal block of README.rst (after a paragraph ending "::"): the
    paragraph's last line, and the block, dedented."""
    import textwrap

    lines = (ROOT / "README.rst").read_text().splitlines()
    blocks = []
    for at, line in enumerate(lines):
        if not line.rstrip().endswith("::") or line.lstrip().startswith(".."):
            continue
        body = []
        for later in lines[at + 1:]:
            if later and not later.startswith(" "):
                break
            body.append(later)
        blocks.append((line.strip(), textwrap.dedent("\n".join(body)).strip("\n")))
    return blocks


# The README's literal blocks that are not Python to run (by the last line of
# the paragraph before each), and why; every other block is a Python file,
# run as the README says.
NOT_RUN = {
    "just that test::": "a failure report: output, not code",
    "deadline, naming each rank's call (then each stuck rank's stack)::": "output, not code",
    "::": "the install commands: test_ci_sets_up_a_new_venv... and CI run them",
    "Unchanged, in the stand-in mode (upstream's modules on distspawn's engine)::":
        "shell commands for a user's own suite (test_stand_in.py runs both forms)",
    "Run distspawn's own tests (two pytest-xdist workers)::": "the suite itself",
}


def test_every_readme_code_block_runs_or_says_why_not(tmp_path):
    from harness import run_python

    ran = 0
    for intro, block in readme_code_blocks():
        if intro in NOT_RUN:
            continue
        script = tmp_path / f"readme_block_{ran}.py"
        script.write_text(block + "\n")
        run = run_python([str(script), "-v"], cwd=tmp_path)
        assert run.returncode == 0 and "OK" in run.output, (intro, run.output)
        assert run.leftover_files == [] and run.leftover_pids == []
        ran += 1
    assert ran == 1  # the first test, "Write a test once, run it on N ranks"


def test_the_headline_figure_is_the_saved_corpus_run():
    # README's one number comes from benchmarks/results/corpus-sessions.json,
    # as docs/figures.py summarises it (and draws the picture under it).
    import re
    import sys

    sys.path.insert(0, str(ROOT / "docs"))
    import figures

    summary = figures.corpus_summary(figures.load("sessions"))
    readme = " ".join((ROOT / "README.rst").read_text().split())
    headline = re.search(r"\*\*(\w+) projects' suites, unchanged, ([\d.]+)x faster with the same "
                         r"verdicts:\*\*(.*?)Not counted: (\d+) tests (.*?) more\.", readme)
    assert headline, "README's headline sentence is not where test_readme expects it"
    words = {3: "Three", 4: "Four", 5: "Five", 6: "Six"}
    assert headline.group(1) == words[summary["projects"]]
    assert headline.group(2) == f"{summary['counted_ratio']:.1f}"
    body = headline.group(3)
    assert f"{summary['files']} test files" in body
    assert f"{summary['tests']} tests, none with another verdict" in body
    assert summary["differ"] == 0
    assert f"{summary['counted_upstream_s']:.0f} s on upstream's harness" in body
    assert f"{summary['counted_stand_in_s']:.0f} s on distspawn" in body
    assert headline.group(4) == str(summary["failing_tests"])
    assert (f"{summary['failing_upstream_s']:.0f} s and {summary['failing_stand_in_s']:.0f} s"
            in headline.group(5))
    assert ".. image:: docs/_static/figures/sessions.svg" in (ROOT / "README.rst").read_text()
