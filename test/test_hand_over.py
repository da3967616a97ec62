"""The rank server's hand-over trusts no one else on the machine.

The test process tells its rank server the test modules over a socket, and
the server reports back (``distspawn.early.rank_server_boot``, ``engine.server_report``).
Another process connects first, or a forged report arrives: the intruder is
told nothing, nothing it names is removed, nothing it sends fails a test.
"""

import json
import os
import pwd
import stat
import tempfile
from pathlib import Path

import pytest

from harness import SCENARIOS, is_torch_cache, run_python

from distspawn.engine import server_report

HAND_OVER = SCENARIOS / "hand_over"
PYTEST = ["-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "-p", "no:warnings"]


def _can_become_nobody():
    try:
        pwd.getpwnam("nobody")
    except KeyError:
        return False
    return os.getuid() == 0


INTRUDERS = ["stranger", "child",
             pytest.param("other-user", marks=pytest.mark.skipif(
                 not _can_become_nobody(), reason="needs root, to run a process as nobody"))]


@pytest.mark.parametrize("intruder", INTRUDERS)
def test_a_process_that_connects_before_the_server_is_told_nothing_and_the_test_passes(
        tmp_path, intruder):
    result, precious = tmp_path / "intruder.json", tmp_path / "precious"
    precious.mkdir()
    tmp_path.chmod(0o755)  # (for nobody, to reach nothing more than its result file)
    result.touch(mode=0o666)
    run = run_python([*PYTEST, "-p", "intruder", "test_victim.py"], cwd=HAND_OVER, env={
        "INTRUDER_AS": intruder, "INTRUDER_RESULT": str(result),
        "INTRUDER_FOLDER": str(precious), "VICTIM_RANKS": "preloaded"}, timeout=240)
    # The run went on with the real server: its ranks found the module loaded.
    assert run.returncode == 0 and "1 passed" in run.output, run.output
    outcome = json.loads(result.read_text())
    assert outcome["received"] == 0, outcome
    if intruder == "other-user":
        # The socket is in a folder only the user can enter.
        assert outcome == {"connected": False, "received": 0,
                           "ended": "connect: PermissionError"}
    else:
        assert outcome["connected"] and outcome["ended"] != "TimeoutError: timed out", outcome
        why = {"stranger": "a connection from a process this test process did not start",
               "child": "a connection without the rank server's secret"}[intruder]
        assert f"refused {why} (pid " in run.output, run.output
        assert run.output.count("to the rank server's hand-over") == 1, run.output
    assert precious.is_dir()
    assert run.leftover_pids == [] and run.leftover_files == []


def _forged_run(tmp_path, kind, kill, folders=()):
    env = {"FORGED_REPORT": kind, "FORGED_KILL": "1" if kill else "0",
           "VICTIM_RANKS": "imported" if kind == "malformed" else "preloaded",
           "FORGED_FOLDERS": os.pathsep.join(map(str, folders))}
    return run_python([*PYTEST, "-p", "forged_report", "test_victim.py"], cwd=HAND_OVER,
                      env=env, timeout=240)


def test_a_forged_report_has_nothing_removed_when_the_test_process_is_killed(tmp_path):
    # Named for removal, should the run be killed: a folder of the user's; one
    # named as tempfile.mkdtemp names them, outside the temp folder; one in
    # the temp folder, so named, but open to others; a link to the first. And
    # one folder that torch could have made: the watcher does remove that one.
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "work").write_text("kept")
    elsewhere = tmp_path / "tmpelsewher"
    elsewhere.mkdir(mode=0o700)
    temp_root = Path(tempfile.mkdtemp(dir=tmp_path))  # the run's TMPDIR
    temp_root.chmod(0o700)
    shared = temp_root / "tmpsharedd1"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    link = temp_root / "tmplinkedd2"
    link.symlink_to(precious)
    torchs = Path(tempfile.mkdtemp(dir=temp_root))
    env_folders = [precious, elsewhere, shared, link, torchs]
    run = run_python([*PYTEST, "-p", "forged_report", "test_victim.py"], cwd=HAND_OVER, env={
        "FORGED_REPORT": "folders", "FORGED_KILL": "1", "TMPDIR": str(temp_root),
        "VICTIM_RANKS": "preloaded",
        "FORGED_FOLDERS": os.pathsep.join(map(str, env_folders))}, timeout=240)
    assert "victim passed" in run.output and run.returncode == -9, run.output
    for path, why in [(precious, "not a name tempfile.mkdtemp gives"),
                      (elsewhere, f"not directly in the temp folder {temp_root}"),
                      (shared, "open to others (mode 755)"), (link, "not a folder")]:
        assert (f"the rank server named {str(path)!r} to be removed should the run be killed, "
                f"which is not a folder torch makes ({why}") in run.output, run.output
    assert (precious / "work").read_text() == "kept"
    assert elsewhere.is_dir() and shared.is_dir() and link.is_symlink()
    # The one torch could have made went, once the watcher saw the test process gone.
    assert run.leftover_pids == []
    assert not torchs.exists()


