"""README.rst must stay true: its commands are the ones CI runs."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ci_runs_the_test_command_written_in_the_readme():
    readme = (ROOT / "README.rst").read_text()
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    test_command = ci_lines[-1]
    assert test_command == "python -m pytest test -q"
    assert f"\n    {test_command}\n" in readme


def test_readme_quick_start_installs_pinned_torch_then_runs_the_examples():
    readme = (ROOT / "README.rst").read_text()
    assert '    pip install torch==2.13.0 && pip install -e ".[test]"\n' in readme
    assert "    python -m pytest examples\n" in readme
    assert (ROOT / "examples" / "test_allreduce.py").exists()
