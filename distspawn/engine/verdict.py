"""Verdict rules: from what each rank did to one pass / fail / skip.

Pure functions over plain data, so every rule is testable without starting a
process. The supervisor fills in :class:`RankOutcome`; the test case asks
:func:`decide_verdict` and raises accordingly.
"""

from __future__ import annotations

import enum
import signal
from dataclasses import dataclass, field
from typing import Callable

from .protocol import RankReport, ReportStatus
from .exit_codes import TEST_ERROR_EXIT_CODE, TEST_SKIPS, skip_message_for

GENERIC_SKIP_MESSAGE = TEST_SKIPS["generic"].message


@dataclass
class RankOutcome:
    """Everything the parent learned about one rank during one test."""

    rank: int
    pid: int | None = None
    report: RankReport | None = None
    exit_code: int | None = None  # None: still running when the wait ended
    timed_out: bool = False
    ended_by_harness: bool = False  # ended by us because the verdict was already known
    stack: str | None = None  # its stack(s), taken at the deadline
    stack_scope: str = "all threads"  # whose stacks ``stack`` holds
    crash_stack: str | None = None  # faulthandler's Python stack, when it died by a signal
    native_frames: list[str] = field(default_factory=list)  # its native dump, trimmed
    output_tail: list[str] = field(default_factory=list)
    legacy_error: str | None = None  # traceback sent upstream's way, over the control pipe
    reached_worker: bool = True  # False: it died while Python started, before our code ran
    failed_at: float | None = None  # monotonic time it failed (as learned, or its crash file's)
    # Stall diagnosis (engine.stall): set on every rank of a test whose ranks were
    # judged stalled early (``stalled`` on those still running then), or whose
    # logs explained the wait at the deadline.
    stalled: bool = False
    finished_test: bool = False  # its test returned; it was waiting for its peers to leave
    stall_headline: str | None = None
    doing: str | None = None  # what it was doing when judged, in words
    recent_calls: list[str] = field(default_factory=list)
    # Calls that finished but combined values differently on different ranks
    # (engine.stall.completed_calls_disagree): the one line naming it, and this
    # rank's part where it is at odds with the rest.
    calls_headline: str | None = None
    disagreement: str | None = None

    @property
    def status(self) -> ReportStatus | None:
        return self.report.status if self.report is not None else None

    @property
    def signal_name(self) -> str | None:
        if self.exit_code is None or self.exit_code >= 0:
            return None
        try:
            return signal.Signals(-self.exit_code).name
        except ValueError:
            return f"signal {-self.exit_code}"


class SkipRule(enum.Enum):
    """Who decides when some ranks skip a test and the others pass it."""

    AGREE = "agree"  # distspawn's: ranks that disagree fail the test, naming who skipped
    RANK_ZERO = "rank 0"  # upstream's rank processes: rank 0's skip decides, others ignored
    ANY_RANK = "any rank"  # upstream's rank threads and reused ranks: one skip skips it


@dataclass(frozen=True)
class ReturnCodePolicy:
    """How exit codes are judged for one test (upstream's override points)."""

    expected_exit_code: int = 0  # from special_return_code_checks
    check_exit_codes: bool = True  # False when the test is in skip_return_code_checks
    skip_rule: SkipRule = SkipRule.AGREE
    skips_pass: bool = False  # Sandcastle: a skip is reported as a pass


class VerdictKind(enum.Enum):
    PASS = "pass"
    FAIL = "fail"
    SKIP = "skip"


@dataclass(frozen=True)
class RankFailureDetail:
    """One failing rank, for reports that show each rank in its own section."""

    rank: int
    problem: str  # e.g. "raised an exception", "crashed with SIGSEGV (exit code -11)"
    details: str  # its traceback or stack and output tail, indented; may be empty


@dataclass(frozen=True)
class Verdict:
    kind: VerdictKind
    message: str = ""
    summary: str = ""  # for FAIL: the message without each rank's details
    failed_ranks: tuple[RankFailureDetail, ...] = ()


def skip_reason(outcome: RankOutcome) -> str | None:
    """The reason this rank skipped, or None if it did not skip."""
    if outcome.status is ReportStatus.SKIPPED:
        return outcome.report.reason or GENERIC_SKIP_MESSAGE
    if outcome.status in (None, ReportStatus.EXITED) and outcome.exit_code is not None:
        return skip_message_for(outcome.exit_code)
    return None


