"""One table of fault cases, run on every tier: what the user sees must agree.

scenarios/fault_table.py holds the cases; each tier (fresh processes, reused
workers, threads) runs the whole file once, and each test here checks one row
of the table on that tier: the verdict, the ranks named and in what order,
and the traceback, stack, crash report and output tail shown for them.
"""

import re

import pytest

from harness import run_python

TIERS = ["processes", "reused", "threads"]
PROCESS_TIERS = {"processes", "reused"}
REPEATS = 40  # copies of the every-rank-raises case on the threads tier


@pytest.fixture(scope="module", params=TIERS)
def table(request):
    tier = request.param
    env = {"DISTSPAWN_FAULT_TIER": tier,
           "DISTSPAWN_FAULT_REPEAT": str(REPEATS if tier == "threads" else 1)}
    run = run_python(["fault_table.py", "-v"], env=env, timeout=240)
    run.tier = tier
    return run


def rank_lines(report):
    """The 'rank N: problem' lines of a report, in the order shown."""
    return [line for line in report.splitlines() if re.match(r"^rank \d+: ", line)]


def section_of(report, rank):
    """What the report shows under 'rank N: ...', up to the next rank's line."""
    match = re.search(rf"^rank {rank}: .*?(?=^rank \d+[: ]|\Z)", report, re.S | re.M)
    assert match, report
    return match.group(0)


def needs_processes(run):
    if run.tier not in PROCESS_TIERS:
        pytest.skip("a signal to a thread would end the whole test process")


def assert_others_follow(report, first):
    """Every rank after the first says how long after it it failed, or was ended."""
    # On a loaded machine a peer may not have failed yet when distspawn knew of
    # the first failure (seen with 15 xdist workers on 16 cores): it is ended,
    # and the report says so instead of a time.
    for line in rank_lines(report)[1:]:
        assert (f"s after rank {first}" in line
                or line.endswith("still running when the failure was known; ended by distspawn")
                ), report


def test_the_run_fails_and_leaves_nothing(table):
    assert table.returncode == 1, table.output
    assert table.leftover_files == []
    assert table.leftover_pids == []


def test_pass(table):
    assert table.verdict_line("test_pass").endswith("ok")


def test_raise(table):
    report = table.report("test_raise")
    assert rank_lines(report)[0] == "rank 1: raised an exception", report
    assert "ValueError: boom from rank 1" in section_of(report, 1)
    if table.tier in PROCESS_TIERS:
        assert "[rank 1] rank 1 about to raise" in section_of(report, 1)
    assert_others_follow(report, 1)


def test_exit_code(table):
    report = table.report("test_exit_code")
    assert rank_lines(report)[0] == "rank 1: called sys.exit(3)", report
    if table.tier in PROCESS_TIERS:
        assert "[rank 1] rank 1 about to exit" in section_of(report, 1)
    assert_others_follow(report, 1)


def test_sigsegv_leads_with_the_python_stack(table):
    needs_processes(table)
    report = table.report("test_sigsegv")
    assert rank_lines(report)[0] == "rank 1: crashed with SIGSEGV (exit code -11)", report
    crash = section_of(report, 1)
    stack = crash.index("its Python stack when it crashed:")
    where = crash.index("in test_sigsegv")
    tail = crash.index("[rank 1] rank 1 about to crash")
    native = crash.index("native frames (trimmed):")
    assert stack < where < tail < native, crash
    assert crash.count("frame #") <= 10, crash
    assert "distspawn/" not in crash[stack:tail], "harness frames hide the user's"
    assert_others_follow(report, 1)


def test_sigkill(table):
    needs_processes(table)
    report = table.report("test_sigkill")
    assert rank_lines(report)[0] == "rank 1: crashed with SIGKILL (exit code -9)", report
    assert "[rank 1] rank 1 about to be killed" in section_of(report, 1)
    assert_others_follow(report, 1)


def test_hang_shows_where_each_rank_waited(table):
    report = table.report("test_hang")
    assert rank_lines(report)[0] == "rank 0: did not finish before the deadline", report
    stuck = section_of(report, 0)
    assert "its stack at the deadline" in stuck
    assert "hang_here" in stuck, stuck
    if table.tier in PROCESS_TIERS:
        assert "[rank 0] rank 0 about to hang" in stuck
        for rank in (1, 2):
            assert "in barrier" in section_of(report, rank)


def test_skip_on_some_ranks(table):
    report = table.report("test_skip_on_some_ranks")
    assert "ranks disagree: 1 of 3 ranks skipped while ranks 0, 2 ran the test" in report
    assert "rank 1 skipped: rank 1 lacks a widget" in report


def test_skip_everywhere_keeps_the_reason(table):
    assert table.verdict_line("test_skip_everywhere").endswith(
        "skipped 'no widgets anywhere'")


def test_every_rank_raising_is_named_with_its_own_error(table):
    names = ["test_every_rank_raises"] + [
        f"test_every_rank_raises_{copy}" for copy in range(1, REPEATS if table.tier == "threads"
                                                           else 1)]
    for name in names:
        report = table.report(name)
        assert "3 of 3 ranks failed (ranks 0, 1, 2)" in report, report
        for rank in range(3):
            assert f"ValueError: rank {rank} fails on its own" in section_of(report, rank)
        assert "ended by distspawn" not in report, report
        first = int(rank_lines(report)[0].split()[1].rstrip(":"))
        assert_others_follow(report, first)
