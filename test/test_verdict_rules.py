"""The verdict rules as a pure function: no process is started here."""

from distspawn.engine.protocol import RankReport, ReportStatus
from distspawn.engine.verdict import (
    RankOutcome,
    ReturnCodePolicy,
    SkipRule,
    VerdictKind,
    decide_verdict,
    is_decisive,
)
from harness import needs_gpus

STRICT = ReturnCodePolicy()


def outcome(rank, status=None, exit_code=0, **details):
    report = None
    if status is not None:
        fields = {k: details.pop(k) for k in ("traceback", "reason") if k in details}
        if status is ReportStatus.EXITED:
            fields["exit_code"] = exit_code
        report = RankReport(rank, "test_x", status, **fields)
    return RankOutcome(rank=rank, report=report, exit_code=exit_code, **details)


PASSED = ReportStatus.PASSED


def test_all_passed_is_a_pass():
    verdict = decide_verdict([outcome(0, PASSED), outcome(1, PASSED)], STRICT)
    assert verdict.kind is VerdictKind.PASS


def test_signal_is_named():
    verdict = decide_verdict([outcome(0, PASSED), outcome(1, exit_code=-11)], STRICT)
    assert verdict.kind is VerdictKind.FAIL
    assert "rank 1: crashed with SIGSEGV (exit code -11)" in verdict.message


def test_exit_zero_without_a_report_fails():
    verdict = decide_verdict([outcome(0, exit_code=0), outcome(1, PASSED)], STRICT)
    assert "rank 0: ended without reporting a result" in verdict.message


def test_sys_exit_zero_is_a_pass_like_upstream():
    verdict = decide_verdict([outcome(0, ReportStatus.EXITED, 0), outcome(1, PASSED)], STRICT)
    assert verdict.kind is VerdictKind.PASS


def test_skip_code_without_report_maps_to_its_message():
    verdict = decide_verdict([outcome(0, exit_code=75), outcome(1, exit_code=75)], STRICT)
    assert verdict == verdict.__class__(VerdictKind.SKIP, needs_gpus(1))


def test_different_skip_reasons_are_all_given():
    verdict = decide_verdict([
        outcome(0, ReportStatus.SKIPPED, 86, reason="a"),
        outcome(1, ReportStatus.SKIPPED, 86, reason="b"),
    ], STRICT)
    assert verdict.kind is VerdictKind.SKIP
    assert verdict.message == "rank 0: a; rank 1: b"


def test_partial_skip_fails_by_default_but_upstreams_rules_follow_rank0_or_any_rank():
    outcomes = [outcome(0, PASSED), outcome(1, ReportStatus.SKIPPED, 86, reason="r")]
    assert decide_verdict(outcomes, STRICT).kind is VerdictKind.FAIL
    rank_zero = ReturnCodePolicy(skip_rule=SkipRule.RANK_ZERO)
    any_rank = ReturnCodePolicy(skip_rule=SkipRule.ANY_RANK)
    assert decide_verdict(outcomes, rank_zero).kind is VerdictKind.PASS
    assert (decide_verdict(outcomes, any_rank).kind,
            decide_verdict(outcomes, any_rank).message) == (VerdictKind.SKIP, "r")
    flipped = [outcome(0, ReportStatus.SKIPPED, 86, reason="r"), outcome(1, PASSED)]
    for policy in (rank_zero, any_rank):
        lenient = decide_verdict(flipped, policy)
        assert (lenient.kind, lenient.message) == (VerdictKind.SKIP, "r")
    # A failing rank still fails the test, whichever rank skipped.
    failed = [outcome(0, ReportStatus.SKIPPED, 86, reason="r"),
              outcome(1, ReportStatus.FAILED, 10, traceback="Traceback\nE: x")]
    assert decide_verdict(failed, any_rank).kind is VerdictKind.FAIL


