"""TestDistBackend and the BACKEND / WORLD_SIZE / TEMP_DIR contract, run as a user would."""

import os
import tempfile
from pathlib import Path

import pytest
import torch

from distspawn.fixtures.skips import gpu_count_skip
from harness import run_python, scenario_verdicts

TEST_DIR = Path(__file__).parent
FAST = {"DISTSPAWN_START_METHOD": "fork"}  # same verdicts, a fraction of the start-up


def suite_env(temp_dir, backend="gloo", world_size="2"):
    return {**FAST, "BACKEND": backend, "WORLD_SIZE": world_size, "TEMP_DIR": temp_dir}


@pytest.fixture(scope="module")
def temp_dir():
    with tempfile.TemporaryDirectory() as path:
        yield path


@pytest.fixture(scope="module")
def gloo_run(temp_dir):
    return run_python(["backend_suite.py", "-v"], env=suite_env(temp_dir))


def test_gloo_suite_verdicts(gloo_run):
    assert gloo_run.returncode == 1, gloo_run.output  # one test fails on purpose
    for name in ("test_world_matches_env", "test_all_reduce"):
        assert gloo_run.verdict_line(name).endswith("... ok")
    assert gloo_run.verdict_line("test_fails_on_rank1").endswith("FAIL")
    report = gloo_run.report("test_fails_on_rank1")
    assert "1 of 2 ranks failed (rank 1)" in report
    assert "rank 1 reports a wrong value" in report


def test_skips_keep_their_reasons(gloo_run):
    assert "skipped 'Test requires world size of 64'" in gloo_run.verdict_line(
        "test_needs_64_ranks")
    assert "Test requires backend gloo to be one of ['mpi']" in gloo_run.verdict_line(
        "test_mpi_only")
    assert "not on this backend, by design" in gloo_run.verdict_line("test_skip_everywhere")


def test_ddp_has_finalized_exit_code_is_not_judged(gloo_run):
    assert gloo_run.verdict_line("test_ddp_has_finalized").endswith("... ok")


def test_suite_leaves_nothing_behind(gloo_run, temp_dir):
    assert gloo_run.leftover_files == []
    assert gloo_run.leftover_pids == []
    assert os.listdir(temp_dir) == []  # each test made and removed its own tree


@pytest.mark.parametrize("backend", ["nccl", "ucc", "mpi"])
def test_unavailable_backend_skips_with_reason(temp_dir, backend):
    run = run_python(["backend_suite.py", "-v", "-k", "test_all_reduce"],
                     env=suite_env(temp_dir, backend=backend))
    assert run.returncode == 0, run.output
    line = run.verdict_line("test_all_reduce")
    assert "skipped" in line
    # No CUDA, or no build of the backend: either way the user reads which.
    reasons = [f"BACKEND={backend}", "CUDA is not available"]
    if backend == "nccl" and torch.distributed.is_nccl_available() and torch.cuda.is_available():
        if torch.cuda.device_count() >= 2:
            pytest.skip("nccl can run 2 ranks here: nothing is unavailable")
        reasons = [gpu_count_skip(2).message]  # one GPU: too few for the 2 ranks
    assert any(reason in line for reason in reasons), line


@pytest.mark.parametrize("env, expected", [
    ({}, ["BACKEND is not set", "WORLD_SIZE is not set", "TEMP_DIR is not set"]),
    ({"BACKEND": "foo", "WORLD_SIZE": "2"}, ["BACKEND='foo' is not a known backend"]),
    ({"BACKEND": "gloo", "WORLD_SIZE": "two"}, ["WORLD_SIZE='two' is not an integer"]),
    ({"BACKEND": "gloo", "WORLD_SIZE": "1"}, ["WORLD_SIZE='1' is too small"]),
    ({"BACKEND": "gloo", "WORLD_SIZE": "2", "TEMP_DIR": "/no/such/dir"},
     ["TEMP_DIR='/no/such/dir' is not an existing directory"]),
])
def test_bad_env_fails_with_one_clear_message(env, expected, temp_dir):
    env = {"TEMP_DIR": temp_dir, **env} if env else {}
    clean = {key: "" for key in ("BACKEND", "WORLD_SIZE", "TEMP_DIR") if key not in env}
    run = run_python(["backend_suite.py"], env={**clean, **env})
    assert run.returncode != 0
    for text in expected:
        assert text in run.output
    assert "For example:" in run.output
    assert "Ran 0 tests" in run.output  # refused before any rank started


def test_entry_file_runs_the_conformance_suite(temp_dir):
    # A few tests of it, run as a script: test_matrix.py runs the whole of it.
    run = run_python([str(TEST_DIR / "test_distributed_spawn.py"), "-v",
                      "-k", "all_reduce_sum_world", "-k", "new_group_all_reduce",
                      "-k", "get_rank"],
                     env=suite_env(temp_dir, world_size="3"))
    assert run.returncode == 0, run.output
    assert run.verdict_line("test_new_group_all_reduce").endswith("... ok")
    assert run.verdict_line("test_get_rank").endswith("... ok")
    assert run.leftover_pids == []


@pytest.mark.parametrize("env, expected", [
    ({"BACKEND": "", "WORLD_SIZE": "", "TEMP_DIR": ""}, "BACKEND is not set"),
    ({"BACKEND": "mpi", "WORLD_SIZE": "2"}, "BACKEND='mpi' is not a known backend; "
                                             "expected one of: gloo, nccl, ucc"),
])
def test_entry_file_refuses_bad_env_nonzero(env, expected, temp_dir):
    run = run_python([str(TEST_DIR / "test_distributed_spawn.py")],
                     env={"TEMP_DIR": temp_dir, **env})
    assert run.returncode == 1
    assert expected in run.output
    assert "Traceback" not in run.output


def suite_verdicts(temp_dir, start_method):
    env = {**suite_env(temp_dir), "DISTSPAWN_START_METHOD": start_method}
    found, run = scenario_verdicts("backend_suite", env)
    assert run.leftover_pids == []
    return found


def test_every_start_method_gives_the_same_verdicts(temp_dir):
    # forkserver ranks are forked from a long-lived server: they must still see
    # the TEMP_DIR each test exports, and must not mistake the server for a dead parent.
    reference = suite_verdicts(temp_dir, "spawn")
    assert reference["TestSuiteWithBackend.test_all_reduce"] == "pass"
    assert reference["TestSuiteWithBackend.test_fails_on_rank1"] == "fail"
    for method in ("fork", "forkserver"):
        assert suite_verdicts(temp_dir, method) == reference, method
