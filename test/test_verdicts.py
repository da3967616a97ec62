"""The verdict and the message a user sees for every fault case (DESIGN.md section 4).

scenarios/faults.py holds one test per case; it runs once, in a subprocess, and
each test here reads its own case from that run.
"""

import re

import pytest
import torch

from distspawn.engine.cuda_refusal import nvidia_driver_present
from harness import run_python, needs_gpus


@pytest.fixture(scope="module")
def faults():
    return run_python(["faults.py", "-v"])


def test_run_exits_nonzero_and_leaves_nothing_behind(faults):
    assert faults.returncode == 1, faults.output
    assert faults.leftover_files == []
    assert faults.leftover_pids == []


def test_pass(faults):
    assert faults.verdict_line("test_pass").endswith("... ok")


def test_assertion_on_rank1_names_rank_and_shows_traceback_and_output(faults):
    assert faults.verdict_line("test_assertion_on_rank1").endswith("FAIL")
    report = faults.report("test_assertion_on_rank1")
    assert "1 of 2 ranks failed (rank 1)" in report
    assert "rank 1: raised an exception" in report
    assert "rank one disagrees" in report  # the user's msg
    assert "[rank 1] about to compare on rank 1" in report  # output tail, labelled
    assert "[rank 0]" not in report  # a passing rank's output is not noise in the report


def test_exception_on_rank0_ends_the_others_early(faults):
    report = faults.report("test_exception_on_rank0")
    assert "rank 0: raised an exception" in report
    assert "ValueError: boom on rank zero" in report
    assert "rank 1: still running when the failure was known; ended by distspawn" in report
    elapsed = float(re.search(r"failed after ([\d.]+)s", report).group(1))
    assert elapsed < 30, "rank 1 sleeps 60 s; the wait must end soon after rank 0 failed"


def test_sigsegv_is_named_by_signal(faults):
    report = faults.report("test_sigsegv_on_rank1")
    assert "rank 1: crashed with SIGSEGV (exit code -11)" in report
    # The crash leads: the Python line it died on, then its own last output,
    # then torch's native frames, cut short.
    stack = report.index("line 41 in test_sigsegv_on_rank1")
    tail = report.index("[rank 1] rank 1 reached the crash site")
    native = report.index("native frames (trimmed):")
    assert "its Python stack when it crashed:" in report
    assert stack < tail < native, report
    assert report.count("frame #") <= 10, report
    elapsed = float(re.search(r"failed after ([\d.]+)s", report).group(1))
    assert elapsed < 30


def test_sigkill_is_named_by_signal(faults):
    report = faults.report("test_sigkill_on_rank0")
    assert "rank 0: crashed with SIGKILL (exit code -9)" in report


def test_sys_exit_with_unexpected_code_fails(faults):
    report = faults.report("test_sys_exit_3_on_rank1")
    assert "rank 1: called sys.exit(3)" in report


def test_sys_exit_is_judged_by_its_code_even_when_the_rank_is_slow_to_go(faults):
    report = faults.report("test_sys_exit_3_then_slow_exit")
    assert "rank 1: called sys.exit(3)" in report
    assert "ended by distspawn" not in report.split("rank 1: called")[1].split("\n")[0]


def test_os_exit_0_mid_test_is_not_a_pass(faults):
    report = faults.report("test_os_exit_0_mid_test")
    assert "rank 0: ended without reporting a result (exit code 0)" in report


def test_skip_on_all_ranks_keeps_the_reason(faults):
    assert faults.verdict_line("test_skip_on_all_ranks").endswith(
        "skipped 'no widgets on this machine'")


def test_skip_on_one_rank_fails_saying_who_and_why(faults):
    report = faults.report("test_skip_on_rank1_only")
    assert "ranks disagree: 1 of 2 ranks skipped while rank 0 ran the test" in report
    assert "rank 1 skipped: rank one lacks a widget" in report


def test_skip_decorator_exit_code_maps_to_its_message(faults):
    assert faults.verdict_line("test_skip_decorator_exit_code").endswith(
        f"skipped '{needs_gpus(2)}'")


