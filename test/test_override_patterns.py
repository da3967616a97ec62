"""Upstream's override points and failure types, beside upstream's harness.

scenarios/override_patterns.py overrides _start_processes, _run, run_test,
_join_processes and _check_return_codes the way downstream suites do, extends
TEST_SKIPS, and wraps failing threaded tests in assertRaises(RuntimeError).
It runs once on distspawn and, where torch.testing._internal imports, once on
upstream's harness: the verdicts must agree.
"""


import re

import pytest

from harness import (
    run_python,
    run_python_on_upstream,
    scenario_verdicts,
    skip_unless_upstream_runs,
    upstream_lacks,
    upstream_module_imports,
)

LICENCE_SKIP = "skip: needs the project's licence server"
EXPECTED = {
    "OwnStartProcesses.test_all_reduce": "pass",
    "OwnStartProcesses.test_rank1_raises": "fail",
    "OwnStartProcesses.test_project_skip": LICENCE_SKIP,
    "OwnStartProcesses.test_rank0_hangs": "fail",
    "OwnRun.test_own_run_was_used": "pass",
    "OwnRun.test_own_run_then_failure": "fail",
    "OwnRunTest.test_run_test_was_used": "pass",
    "OwnJoin.test_join_then_pass": "pass",
    "OwnJoin.test_join_then_fail": "fail",
    "OwnReturnCodeCheck.test_expected_to_fail": "pass",
    "OwnReturnCodeCheck.test_plain_pass": "pass",
    "ProcessFailureCaught.test_rank0_raises": "pass",
    "WrappedThreadedFailures.test_runtime_error_is_caught": "pass",
    "WrappedThreadedFailures.test_runtime_error_carries_the_message": "pass",
    "WrappedThreadedFailures.test_upstream_thread_words": "pass",
    "ThreadedProjectSkip.test_project_skip": LICENCE_SKIP,
    "ReusedProjectSkip.test_project_skip": LICENCE_SKIP,
    "ReusedProjectSkip.test_after_the_skip": "pass",
}


def upstream_harness_imports() -> bool:
    return upstream_module_imports("torch.testing._internal.common_distributed")


needs_upstream = pytest.mark.skipif(
    not upstream_harness_imports(),
    reason="torch.testing._internal does not import here (it needs expecttest)")


@pytest.fixture(scope="module")
def ours():
    return run_python(["-m", "unittest", "-v", "override_patterns"])


def verdicts_of(run) -> dict:
    found = {}
    for line in run.output.splitlines():
        if " ... " not in line or not line.startswith("test_"):
            continue
        name, rest = line.split(" ... ", 1)
        test = name.split(" (", 1)[1].rstrip(")").split(".", 1)[1]
        verdict = {"ok": "pass", "FAIL": "fail", "ERROR": "error"}.get(rest.strip())
        found[test] = verdict or "skip: " + rest.split("skipped ", 1)[1].strip("'\"")
    return found


def kind(verdict: str) -> str:
    # Upstream reports a rank's failure as an ERROR (its RuntimeError escapes the
    # test); distspawn's is an AssertionError too, so unittest says FAIL.
    return {"error": "fail"}.get(verdict, verdict)


def test_distspawn_gives_the_expected_verdicts(ours):
    assert verdicts_of(ours) == EXPECTED, ours.output
    assert ours.leftover_files == [] and ours.leftover_pids == []


@needs_upstream
def test_upstream_gives_the_same_verdicts():
    skip_unless_upstream_runs("override_patterns.py")  # MultiProcContinuousTest: 2.9 on
    upstream, _ = scenario_verdicts("override_patterns", {"UPSTREAM_HARNESS": "1"})
    assert {t: kind(v) for t, v in upstream.items()} == EXPECTED


def test_own_start_processes_failure_names_the_rank_with_traceback_and_upstream_words(ours):
    report = ours.report("test_rank1_raises")
    assert "rank 1: raised an exception" in report
    assert "Process 1 exited with error code 10 and exception:" in report
    assert 'raise ValueError("rank 1 cannot go on")' in report


def test_own_start_processes_hang_shows_the_stack_taken_over_the_pipe(ours):
    report = ours.report("test_rank0_hangs")
    assert "rank 0: did not finish before the deadline" in report
    assert "in hang_here" in report and "in test_rank0_hangs" in report


