"""Mistakes get one clear message naming the value and what is accepted (DESIGN.md 8)."""

import pytest

from harness import run_python


@pytest.fixture(scope="module")
def bad():
    return run_python(["bad_input.py", "-v"])


def test_run_fails_overall(bad):
    assert bad.returncode == 1
    assert bad.leftover_files == [] and bad.leftover_pids == []


def test_world_size_word(bad):
    report = bad.report("test_x")  # first class alphabetically: BadStartMethod, see below
    assert report  # sanity: reports exist
    assert ("WordWorldSize.world_size must be an integer >= 1 (or a string holding one), "
            "got 'two'") in bad.output


def test_world_size_zero(bad):
    assert "ZeroWorldSize.world_size must be an integer >= 1, got 0" in bad.output


def test_world_size_as_string_of_an_int_works(bad):
    assert "test_x (__main__.StringWorldSize.test_x) ... ok" in bad.output


def test_spawn_never_called(bad):
    assert ("NeverSpawned.test_x started no rank processes: call self._spawn_processes() "
            "in setUp, after super().setUp()") in bad.output


def test_unknown_start_method(bad):
    assert ("BadStartMethod.start_method='teleport' is not a start method distspawn knows; "
            "use one of: spawn, fork, forkserver") in bad.output


def test_test_name_that_does_not_exist():
    run = run_python(["bad_input.py", "StringWorldSize.test_nope"])
    assert run.returncode != 0
    assert "test_nope" in run.output


def test_constructing_with_a_missing_method_names_it():
    from distspawn import MultiProcessTestCase

    class Local(MultiProcessTestCase):
        def test_real(self):
            pass

    with pytest.raises(ValueError, match="no such test method .*: test_missing"):
        Local("test_missing")
    with pytest.raises(ValueError, match="no such test method .*: test_missing"):
        Local(methodName="test_missing")
