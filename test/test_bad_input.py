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


def test_world_size_negative(bad):
    assert "NegativeWorldSize.world_size must be an integer >= 1, got -1" in bad.output


def test_world_size_as_string_of_an_int_works(bad):
    assert "test_x (__main__.StringWorldSize.test_x) ... ok" in bad.output


def test_spawn_never_called(bad):
    assert ("NeverSpawned.test_x started no rank processes: call self._spawn_processes() "
            "in setUp, after super().setUp()") in bad.output


def test_unknown_start_method(bad):
    assert ("BadStartMethod.start_method='teleport' is not a start method distspawn knows; "
            "use one of: spawn, fork, forkserver") in bad.output


@pytest.mark.parametrize("cls, kind", [("HugeWorldSize", "forkserver processes"),
                                       ("HugeReusedWorld", "forkserver processes"),
                                       ("HugeThreadedWorld", "threads")])
def test_world_size_beyond_the_machine_is_refused_before_any_rank_starts(bad, cls, kind):
    assert f"test_x (__main__.{cls}.test_x) ... ERROR" in bad.output
    line = next(l for l in bad.output.splitlines() if l.startswith(f"ValueError: {cls}."))
    assert f"is more ranks than this machine can run at once as {kind}: at most " in line
    assert "set DISTSPAWN_MAX_RANKS to the number this machine can take" in line


def test_the_rank_cap_can_be_set_and_is_checked(monkeypatch):
    from distspawn.engine.capacity import check_rank_capacity, rank_capacity

    monkeypatch.setenv("DISTSPAWN_MAX_RANKS", "3")
    assert rank_capacity("spawn") == (3, "DISTSPAWN_MAX_RANKS=3")
    check_rank_capacity(3, "spawn", "T.world_size")
    with pytest.raises(ValueError, match=r"T.world_size = 4 is more ranks .* at most 3 "
                                         r"\(DISTSPAWN_MAX_RANKS=3\)"):
        check_rank_capacity(4, "spawn", "T.world_size")
    monkeypatch.setenv("DISTSPAWN_MAX_RANKS", "lots")
    with pytest.raises(ValueError, match="DISTSPAWN_MAX_RANKS='lots' is not valid; "
                                         "expected an integer >= 1"):
        rank_capacity(None)


def test_hints_for_a_rank_that_cannot_start_appear_only_where_they_apply():
    import errno
    import pickle

    from distspawn.cases.multiprocess import start_failure_hint

    assert "defined at module level" in start_failure_hint(pickle.PicklingError("x"))
    out_of_fds = start_failure_hint(OSError(errno.EMFILE, "Too many open files"))
    assert "ran out of file descriptors" in out_of_fds
    assert "module level" not in out_of_fds
    assert "ran out of processes" in start_failure_hint(OSError(errno.EAGAIN, "again"))
    assert start_failure_hint(RuntimeError("something else")) == ""


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


def test_a_tmpdir_too_long_for_the_rank_servers_socket_is_named(tmp_path):
    # Where multiprocessing made its folder under it before the first rank,
    # the server's socket cannot go to /tmp (test_warm_ranks: where it can).
    run = run_python(["long_tmpdir.py", "-v"],
                     env={"LONG_TMPDIR_UNDER": str(tmp_path), "MP_FOLDER_FIRST": "1"})
    assert run.returncode == 1, run.output
    assert "test_x (__main__.LongTmpdir.test_x) ... ERROR" in run.output
    line = next(l for l in run.output.splitlines() if l.startswith("ValueError: TMPDIR="))
    assert "is too long for the rank server: its socket would be" in line
    assert ("a Unix socket path takes at most 107 (multiprocessing made its folder there "
            "before the first rank started, or /tmp is not writable). Set TMPDIR to a shorter "
            "directory, or DISTSPAWN_START_METHOD=spawn") in line
    assert "AF_UNIX path too long" not in run.output
    assert run.leftover_pids == []


@pytest.mark.parametrize("name, value, accepted", [
    ("TIMEOUT_DEFAULT", "600", "a positive number of seconds, such as 600"),
    ("TIMEOUT_DEFAULT", 0, "a positive number of seconds, such as 600"),
    ("TIMEOUT_OVERRIDE", ["test_x"], "a dict of test method name to seconds"),
])
def test_a_deadline_a_file_set_to_a_bad_value_is_named(monkeypatch, name, value, accepted):
    # As upstream's, distspawn's deadline reads the name a file rebinds.
    import distspawn.compat
    from distspawn.fixtures.environment import get_timeout

    monkeypatch.setattr(distspawn.compat, name, value)
    with pytest.raises(ValueError) as raised:
        get_timeout("mod.Cls.test_x")
    assert str(raised.value).startswith(f"distspawn.compat.{name} = {value!r}: expected {accepted}")


def test_a_bad_deadline_fails_before_any_rank_starts():
    run = run_python(["-c", """
import distspawn, distspawn.compat as cd
cd.TIMEOUT_DEFAULT = 'soon'
class Late(cd.MultiProcessTestCase):
    world_size = 2
    def setUp(self):
        super().setUp()
        self._spawn_processes()
    def test_x(self):
        print('RANK BODY RAN')
distspawn.run_tests()
""", "-v"])
    assert run.returncode == 1
    assert "distspawn.compat.TIMEOUT_DEFAULT = 'soon': expected a positive number" in run.output
    assert "RANK BODY RAN" not in run.output
    assert run.leftover_pids == []