def test_skip_reasons_come_from_the_live_table(ours):
    # The entry is added after distspawn was imported: read live, on every tier.
    for test in ("OwnStartProcesses", "ThreadedProjectSkip", "ReusedProjectSkip"):
        assert verdicts_of(ours)[f"{test}.test_project_skip"] == LICENCE_SKIP


def test_harness_failures_are_assertion_and_runtime_errors():
    from distspawn import RankFailure

    assert issubclass(RankFailure, AssertionError) and issubclass(RankFailure, RuntimeError)


def stop_suite(upstream: bool, stop_after: str):
    env = {"UPSTREAM_HARNESS": "1" if upstream else "0", "STOP_AFTER": stop_after}
    run = (run_python_on_upstream if upstream else run_python)(["stop_suite.py", "-v"], env=env)
    ran = [line.split(" (", 1)[0] for line in run.output.splitlines() if " ... " in line]
    return ran, "TEST C RAN" in run.output, run.returncode


@pytest.mark.parametrize("stop_after", ["test_a_fails", "test_b_passes", "never"])
def test_should_stop_test_suite_is_consulted_as_upstream_does(stop_after):
    ran, c_ran, code = stop_suite(False, stop_after)
    expected = {"test_a_fails": ["test_fails", "test_a_fails"],
                "test_b_passes": ["test_fails", "test_a_fails", "test_b_passes"],
                "never": ["test_fails", "test_a_fails", "test_b_passes",
                          "test_c_runs_unless_stopped"]}[stop_after]
    assert ran == expected and c_ran == (stop_after == "never") and code == 1
    if upstream_harness_imports():
        assert stop_suite(True, stop_after) == (ran, c_ran, code)


def run_scenario_as(harness, script, env=None):
    """``script -v`` on distspawn, on upstream's harness, or unchanged in the stand-in mode."""
    if harness != "distspawn" and not upstream_harness_imports():
        pytest.skip("torch.testing._internal does not import here")
    env = {"UPSTREAM_HARNESS": "0" if harness == "distspawn" else "1", **(env or {})}
    runner = ["-m", "distspawn.stand_in"] if harness == "stand-in" else []
    run = run_python_on_upstream if harness == "upstream" else run_python
    return run([*runner, script, "-v"], env=env)


@pytest.mark.parametrize("harness, shared, verdict", [
    ("distspawn", None, "FAIL"), ("distspawn", "1", "ok"), ("upstream", None, "ok"),
    # run unchanged, a file gets upstream's verdict: the threads share a generator
    # (and a failure is upstream's RuntimeError: unittest says ERROR)
    ("stand-in", None, "ok"), ("stand-in", "0", "ERROR")])
def test_shared_thread_generator_is_one_switch_away(harness, shared, verdict):
    run = run_scenario_as(harness, "shared_rng.py",
                          {"DISTSPAWN_SHARED_THREAD_RNG": shared} if shared else None)
    assert run.verdict_line("test_ranks_draw_different_numbers").endswith(verdict), run.output
    if verdict != "ok":
        report = run.report("test_ranks_draw_different_numbers")
        assert "per_thread_rng = False" in report and "DISTSPAWN_SHARED_THREAD_RNG=1" in report


def test_a_bad_shared_generator_setting_is_one_clear_error():
    run = run_python(["shared_rng.py"], env={"DISTSPAWN_SHARED_THREAD_RNG": "maybe"})
    assert run.returncode != 0
    assert "DISTSPAWN_SHARED_THREAD_RNG='maybe': expected 1" in run.output


THREADED_TESTS = ("test_body_that_would_fail", "test_expects_the_ranks_assertion_error",
                  "test_expects_a_runtime_error")


@pytest.mark.parametrize("harness, failing", [
    # distspawn fails a test whose rank threads never started, and its failure
    # is an AssertionError as well as upstream's RuntimeError ...
    ("distspawn", {"test_body_that_would_fail"}),
    # ... while upstream passes the first without running it and raises a
    # plain RuntimeError; run unchanged, a file gets upstream's verdicts.
    ("upstream", {"test_expects_the_ranks_assertion_error"}),
    ("stand-in", {"test_expects_the_ranks_assertion_error"})])
