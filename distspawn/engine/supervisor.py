"""Parent side: watch the ranks of one test until its verdict is known.

Every set of rank processes is watched here, fresh or reused: a fresh rank is
done with its test when it exits, a reused one (``test_id`` given) when it has
reported for that test id and stays alive for the next. Either way the same
loop keeps the deadline, takes every live rank's stacks when it passes, and
reads each rank's output tail and crash dump for the report.

One loop waits on every rank's result pipe and process sentinel together
(``multiprocessing.connection.wait``), so nothing is polled on a timer. Each
kind of event has one small handler: a report arrived, a rank exited, the
deadline passed. As soon as one rank decides the verdict (it failed, crashed,
or vanished) the others get a short grace period and are then ended. Only the
processes this supervisor was given are ever signalled.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Callable

from . import stall
from .crash_text import drop_frames, python_crash_stack, split_native_dump, trim_native_dump
from .ending import end_processes
from .protocol import DEPARTING, LEAVE, Event, RankReport, ReportStatus
from .verdict import RankOutcome, where_ranks_were
from .worker import STACK_DUMP_SIGNAL, RankFiles, is_harness_frame

logger = logging.getLogger(__name__)

# After the first decisive rank, how long the others may still report (so that
# several ranks failing together are all named) before they are ended.
FAILURE_GRACE_S = 0.5
# How long ranks get to write their stacks after the request.
STACK_WAIT_S = 3.0
OUTPUT_TAIL_LINES = 40
# How often the ranks' collective logs are read while a stall may be forming.
STALL_CHECK_S = 0.5

# The supervisors whose watch is under way in this process (one, but for a
# test that starts ranks from a rank thread): a timer that ends the process
# from another thread (pytest-timeout's thread method) asks them where their
# ranks are before it does.
_WATCHING: list[RankSupervisor] = []


def where_watched_ranks_are() -> str | None:
    """Where every rank still running under a watch of this process is, for a
    timer on another thread about to end the process (it never returns to the
    watch, so nothing else would show the ranks); None when no rank runs."""
    notes = [note for supervisor in list(_WATCHING) if (note := supervisor.where_ranks_are())]
    return "\n".join(notes) or None


@dataclass(eq=False)
class RankProcess:
    """A started rank: its process and the parent's ends of its pipes.

    A reused rank has one pipe for both (tasks down, reports up) and no
    upstream-style control pipe; ``log_start`` is where this test's output
    begins in its log, which the rank keeps for its whole life.

    ``upstream_contract``: the rank was started by a test class's own
    ``_start_processes``, upstream's way. It has one pipe (``control`` is
    ``results``), on which it sends its traceback as a string if it fails; it
    has no log file and no stack-dump signal, so its stacks are asked for on
    that pipe.
    """

    rank: int
    process: BaseProcess
    control: Connection | None
    results: Connection
    files: RankFiles
    log_start: int = 0
    upstream_contract: bool = False


class RankSupervisor:
    """Watches one test's ranks; :meth:`watch` returns their outcomes."""

    def __init__(
        self,
        ranks: list[RankProcess],
        timeout_s: float,
        is_decisive: Callable[[RankOutcome], bool],
        test_id: str | None = None,
        stall_window_s: float = 0.0,
    ) -> None:
        # Reused ranks: done once they reported for ``test_id``, not when they exit.
        self._test_id = test_id
        self._ranks = {r.rank: r for r in ranks}
        # Ranks done with their test, waiting to leave together (worker.leave_together);
        # once any rank has left or the verdict is known, everyone may go at once.
        self._departing: set[int] = set()
        self._free_to_leave = False
        self._timeout_s = timeout_s
        self._is_decisive = is_decisive
        self.outcomes = {r.rank: RankOutcome(rank=r.rank, pid=r.process.pid) for r in ranks}
        self._open_results = {r.results: r.rank for r in ranks}
        self._running = {r.process.sentinel: r.rank for r in ranks}
        self._stop_at: float | None = None
        self._closed_at: dict[int, float] = {}  # when each rank's result pipe closed
        self._now = time.monotonic()
        # Stalls are judged early only where the ranks keep collective logs.
        self._records_calls = any(r.files.collectives_path for r in ranks)
        self._stall_window_s = stall_window_s if self._records_calls else 0.0
        self._next_stall_check = self._now + self._stall_window_s
        self.stall: stall.Stall | None = None
        # A stall seen once is confirmed once every running rank's thread has
        # looked again (a log can be a heartbeat old: a rank may have just
        # finished the call it says it waits in).
        self._suspected: tuple[str, float] | None = None

    def watch(self) -> list[RankOutcome]:
        """Wait for every rank, the first failure, or the deadline; then collect."""
        deadline = time.monotonic() + self._timeout_s
        # The same moment on the wall clock, which ranks stamp their store waits with.
        self._deadline_ns = time.time_ns() + int(self._timeout_s * 1e9)
        _WATCHING.append(self)
        try:
            while self._running:
                limit = deadline if self._stop_at is None else min(deadline, self._stop_at)
                remaining = limit - time.monotonic()
                if remaining <= 0:
                    break
                if self._stall_window_s and self._stop_at is None:
                    remaining = min(remaining, max(0.0, self._next_stall_check - time.monotonic()))
                ready = wait([*self._open_results, *self._running], timeout=remaining)
                # Everything seen in one wake-up happened "now": which of two
                # simultaneous events is handled first must not order them.
                self._now = time.monotonic()
                # Exits first: a rank that died and the peer it took down are often
                # seen together, and the death is the cause. Membership is
                # re-checked: handling an exit drains (and may close) that
                # rank's result pipe, which can also be in this batch.
                for sentinel in [r for r in ready if r in self._running]:
                    self._on_rank_exited(self._running.pop(sentinel))
                for conn in [r for r in ready if r in self._open_results]:
                    self._on_results_readable(conn)
                if (self._stall_window_s and self._stop_at is None and self._running
                        and self._now >= self._next_stall_check):
                    self._next_stall_check = self._now + STALL_CHECK_S
                    if self._judge_stall():
                        break
            if self.stall is not None:
                self._on_stall()
            elif self._running:
                if self._stop_at is not None:
                    self._on_failure_known()
                else:
                    self._on_deadline()
        except (KeyboardInterrupt, SystemExit):
            raise  # the user stops the run: no report wanted
        except BaseException as stopped:
            if self._running:
                self._note_where_ranks_were(stopped)
            raise
        finally:
            _WATCHING.remove(self)
            # Also reached on Ctrl-C: never leave a rank behind.
            end_processes([self._ranks[rank].process for rank in self._running.values()])
        for rank in self._ranks.values():
            self._finish_outcome(rank)
        if self.stall is None and self._records_calls:
            self._compare_completed_calls()
        return [self.outcomes[rank] for rank in sorted(self.outcomes)]

    # -- events -------------------------------------------------------------

    def _on_results_readable(self, conn: Connection) -> None:
        """A rank sent its report, or closed its result pipe by exiting."""
        rank = self._open_results[conn]
        try:
            message = conn.recv()
        except (EOFError, OSError):
            del self._open_results[conn]
            # Its pipe closes the moment it dies; its exit status can come later
            # (under forkserver, once the server has reaped it).
            self._closed_at.setdefault(rank, self._now)
            return
        if isinstance(message, str) and self._ranks[rank].upstream_contract:
            # Upstream's contract: a failing rank sends its formatted traceback.
            message = RankReport(rank, "", ReportStatus.FAILED, traceback=message)
        if message == DEPARTING:
            self.outcomes[rank].finished_test = True
            self._departing.add(rank)
            if self._free_to_leave or len(self._departing) == len(self._ranks):
                self._let_go()
        elif not isinstance(message, RankReport) or self.outcomes[rank].report is not None:
            return
        elif self._test_id is None:
            outcome = self.outcomes[rank]
            outcome.report = message
            if message.exit_code is not None:
                # It called sys.exit(code) and is on its way out (or waiting to
                # leave with the others): that code is its result, even if it is
                # ended before it gets there.
                outcome.exit_code = message.exit_code
            self._note(outcome)
        elif message.test_name != self._test_id:
            logger.warning("rank %s sent a result for %r while %r was running; ignored",
                           rank, message.test_name, self._test_id)
        else:
            self._on_reused_rank_reported(rank, message)

    def _on_reused_rank_reported(self, rank: int, report: RankReport) -> None:
        """A reused rank is done with this test; its process stays for the next."""
        outcome = self.outcomes[rank]
        outcome.report = report
        outcome.exit_code = report.exit_code if report.exit_code is not None else 0
        handle = self._ranks[rank]
        self._running.pop(handle.process.sentinel, None)
        self._open_results.pop(handle.results, None)
        self._note(outcome)

    def _on_rank_exited(self, rank: int) -> None:
        """A rank's process ended: read what it sent before exiting, record its code."""
        handle = self._ranks[rank]
        self._drain_results(handle)
        handle.process.join()
        self.outcomes[rank].exit_code = handle.process.exitcode
        _pass_by_exit_code(handle, self.outcomes[rank])
        self._note(self.outcomes[rank])
        self._let_go()  # it can no longer depart with the others

    def _on_failure_known(self) -> None:
        """The verdict is a failure: the ranks still running are ended, not blamed
        (a rank whose own result already failed it keeps that result)."""
        for rank in self._running.values():
            if self.outcomes[rank].failed_at is None:
                self.outcomes[rank].ended_by_harness = True

    def _on_deadline(self) -> None:
        """The test ran out of time: take every live rank's stack, then end it."""
        # Whatever the logs can still tell sits beside the stacks.
        found = stall.judge(self._rank_states(), time.time_ns(), 0.0, at_deadline=True)
        self._take_stacks(found, deadline=True)

    def _on_stall(self) -> None:
        """Every running rank waits in a call none can finish: end them now."""
        self._take_stacks(self.stall, deadline=False)

    def _note_where_ranks_were(self, stopped: BaseException) -> None:
        """An exception of the test process's own stopped the wait (pytest-timeout's
        signal method raises ``Failed: Timeout`` here, and dumps only this
        process's stacks): it gets a note with each running rank's stack and,
        where the collective logs tell, the call each waits in."""
        note = self.where_ranks_are()
        if note:  # else the exception that stopped the test is all there is to see
            stopped.add_note(note)

    def where_ranks_are(self) -> str | None:
        """Each running rank's stack and, where the collective logs tell, the
        call it waits in; None when none runs or the stacks could not be taken.
        Also asked from another thread, while :meth:`watch` still waits."""
        # A copy: the watching thread may see a rank exit meanwhile.
        running = [self.outcomes[rank] for rank in list(self._running.values())]
        if not running:
            return None
        try:
            found = stall.judge(self._rank_states(), time.time_ns(), 0.0, at_deadline=True)
            self._take_stacks(found, deadline=True)
            return where_ranks_were(running, len(self._ranks),
                                    found.headline if found is not None else None)
        except Exception:
            logger.exception("distspawn could not take the ranks' stacks")
            return None

    def _take_stacks(self, found: stall.Stall | None, deadline: bool) -> None:
        live = [self._ranks[rank] for rank in list(self._running.values())]
        stacks = collect_stacks(live)
        for handle in live:
            outcome = self.outcomes[handle.rank]
            outcome.timed_out = deadline
            stack = stacks.get(handle.rank)
            outcome.stack = None if stack is None else drop_frames(stack, _is_not_the_users)
        if found is None:
            return
        for outcome in self.outcomes.values():
            outcome.stall_headline = found.headline
            outcome.doing = found.doing.get(outcome.rank)
            outcome.recent_calls = found.recent.get(outcome.rank, [])
            if not deadline and outcome.rank in self._running.values():
                if outcome.finished_test or outcome.report is not None:
                    outcome.ended_by_harness = True  # it only waited to leave
                else:
                    outcome.stalled = True

    def _compare_completed_calls(self) -> None:
        """Calls that finished can still have combined values differently on
        different ranks (a reduce op): the ranks' reports say."""
        records = {rank: outcome.report.reduce_ops for rank, outcome in self.outcomes.items()
                   if outcome.report is not None and outcome.report.reduce_ops}
        if len(records) < 2:
            return
        found = stall.completed_calls_disagree(records, self._rank_states)
        if found is None:
            return
        for outcome in self.outcomes.values():
            outcome.calls_headline = found.headline
            outcome.disagreement = found.parts.get(outcome.rank)

    def _judge_stall(self) -> bool:
        """Read the ranks' collective logs; True when they show a stall."""
        states = self._rank_states()
        found = stall.judge(states, time.time_ns(), self._stall_window_s,
                            deadline_ns=self._deadline_ns)
        if found is None:
            self._suspected = None
            return False
        if self._suspected is None or self._suspected[0] != found.headline:
            self._suspected = (found.headline, time.time())
            return False
        seen_at = self._suspected[1]
        if any(s.phase == "running" and s.log_time <= seen_at for s in states):
            return False
        self.stall = found
        return True

    def _rank_states(self) -> list[stall.RankState]:
        running = set(self._running.values())
        states = []
        for rank, handle in sorted(self._ranks.items()):
            outcome = self.outcomes[rank]
            if outcome.finished_test or (outcome.report is not None
                                         and outcome.status is not ReportStatus.EXITED):
                phase = "finished"  # its test returned (it may be waiting to leave)
            else:
                phase = "running" if rank in running else "exited"
            log, written = _read_collective_log(handle.files.collectives_path)
            fresh = time.time() - written <= stall.FRESH_S
            states.append(stall.RankState(rank, phase, log, fresh, outcome.exit_code, written))
        return states

    # -- helpers ------------------------------------------------------------

    def _drain_results(self, handle: RankProcess) -> None:
        while handle.results in self._open_results and handle.results.poll():
            self._on_results_readable(handle.results)

    def _note(self, outcome: RankOutcome) -> None:
        if outcome.failed_at is not None or not self._is_decisive(outcome):
            return
        outcome.failed_at = self._now
        if outcome.report is None and outcome.rank in self._closed_at:
            outcome.failed_at = self._closed_at[outcome.rank]  # it died then, unreported
        if self._stop_at is None:
            self._stop_at = outcome.failed_at + FAILURE_GRACE_S
            self._let_go()

    def _let_go(self) -> None:
        """Tell every rank waiting to depart, and any that asks later, to leave."""
        self._free_to_leave = True
        for rank in self._departing:
            try:
                self._ranks[rank].results.send(LEAVE)
            except (OSError, ValueError):
                pass  # it is gone already
        self._departing.clear()

    def _finish_outcome(self, handle: RankProcess) -> None:
        outcome = self.outcomes[handle.rank]
        self._drain_results(handle)
        if outcome.exit_code is None:
            outcome.exit_code = handle.process.exitcode
        _pass_by_exit_code(handle, outcome)
        if handle.control is not None:
            outcome.legacy_error = _legacy_error(handle.control)
        # (A rank started upstream's way has no log: its output went to ours.)
        outcome.reached_worker = (handle.upstream_contract
                                  or os.path.exists(handle.files.log_path))
        # Read well past the tail: a native crash dump can fill a screen.
        output = read_tail(handle.files.log_path, 20 * OUTPUT_TAIL_LINES, handle.log_start)
        own, native = split_native_dump(output)
        outcome.output_tail = own[-OUTPUT_TAIL_LINES:]
        crashed = not (outcome.ended_by_harness or outcome.timed_out)
        if outcome.signal_name is not None and crashed:
            outcome.native_frames = trim_native_dump(native)
            if handle.files.crash_path:
                outcome.crash_stack = python_crash_stack(
                    _read_text(handle.files.crash_path), _is_not_the_users)
                crashed_at = _crash_time(handle.files.crash_path)
                if outcome.crash_stack and crashed_at is not None and outcome.failed_at:
                    # Dying takes a while (native handlers print every thread), and
                    # its peers may report the lost connection first: the crash
                    # file says when it really happened.
                    outcome.failed_at = min(outcome.failed_at, crashed_at)
        elif native:
            outcome.output_tail = output[-OUTPUT_TAIL_LINES:]  # not a crash of ours: as printed