def test_a_malformed_report_fails_no_test_and_ranks_start_afresh(tmp_path):
    run = _forged_run(tmp_path, "malformed", kill=False)
    assert run.returncode == 0 and "1 passed" in run.output, run.output
    said = ("the rank server's report was not of its shape (field 'modules' is not of its "
            "type: []), so none of it is used; ranks start afresh (spawn) for the rest of "
            "the run")
    assert run.output.count(said) == 1, run.output
    assert run.leftover_pids == [] and run.leftover_files == []


REAL_REPORT = {"preload": {"TORCH_HOME": [None, None]}, "preload_failures": {},
               "modules": {"test_x": {"X": ["1", "1"]}}, "refused": {"test_y": "a thread"},
               "switch": True, "exit_folders": []}


@pytest.mark.parametrize("change, why", [
    ({"modules": []}, "field 'modules' is not of its type: []"),
    ({"preload": {"A": "1"}}, "field 'preload' is not of its type"),
    ({"modules": {"m": {"A": [1, "1"]}}}, "field 'modules' is not of its type"),
    ({"switch": "yes"}, "field 'switch' is not of its type"),
    ({"exit_folders": "/home"}, "field 'exit_folders' is not of its type"),
    ({"run": "rm -rf"}, "unknown fields: 'run'"),
])
def test_a_report_field_of_another_shape_refuses_the_whole_report(change, why):
    with pytest.raises(server_report.MalformedReport, match="^" + why.replace("[", r"\[")
                       .replace("]", r"\]")):
        server_report.parse_report(json.dumps({**REAL_REPORT, **change}).encode())


@pytest.mark.parametrize("data, why", [(b"[1]\n", "a list, not an object"),
                                       (b"{\n", "not JSON"),
                                       (b'{"switch": true}\n', "fields missing: exit_folders")])
def test_a_report_that_is_no_report_is_refused(data, why):
    with pytest.raises(server_report.MalformedReport, match=why):
        server_report.parse_report(data)


def test_the_servers_real_report_shape_is_accepted():
    assert server_report.parse_report(json.dumps(REAL_REPORT).encode()) == REAL_REPORT


def test_only_a_private_mkdtemp_folder_of_the_users_in_the_temp_folder_may_be_removed(tmp_path):
    made = tempfile.mkdtemp()
    try:
        assert server_report.exit_folder_refusal(made) is None
        assert server_report.exit_folder_refusal(made + "/../" + os.path.basename(made)) \
            == "not an absolute, normal path"
        assert server_report.exit_folder_refusal(str(tmp_path)) is not None
        assert server_report.exit_folder_refusal(os.path.join(tempfile.gettempdir(), "home")) \
            == "not a name tempfile.mkdtemp gives"
        os.chmod(made, 0o750)
        assert server_report.exit_folder_refusal(made) == "open to others (mode 750)"
    finally:
        os.rmdir(made)
    assert server_report.exit_folder_refusal(made).startswith("cannot be looked at")


def test_the_hand_over_lives_in_a_folder_only_the_user_can_enter():
    import distspawn.early.rank_server_boot as distspawn_rank_server

    folder = distspawn_rank_server.private_folder()
    info = os.stat(folder)
    assert info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) == 0o700


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one process", "xdist"])
def test_everything_a_run_makes_in_the_temp_folder_is_closed_to_other_users(tmp_path, workers):
    # Checked from a rank while the test runs, on the fresh and reused tiers;
    # under xdist, the run's folder and the worker's private TMPDIR too.
    root = Path(tempfile.mkdtemp(dir=tmp_path))
    run = run_python([*PYTEST, *workers, "test_temp_folder_audit.py"], cwd=HAND_OVER,
                     env={"TMPDIR": str(root), "AUDIT_ROOT": str(root)}, timeout=240)
    assert run.returncode == 0 and "2 passed" in run.output, run.output
    assert run.leftover_pids == []
    # (pytest's own basetemp, pytest-of-<user>, is made by xdist's workers)
    assert [p for p in root.iterdir() if not is_torch_cache(p.relative_to(root))
            and not p.name.startswith("pytest-of-")] == []