def test_threaded_verdicts_that_differ_from_upstreams_on_purpose(harness, failing):
    run = run_scenario_as(harness, "threaded_upstream_verdicts.py")
    assert "Ran 3 tests" in run.output, run.output
    assert {test for test in THREADED_TESTS
            if re.search(rf"^(ERROR|FAIL): {test} ", run.output, re.M)} == failing, run.output
    if harness == "distspawn":
        assert "no threaded world is running: call self._spawn_threads()" in run.output
    if harness == "stand-in":
        assert ("NeverStartsThreads.test_body_that_would_fail passed without running its "
                "body") in run.output
    assert run.leftover_pids == []


@pytest.mark.parametrize("harness, verdict", [
    # Rank processes never started (setUp never called _spawn_processes):
    # upstream's harness passes without running the body; distspawn fails,
    # saying how to start them; run unchanged, a file gets upstream's pass.
    ("distspawn", "ERROR"), ("upstream", "ok"), ("stand-in", "ok")])
def test_rank_processes_never_started(harness, verdict):
    run = run_scenario_as(harness, "never_started_ranks.py")
    assert "Ran 2 tests" in run.output, run.output
    for test in ("test_guarded_by_a_gpu_count", "test_body_that_would_fail"):
        assert run.verdict_line(test).endswith(verdict), run.output
        name = f"NeverStartsProcesses.{test}"
        if harness == "distspawn":
            assert (f"{name} started no rank processes: call self._spawn_processes() in "
                    "setUp") in run.output
        if harness == "stand-in":
            assert (f"{name} passed without running its body: no rank processes were "
                    "started") in run.output
    assert "the body ran" not in run.output
    assert run.leftover_pids == []


@pytest.mark.parametrize("harness", ["distspawn", "upstream", "stand-in"])
def test_dynamos_bases_without_an_accelerator(harness):
    from distspawn.fixtures.device_probe import accelerator_type

    if accelerator_type() is not None:
        pytest.skip("this machine has an accelerator: every harness runs both classes")
    run = run_scenario_as(harness, "dynamo_bases.py")
    single_failed = re.search(r"^ERROR: setUpClass \(\S*SingleProc\)", run.output, re.M)
    if harness == "distspawn":
        # The CPU with gloo for the one-process class; no ranks for the other: a skip.
        assert run.verdict_line("test_world_of_one").endswith("ok"), run.output
        assert not single_failed, run.output
        for test in ("test_on_two_gpus", "test_on_every_accelerator"):
            assert ("MultiProc runs one rank per accelerator and torch.accelerator found "
                    "none") in run.verdict_line(test), run.output
    else:
        # Upstream's verdicts: setUpClass fails; a world of 0 passes unrun.
        assert single_failed, run.output
        for test in ("test_on_two_gpus", "test_on_every_accelerator"):
            assert run.verdict_line(test).endswith("ok"), run.output
    if harness == "stand-in":
        assert ("SingleProc needs an accelerator: upstream's DynamoDistributedSingleProcTestCase "
                "fails in setUpClass without one") in run.output
        assert "MultiProc.world_size is 0: no rank was started" in run.output
    assert "the body ran" not in run.output
    assert run.leftover_pids == []


@pytest.mark.parametrize("harness", ["distspawn", "upstream", "stand-in"])
def test_per_device_classes_on_rank_threads(harness):
    # instantiate_device_type_tests keeps a class's precision in a thread-local:
    # each rank thread gets its own (pytorch's DTensor op tests need it).
    run = run_scenario_as(harness, "device_type_threads.py")
    assert "Ran 3 tests" in run.output, run.output
    for test in ("test_all_reduce_cpu", "test_precision_override_cpu_float32",
                 "test_rank_sees_its_world_cpu"):
        assert run.verdict_line(test).endswith("ok"), run.output
    assert run.leftover_pids == []


EMPTY_WORLD_TESTS = {"RankProcesses": "test_on_rank_processes", "FSDPOnGPUs": "test_fsdp_on_gpus",
                     "DTensorOnGPUs": "test_dtensor_on_gpus", "RankThreads": "test_on_rank_threads",
                     "ReusedRanks": "test_on_reused_ranks"}


