"""The same verdicts whichever way a test file is run (python file, unittest, pytest)."""

import pytest

from harness import run_python

STYLES = {
    "python file": lambda name: ["styles.py", "-v", f"Styles.{name}"],
    "python -m unittest": lambda name: ["-m", "unittest", "-v", f"styles.Styles.{name}"],
    "pytest node id": lambda name: ["-m", "pytest", "-p", "no:cacheprovider",
                                    f"styles.py::Styles::{name}"],
}


@pytest.mark.parametrize("style", STYLES)
def test_passing_test_passes(style):
    run = run_python(STYLES[style]("test_ok"))
    assert run.returncode == 0, run.output
    assert run.leftover_files == [] and run.leftover_pids == []


@pytest.mark.parametrize("style", STYLES)
def test_failing_test_fails_with_rank_and_rerun_command(style):
    run = run_python(STYLES[style]("test_bad"))
    assert run.returncode == 1, run.output
    assert "1 of 2 ranks failed (rank 1)" in run.output
    assert "only rank 0 is right" in run.output
    expected_rerun = {
        "python file": "python styles.py Styles.test_bad",
        "python -m unittest": "python -m unittest styles.Styles.test_bad",
        "pytest node id": "python -m pytest 'styles.py::Styles::test_bad'",
    }[style]
    assert "Re-run just this test:" in run.output
    assert expected_rerun in run.output
    assert run.leftover_files == [] and run.leftover_pids == []


def test_whole_file_via_run_tests_exits_nonzero_when_one_fails():
    run = run_python(["styles.py"])
    assert run.returncode == 1
    assert "Ran 2 tests" in run.output and "FAILED (failures=1)" in run.output


def test_run_tests_accepts_upstream_flags():
    run = run_python(["styles.py", "--accept", "--repeat", "1", "--log-suffix", "x",
                      "Styles.test_ok"])
    assert run.returncode == 0, run.output