def rank_problem(outcome: RankOutcome, policy: ReturnCodePolicy) -> str | None:
    """What went wrong with this rank, in words, or None if nothing did."""
    if outcome.stalled:
        return outcome.doing or "waiting in a collective no rank can finish"
    if outcome.timed_out and _finished_its_test(outcome):
        return None  # it only waited for its peers: said in the verdict's tail
    if outcome.timed_out:
        words = "did not finish before the deadline"
        return f"{words}: {outcome.doing}" if outcome.doing else words
    if outcome.status is ReportStatus.FAILED:
        return "raised an exception"
    if outcome.disagreement:
        return outcome.disagreement
    if outcome.ended_by_harness:
        return None
    code = outcome.exit_code
    if not policy.check_exit_codes:
        # skip_return_code_checks: only a test error counts (upstream's rule).
        if code == TEST_ERROR_EXIT_CODE:
            return f"exited with code {code} (test error)"
        return None
    if code is None:
        return "was still running"
    if code == policy.expected_exit_code:
        if code == 0 and outcome.report is None:
            return ("ended without reporting a result (exit code 0): the process left "
                    "in the middle of the test, e.g. through os._exit()")
        return None
    if code < 0:
        return f"crashed with {outcome.signal_name} (exit code {code})"
    if skip_reason(outcome) is not None:
        return None
    if outcome.status is ReportStatus.EXITED:
        return f"called sys.exit({code})"
    if code == TEST_ERROR_EXIT_CODE:
        return f"exited with code {code} (TEST_ERROR_EXIT_CODE)"
    expectation = "" if policy.expected_exit_code == 0 else f", expected {policy.expected_exit_code}"
    if not outcome.reached_worker:
        return (f"exited with code {code}{expectation} while starting, before the test ran "
                "(its error is in the parent's stderr: often the test module failed to import)")
    return f"exited with code {code}{expectation} without reporting a result"


def _finished_its_test(outcome: RankOutcome) -> bool:
    return outcome.finished_test or outcome.status in (ReportStatus.PASSED, ReportStatus.SKIPPED)


def is_decisive(outcome: RankOutcome, policy: ReturnCodePolicy) -> bool:
    """True when this rank alone already makes the test fail."""
    if outcome.status is ReportStatus.FAILED:
        return True
    return outcome.exit_code is not None and rank_problem(outcome, policy) is not None


def _rank_details(outcome: RankOutcome,
                  legacy_words: Callable[[RankOutcome], str | None] | None = None,
                  stack_when: str | None = None) -> str:
    """What a failing rank left behind: its traceback or stack, then its output tail."""
    words = legacy_words(outcome) if legacy_words is not None else None
    lines = [f"  {words}:"] if words else []
    details = outcome.report.traceback if outcome.status is ReportStatus.FAILED else None
    details = details or outcome.legacy_error
    if details:
        lines.append(_indent(details.rstrip()))
    if stack_when or outcome.timed_out or outcome.stalled:
        when = stack_when or ("at the deadline" if outcome.timed_out
                              else "when the stall was judged")
        if outcome.stack:
            lines.append(f"  its stack {when} ({outcome.stack_scope}):")
            lines.append(_indent(outcome.stack.rstrip(), "    "))
        else:
            lines.append("  (it did not answer the stack request)")
    if outcome.recent_calls:
        lines.append("  its last recorded collectives, oldest first:")
        lines.extend(f"    {line}" for line in outcome.recent_calls)
    if outcome.crash_stack:
        # The crash first: where its Python code was when the signal came.
        lines.append("  its Python stack when it crashed:")
        lines.append(_indent(outcome.crash_stack.rstrip(), "    "))
    if outcome.output_tail:
        lines.append(f"  last {len(outcome.output_tail)} lines of its output:")
        lines.extend(f"  [rank {outcome.rank}] {line}" for line in outcome.output_tail)
    if outcome.native_frames:
        lines.append("  native frames (trimmed):")
        lines.extend(f"    {line.strip()}" for line in outcome.native_frames)
    return "\n".join(lines)


def _indent(text: str, prefix: str = "  ") -> str:
    return "\n".join(prefix + line for line in text.splitlines())


def _skip_summary(skipped: list[tuple[int, str]]) -> str:
    reasons = {reason for _, reason in skipped}
    if len(reasons) == 1:
        return reasons.pop()
    return "; ".join(f"rank {rank}: {reason}" for rank, reason in skipped)


def _after_first(outcome: RankOutcome, problem: str, first: RankOutcome) -> str:
    if outcome is first or outcome.failed_at is None or first.failed_at is None:
        return problem
    later = max(0.0, outcome.failed_at - first.failed_at)
    return f"{problem}, {later:.1f} s after rank {first.rank}"


# What a rank's error says when it lost a peer (gloo's and torch's wording):
# it failed because another rank did, not first.
PEER_LOSS_PHRASES = ("Connection closed by peer", "Connection reset by peer",
                     "remote worker", "Broken pipe")