@pytest.mark.parametrize("harness, verdict", [
    # A world size of 0 (a class sizing its world from the GPUs, on a machine
    # without): upstream's harness starts no rank and passes; distspawn skips,
    # saying why; run unchanged, a file gets upstream's pass, with a warning.
    ("distspawn", "skipped"), ("upstream", "ok"), ("stand-in", "ok")])
def test_a_world_of_no_ranks(harness, verdict):
    run = run_scenario_as(harness, "empty_world.py")
    tests = dict(EMPTY_WORLD_TESTS)
    if harness != "distspawn" and upstream_lacks(
            "torch.testing._internal.common_distributed", ("MultiProcContinuousTest",)):
        del tests["ReusedRanks"]  # torch 2.8
    assert f"Ran {len(tests) + 1} tests" in run.output, run.output
    for owner, test in tests.items():
        line = run.verdict_line(test)
        assert line.split(" ... ")[-1].startswith(verdict), run.output
        if harness == "distspawn":
            assert (f"{owner}.world_size is 0: there is no rank to run the test on "
                    "(upstream's harness passes such a test without running it)") in line
        if harness == "stand-in":
            assert (f"{owner}.world_size is 0: no rank was started and the test passed "
                    "without running") in run.output
    # A fixed world still runs its ranks, on every harness.
    assert re.search(r"^(FAIL|ERROR): test_ranks_run ", run.output, re.M), run.output
    assert "the body ran" not in run.output
    assert run.leftover_pids == []


DISAGREEING = {
    # test: (distspawn's verdict, upstream's verdict)
    "OnProcesses.test_rank_1_skips": ("FAIL", "ok"),  # upstream reads rank 0's exit code
    "OnProcesses.test_rank_0_skips": ("FAIL", "skipped"),
    "OnThreads.test_rank_2_skips": ("FAIL", "skipped"),  # any rank's skip skips it
    "OnReusedRanks.test_rank_1_skips": ("FAIL", "skipped"),
    # Deliberate, in the stand-in mode too: upstream never reads rank 1's code.
    "OnProcesses.test_rank_1_exits_with_3": ("FAIL", "ok"),
}


@pytest.mark.parametrize("harness", ["distspawn", "upstream", "stand-in"])
def test_ranks_that_disagree_about_skipping(harness):
    # distspawn fails the test, naming who skipped; upstream's harness has a
    # rule per kind of rank, and a file run unchanged gets it.
    import torch

    run = run_scenario_as(harness, "ranks_disagree_on_skipping.py")
    assert "Ran 5 tests" in run.output, run.output
    for test, (ours, upstreams) in DISAGREEING.items():
        expected = ours if harness == "distspawn" else upstreams
        if test.endswith("exits_with_3") and harness == "stand-in":
            expected = ours
        if (test.startswith("OnReusedRanks") and harness == "upstream"
                and torch.__version__ < (2, 13)):
            continue  # torch 2.8's reused ranks raise the skip's SystemExit: an error
        method = test.split(".")[1]
        verdict = run.verdict_line(f"{method} (__main__.{test})").split(" ... ")[-1]
        assert verdict.startswith(expected), (test, run.output)
    if harness == "distspawn":
        assert ("ranks disagree: 1 of 3 ranks skipped while ranks 0, 1 ran the test:\n"
                "rank 2 skipped: rank 2 has no use for it") in run.output
        assert "set lenient_skips = True on the class for upstream's rule" in run.output
    if harness != "upstream":
        assert "rank 1: called sys.exit(3)" in run.output
    assert run.leftover_pids == []


@pytest.mark.parametrize("harness, too_slow", [
    ("distspawn", "FAIL"), ("upstream", "ERROR"), ("stand-in", "FAIL")])
def test_a_file_moves_the_deadline_by_rebinding_the_modules_name(harness, too_slow):
    # The environment says 2 s; the file says 60 s, and 3 s for one test by name.
    run = run_scenario_as(harness, "rebound_deadline.py",
                          {"DISTRIBUTED_TESTS_DEFAULT_TIMEOUT": "2"})
    assert run.verdict_line("test_rank_0_takes_longer_than_the_old_default").endswith("ok"), \
        run.output
    assert run.verdict_line("test_rank_0_outlives_its_deadline").endswith(too_slow), run.output
    if harness != "upstream":
        assert "test_rank_0_outlives_its_deadline failed after" in run.output
        assert "(deadline 3s)" in run.output
    assert run.leftover_pids == []