def test_hang_puts_every_live_ranks_stack_in_the_message(faults):
    report = faults.report("test_hang_on_rank0")
    assert "(deadline 8s)" in report
    assert "rank 0: did not finish before the deadline" in report
    assert "rank 1: did not finish before the deadline" in report
    stacks = report.split("rank 1: did not finish")
    # rank 0 is stuck in native code holding the GIL and still yields a stack
    assert "in test_hang_on_rank0" in stacks[0]
    assert "in test_hang_on_rank0" in stacks[1]
    assert "Current thread" in stacks[0] and "_event_listener" in stacks[0]
    elapsed = float(re.search(r"failed after ([\d.]+)s", report).group(1))
    assert 8 <= elapsed < 20


def test_every_failure_ends_with_a_rerun_command(faults):
    for name in ("test_assertion_on_rank1", "test_sigkill_on_rank0", "test_hang_on_rank0"):
        assert f"Re-run just this test:\n  python faults.py Faults.{name}" in faults.report(name)


def test_skip_return_code_checks_ignores_exit_codes(faults):
    assert faults.verdict_line("test_any_exit_code_is_fine").endswith("... ok")


def test_special_return_code_checks_expects_that_code(faults):
    assert faults.verdict_line("test_abort_is_expected").endswith("... ok")


# Under spawn each rank is a fresh interpreter (about 3 s of CPU here), so that
# run takes one case of each way a rank can end (a pass, an exception, a signal,
# an exit code, a skip, a hang, an expected abort), not all 14: the whole file
# took 152 s of a whole-suite run on 2 cores. fork runs them all (each rank is
# a fork of the preloaded process).
SPAWN_CASES = ["Faults.test_pass", "Faults.test_assertion_on_rank1",
               "Faults.test_sigsegv_on_rank1", "Faults.test_sys_exit_3_on_rank1",
               "Faults.test_skip_on_rank1_only", "Faults.test_hang_on_rank0",
               "ReturnCodeChecks.test_abort_is_expected"]


@pytest.mark.parametrize("start_method, cases", [("spawn", SPAWN_CASES), ("fork", [])],
                         ids=["spawn", "fork"])
def test_every_start_method_gives_the_same_verdicts(faults, start_method, cases):
    # faults ran with the default (the preloaded forkserver); the others must agree.
    other = run_python(["faults.py", "-v", *cases], env={"DISTSPAWN_START_METHOD": start_method})

    def verdicts(run):
        # verdict_line joins a verdict that other output split from its name
        # (Python 3.12 warns at each fork from a process with threads: a GPU
        # build that found a device has some).
        names = {line.split(" (")[0] for line in run.output.splitlines()
                 if line.startswith("test") and " ... " in line}
        return sorted(name + " " + run.verdict_line(name).rsplit(" ... ", 1)[1]
                      for name in names)

    expected = verdicts(faults)
    if cases:  # the default's verdicts for the cases this run took
        names = {case.rsplit(".", 1)[1] for case in cases}
        expected = [verdict for verdict in expected if verdict.split(" ", 1)[0] in names]
    assert verdicts(other) == expected, other.output
    assert other.leftover_pids == []


@pytest.mark.skipif(nvidia_driver_present(), reason="checks a machine without an NVIDIA driver")
def test_a_cuda_call_without_a_driver_says_the_test_needs_a_gpu():
    # The test module counts GPUs at import (as upstream's common_utils does),
    # in the process the ranks are forked from. On a CUDA build, torch then
    # refuses the ranks' CUDA call advising 'spawn'; the failure says what is
    # really missing. A CPU build says it itself.
    run = run_python(["-m", "unittest", "-v", "cuda_without_a_gpu"])
    report = run.report("test_a_cuda_call")
    assert "2 of 2 ranks failed (ranks 0, 1)" in report, run.output
    if torch.backends.cuda.is_built():
        assert "Cannot re-initialize CUDA in forked subprocess" in report, run.output
        assert report.count("distspawn: this machine has no NVIDIA driver, so no CUDA "
                            "device, and the test needs one.") == 2, run.output
    else:
        assert "Torch not compiled with CUDA enabled" in report, run.output
        assert "NVIDIA driver" not in report, run.output
    assert run.leftover_files == [] and run.leftover_pids == [], run.output