def test_a_reported_failure_counts_even_if_the_rank_was_ended_while_exiting():
    failed = outcome(1, ReportStatus.FAILED, -15, traceback="Traceback\nE: x",
                     ended_by_harness=True)
    verdict = decide_verdict([outcome(0, PASSED), failed], STRICT)
    assert verdict.kind is VerdictKind.FAIL
    assert "ended by distspawn" not in verdict.message


def test_ranks_ended_by_the_harness_are_listed_not_blamed():
    verdict = decide_verdict([
        outcome(0, ReportStatus.FAILED, 10, traceback="Traceback\nValueError: v"),
        outcome(1, exit_code=-15, ended_by_harness=True),
    ], STRICT)
    assert "1 of 2 ranks failed (rank 0)" in verdict.message
    assert "rank 1: still running when the failure was known; ended by distspawn" in verdict.message


def test_special_return_code_is_expected_on_every_rank():
    policy = ReturnCodePolicy(expected_exit_code=-6)
    assert decide_verdict([outcome(0, exit_code=-6), outcome(1, PASSED, -6)],
                          policy).kind is VerdictKind.PASS
    verdict = decide_verdict([outcome(0, exit_code=-6), outcome(1, PASSED, 0)], policy)
    assert "rank 1: exited with code 0, expected -6" in verdict.message


def test_skip_return_code_checks_only_judges_errors_and_timeouts():
    policy = ReturnCodePolicy(check_exit_codes=False)
    assert decide_verdict([outcome(0, exit_code=-9), outcome(1, exit_code=3)],
                          policy).kind is VerdictKind.PASS
    assert decide_verdict([outcome(0, exit_code=10), outcome(1, PASSED)],
                          policy).kind is VerdictKind.FAIL
    assert decide_verdict([outcome(0, exit_code=None, timed_out=True), outcome(1, PASSED)],
                          policy).kind is VerdictKind.FAIL


def test_timeout_message_carries_the_stack():
    verdict = decide_verdict([
        outcome(0, exit_code=-15, timed_out=True, stack='File "t.py", line 3 in test_x'),
    ], STRICT)
    assert "rank 0: did not finish before the deadline" in verdict.message
    assert 'File "t.py", line 3 in test_x' in verdict.message


def test_output_tail_is_prefixed_by_rank():
    verdict = decide_verdict([outcome(2, exit_code=-9, output_tail=["hello", "bye"])], STRICT)
    assert "  [rank 2] hello\n  [rank 2] bye" in verdict.message


def test_rank_that_died_while_starting_points_at_the_parents_stderr():
    verdict = decide_verdict([outcome(0, exit_code=1, reached_worker=False)], STRICT)
    assert "while starting, before the test ran" in verdict.message


def test_decisive_means_the_wait_can_stop():
    assert is_decisive(outcome(0, ReportStatus.FAILED, None, traceback="t"), STRICT)
    assert is_decisive(outcome(0, exit_code=-11), STRICT)
    assert not is_decisive(outcome(0, PASSED, None), STRICT)  # still running
    assert not is_decisive(outcome(0, ReportStatus.SKIPPED, 86, reason="r"), STRICT)
    assert not is_decisive(outcome(0, PASSED, 0), STRICT)


def test_the_first_failure_comes_first_and_later_ones_say_how_much_later():
    first = outcome(1, ReportStatus.FAILED, exit_code=10, traceback="ValueError: broke",
                    failed_at=100.0)
    later = outcome(0, ReportStatus.FAILED, exit_code=10,
                    traceback="RuntimeError: Connection closed by peer", failed_at=100.25)
    verdict = decide_verdict([later, first], STRICT)
    assert verdict.summary.splitlines()[:3] == [
        "2 of 2 ranks failed (ranks 0, 1):",
        "rank 1: raised an exception",
        "rank 0: raised an exception, 0.2 s after rank 1",
    ]
    assert [detail.rank for detail in verdict.failed_ranks] == [1, 0]