def _pass_by_exit_code(handle: RankProcess, outcome: RankOutcome) -> None:
    # Upstream's contract has no report for a pass: exit code 0 is one.
    if handle.upstream_contract and outcome.report is None and outcome.exit_code == 0:
        outcome.report = RankReport(handle.rank, "", ReportStatus.PASSED)


_STDLIB_DIR = os.path.dirname(os.__file__) + os.sep


def _is_not_the_users(path: str) -> bool:
    # Frames of the harness and of the standard library's process and thread
    # start-up sit under every rank's test; the user's frames are the rest.
    return is_harness_frame(path) or (path.startswith(_STDLIB_DIR)
                                      and "site-packages" not in path)


def _legacy_error(control: Connection) -> str | None:
    # An upstream-style run_test sends its traceback as a str on the control pipe.
    try:
        while control.poll():
            message = control.recv()
            if isinstance(message, str):
                return message
    except (EOFError, OSError):
        pass
    return None


def collect_stacks(ranks: list[RankProcess]) -> dict[int, str]:
    """Every thread's Python stack of each given live rank, keyed by rank.

    A signal makes faulthandler write the stacks from inside the rank, which
    works even while the rank holds the GIL in native code. Where there is no
    such signal, the rank's listener thread is asked over the control pipe.
    """
    if STACK_DUMP_SIGNAL is None:
        return _stacks_over_pipes(ranks)
    # A rank started upstream's way never installed the signal's handler
    # (the signal would end it): its listener thread is asked instead.
    stacks = _stacks_over_pipes([h for h in ranks if h.upstream_contract])
    asked = []
    for handle in ranks:
        if handle.upstream_contract:
            continue
        if handle.process.exitcode is None:
            try:
                os.kill(handle.process.pid, STACK_DUMP_SIGNAL)
                asked.append(handle)
            except ProcessLookupError:
                pass
    stacks.update((h.rank, text) for h, text in _read_when_settled(asked).items() if text)
    return stacks