# How much earlier than such an error another rank's failure may have come and
# still be taken as its cause (they often reach the parent together).
CONSEQUENCE_WINDOW_S = 0.2


def _consequence_delay(outcome: RankOutcome) -> float:
    text = outcome.report.traceback if outcome.status is ReportStatus.FAILED else None
    text = text or outcome.legacy_error or ""
    last_line = text.rstrip().rsplit("\n", 1)[-1]
    return CONSEQUENCE_WINDOW_S if any(p in last_line for p in PEER_LOSS_PHRASES) else 0.0


def decide_verdict(
    outcomes: list[RankOutcome],
    policy: ReturnCodePolicy,
    legacy_words: Callable[[RankOutcome], str | None] | None = None,
) -> Verdict:
    """The one verdict for a test from every rank's outcome.

    ``legacy_words`` gives, for a failing rank, the phrase upstream's harness
    would have used for it (e.g. "Process 1 exited with error code 10 and
    exception"); it heads that rank's details, so that a test matching
    upstream's message still finds it.
    """
    outcomes = sorted(outcomes, key=lambda o: o.rank)
    world = len(outcomes)
    problems = [(o, p) for o in outcomes if (p := rank_problem(o, policy)) is not None]
    if problems:
        names = ", ".join(str(o.rank) for o, _ in problems)
        plural = "s" if len(problems) > 1 else ""
        head = f"{len(problems)} of {world} ranks failed (rank{plural} {names}):"
        # First failure first: a later one is often a consequence (a peer that
        # lost its connection), and says how long after the first it came.
        # A rank that never finished comes before the peers whose waits it ran out;
        # of failures seen at the same moment, a death without a report (a crash,
        # a kill) comes before the peers' errors about the connection it took.
        # An error that says a peer went away is a consequence: against a failure
        # at nearly the same moment, it comes second.
        problems.sort(key=lambda item: (not (item[0].timed_out or item[0].stalled),
                                        item[0].failed_at is None,
                                        (item[0].failed_at or 0.0) + _consequence_delay(item[0]),
                                        item[0].report is not None))
        first = problems[0][0]
        failed = tuple(RankFailureDetail(o.rank, _after_first(o, p, first),
                                         _rank_details(o, legacy_words))
                       for o, p in problems)
        blamed = {o.rank for o, _ in problems}
        tail = []
        waiting = [o for o in outcomes if o.rank not in blamed and _finished_its_test(o)
                   and (o.timed_out or o.stall_headline)]
        for outcome in waiting:
            finished = outcome.doing or "finished its test"
            tail.append(f"rank {outcome.rank}: {finished}; waiting for "
                        f"rank{'s' if len(blamed) > 1 else ''} {', '.join(map(str, sorted(blamed)))}")
        shown = {o.rank for o in waiting}
        ended = [o.rank for o in outcomes
                 if o.ended_by_harness and o.rank not in blamed and o.rank not in shown]
        if ended:
            tail.append(f"rank{'s' if len(ended) > 1 else ''} {', '.join(map(str, ended))}: "
                        "still running when the failure was known; ended by distspawn")
        lines = [f"rank {item.rank}: {item.problem}" for item in failed]
        headline = next((o.stall_headline or o.calls_headline for o in outcomes
                         if o.stall_headline or o.calls_headline), None)
        if headline:
            head = f"{headline}\n{head}"
        full = [head, *(f"{line}\n{item.details}" if item.details else line
                        for line, item in zip(lines, failed)), *tail]
        return Verdict(VerdictKind.FAIL, "\n".join(full), "\n".join([head, *lines, *tail]),
                       failed)

    ended = [str(o.rank) for o in outcomes if o.ended_by_harness]
    if ended:
        # Ranks are only ended once one failed: with nobody to blame, the
        # harness lost track of something, and that must not read as a pass.
        return Verdict(VerdictKind.FAIL,
                       f"rank{'s' if len(ended) > 1 else ''} {', '.join(ended)} "
                       "were ended by distspawn, but no rank failed: a harness error, "
                       "please report it")
    if not policy.check_exit_codes:
        return Verdict(VerdictKind.PASS)

    skipped = [(o.rank, r) for o in outcomes if (r := skip_reason(o)) is not None]
    if not skipped:
        return Verdict(VerdictKind.PASS)
    if policy.skip_rule is SkipRule.RANK_ZERO:
        skipped = [(rank, r) for rank, r in skipped if rank == outcomes[0].rank]
        if not skipped:
            return Verdict(VerdictKind.PASS)
    elif policy.skip_rule is SkipRule.AGREE and len(skipped) < world:
        skipped_ranks = {rank for rank, _ in skipped}
        ran = [str(o.rank) for o in outcomes if o.rank not in skipped_ranks]
        lines = [f"ranks disagree: {len(skipped)} of {world} ranks skipped while "
                 f"rank{'s' if len(ran) > 1 else ''} {', '.join(ran)} ran the test:"]
        lines.extend(f"rank {rank} skipped: {reason}" for rank, reason in skipped)
        lines.append("(set lenient_skips = True on the class for upstream's rule, "
                     "where rank 0 alone decides on rank processes, and any rank's "
                     "skip skips the test on rank threads and reused ranks)")
        return Verdict(VerdictKind.FAIL, "\n".join(lines))
    if policy.skips_pass:
        return Verdict(VerdictKind.PASS, _skip_summary(skipped))
    return Verdict(VerdictKind.SKIP, _skip_summary(skipped))


