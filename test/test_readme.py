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