def _read_when_settled(ranks: list[RankProcess]) -> dict[RankProcess, str]:
    # faulthandler writes from a signal handler and says nothing when done, so
    # wait until each file has content that stopped growing (bounded).
    last_size = {h: -1 for h in ranks}
    give_up = time.monotonic() + STACK_WAIT_S
    pending = set(ranks)
    while pending and time.monotonic() < give_up:
        time.sleep(0.05)
        for handle in list(pending):
            size = _file_size(handle.files.stack_path)
            if size > 0 and size == last_size[handle]:
                pending.discard(handle)
            last_size[handle] = size
    return {h: _read_text(h.files.stack_path) for h in ranks}


def _stacks_over_pipes(ranks: list[RankProcess]) -> dict[int, str]:
    stacks = {}
    for handle in ranks:
        if handle.control is None:
            continue  # a reused rank: only the signal can ask it
        try:
            handle.control.send(Event.GET_TRACEBACK)
            if handle.control.poll(STACK_WAIT_S):
                stacks[handle.rank] = handle.control.recv()
        except (EOFError, OSError):
            continue
    return stacks


def _read_collective_log(path: str | None) -> tuple[dict | None, float]:
    """A rank's collective log and when its thread last wrote or touched it."""
    if not path:
        return None, 0.0
    try:
        written = os.path.getmtime(path)
        with open(path) as f:
            return json.load(f), written
    except (OSError, ValueError):
        return None, 0.0


def _crash_time(path: str) -> float | None:
    """When the crash file was written, on the monotonic clock."""
    try:
        age = time.time() - os.path.getmtime(path)
    except OSError:
        return None
    return time.monotonic() - max(0.0, age)


def _file_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _read_text(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def read_tail(path: str, lines: int, start: int = 0) -> list[str]:
    """The last ``lines`` lines of a text file from byte ``start`` on (empty if missing)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(start, size - 64 * 1024))
            data = f.read()
    except OSError:
        return []
    text = data.decode(errors="replace").splitlines()
    return text[-lines:]


def log_size(path: str) -> int:
    """Where the next line written to a rank's log will start."""
    return _file_size(path)