def where_ranks_were(running: list[RankOutcome], world: int, headline: str | None) -> str:
    """Where each rank still running was when an exception of the test process's
    own stopped its wait (pytest-timeout's signal method raises one): the note
    distspawn adds to that exception."""
    running = sorted(running, key=lambda o: o.rank)
    plural = "s" if len(running) > 1 else ""
    names = ", ".join(str(o.rank) for o in running)
    lines = [f"distspawn: {len(running)} of {world} ranks (rank{plural} {names}) still ran "
             "when this stopped the test process's wait for them; where each was:"]
    if headline:
        lines.append(headline)
    for outcome in running:
        doing = outcome.doing or ("finished its test, waiting to leave"
                                  if _finished_its_test(outcome) else "in its test")
        lines.append(f"rank {outcome.rank}: {doing}")
        details = _rank_details(outcome, stack_when="when the wait was stopped")
        if details:
            lines.append(details)
    return "\n".join(lines)


# What upstream's harness says of a failing rank, per tier: tests written for it
# match these phrases (assertRaisesRegex(RuntimeError, "Process 0 exited ...")).
def process_words(outcome: RankOutcome) -> str | None:
    """Upstream's phrase for a failing rank process."""
    if outcome.timed_out or outcome.stalled:
        return f"Process {outcome.rank} terminated or timed out"
    if outcome.status is ReportStatus.FAILED or outcome.exit_code == TEST_ERROR_EXIT_CODE:
        return f"Process {outcome.rank} exited with error code {TEST_ERROR_EXIT_CODE} and exception"
    return None


def thread_words(outcome: RankOutcome) -> str | None:
    """Upstream's phrase for a failing rank thread."""
    if outcome.timed_out:
        return f"Thread {outcome.rank} terminated or timed out"
    if outcome.status is ReportStatus.FAILED:
        return f"Thread {outcome.rank} exited with exception"
    return None


def worker_words(outcome: RankOutcome) -> str | None:
    """Upstream's phrase for a failing reused worker."""
    if outcome.status is ReportStatus.FAILED:
        return "Exception in worker process"
    return None


class _RankFailureReport(Exception):
    """What each rank-failure exception carries; see :class:`RankFailure`."""

    def __init__(self, header: str, verdict: Verdict, footer: str = "") -> None:
        tail = f"\n\n{footer}" if footer else ""
        super().__init__(f"{header}\n{verdict.message}{tail}")
        # The verdict first: pytest's one-line summary shows the first line.
        self.summary = f"{verdict.summary or verdict.message}\n({header}){tail}"
        self.failed_ranks = verdict.failed_ranks


class RankFailure(_RankFailureReport, AssertionError, RuntimeError):
    """A test failed on one or more ranks.

    An ``AssertionError``, so that unittest and pytest report a failure (not
    an error), and a ``RuntimeError``, which is what upstream's harness raises:
    ``assertRaises(RuntimeError)`` around a wrapped test still catches it.

    ``str()`` is the whole report (every failing rank's traceback and output
    tail), as unittest shows it. ``summary`` and ``failed_ranks`` hold the same
    facts split up, so the pytest plugin can give each rank its own section.
    """


class RankFailureAsUpstreamRaises(_RankFailureReport, RuntimeError):
    """:class:`RankFailure` with upstream's type only (a ``RuntimeError``).

    The stand-in mode raises it from rank threads: a file run unchanged that
    wraps a threaded test in ``assertRaises(AssertionError)`` then gets the
    verdict upstream's harness gives it.
    """


# Every exception that carries a rank-by-rank report.
RANK_FAILURES = (RankFailure, RankFailureAsUpstreamRaises)

# Users meet it in tracebacks and import it from the package: named as such.
RankFailure.__module__ = "distspawn"
RankFailureAsUpstreamRaises.__module__ = "distspawn"
