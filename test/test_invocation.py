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


def test_python_m_distspawn_version_names_distspawn_torch_and_python():
    import platform

    import torch

    import distspawn

    run = run_python(["-m", "distspawn", "--version"])
    assert run.returncode == 0, run.output
    assert run.output.strip() == (f"distspawn {distspawn.__version__} (torch {torch.__version__}, "
                                  f"Python {platform.python_version()})")


def test_pytest_header_says_distspawn_is_on_how_ranks_start_and_whether_it_stands_in():
    from importlib import metadata

    version = metadata.version("distspawn")
    plain = run_python(["-m", "pytest", "--co", "-p", "no:cacheprovider", "upstream_style.py"])
    assert (f"distspawn {version}: rank processes start by forkserver, stand-in mode off"
            in plain.output), plain.output
    stand_in = run_python(["-m", "pytest", "--co", "-p", "no:cacheprovider", "upstream_style.py"],
                          env={"DISTSPAWN_START_METHOD": "spawn", "DISTSPAWN_STAND_IN": "1"})
    assert (f"distspawn {version}: rank processes start by spawn, stand-in mode on"
            in stand_in.output), stand_in.output
