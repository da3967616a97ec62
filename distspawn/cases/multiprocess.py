"""MultiProcessTestCase: each test method runs on ``world_size`` rank processes.

Thin glue over the three parts that do the work: ``launch`` (how a rank
starts), ``worker`` (what a rank does) and ``supervisor`` (how the parent
watches them), with ``verdict`` turning what happened into pass / fail / skip.
The method names and override points are upstream's.
"""

from __future__ import annotations

import errno
import faulthandler
import logging
import os
import pickle
import shutil
import sys
import tempfile
import threading
import time
import unittest
from typing import Any, Callable

import torch.distributed as c10d
import torch.multiprocessing as mp
from multiprocessing.connection import wait

from ..engine import collective_log, launch, leftovers, stall, worker
from .class_ref import class_ref
from ..engine.capacity import MAX_RANKS_VAR, check_rank_capacity
from .empty_world import ranks_to_start, warn_passed_unrun
from ..engine.group_keeper import keep_destroyed_groups, release_kept_groups
from ..engine.rank_threads import rank_environment, threads_per_rank
from ..fixtures.environment import (
    DEFAULT_WORLD_SIZE,
    IS_SANDCASTLE,
    TEST_ERROR_EXIT_CODE,
    get_timeout,
)
from ..engine.protocol import Event, RankReport, ReportStatus
from ..fixtures.skips import TEST_SKIPS
from ..engine.ending import end_processes
from ..engine.supervisor import RankProcess, RankSupervisor
from .testcase import RankDispatchingTestCase, rerun_command, set_rng_seed
from ..engine.verdict import (
    RankFailure,
    ReturnCodePolicy,
    VerdictKind,
    decide_verdict,
    is_decisive,
    process_words,
)

logger = logging.getLogger(__name__)


_OUT_OF = {errno.EMFILE: "file descriptors", errno.ENFILE: "file descriptors",
           errno.EAGAIN: "processes", errno.ENOMEM: "memory"}


def start_failure_hint(error: BaseException) -> str:
    """What to do about an error raised while starting a rank, where we know."""
    if isinstance(error, (pickle.PicklingError, AttributeError)):
        # What the rank is sent could not be pickled, or not found again there.
        return (". Test classes must be defined at module level so that rank "
                "processes can import them.")
    if isinstance(error, OSError) and error.errno in _OUT_OF:
        return (f". The machine ran out of {_OUT_OF[error.errno]}: use a smaller world "
                f"size, or set {MAX_RANKS_VAR} so that distspawn refuses such a size "
                "before starting any rank.")
    return ""


def _send_quietly(pipe, message: Any) -> None:
    try:
        pipe.send(message)
    except (OSError, ValueError):
        pass  # the parent is gone: nobody left to tell


class MultiProcessTestCase(RankDispatchingTestCase):
    """Runs every test method on ``world_size`` rank processes.

    In the parent (``rank == MAIN_PROCESS_RANK``) the test method starts the
    ranks (``setUp`` must call ``self._spawn_processes()``), waits for them and
    turns what they did into one verdict. In each rank, the same method runs
    the real test body with ``self.rank`` and ``self.file_name`` set.

    Class attributes beyond upstream's:

    * ``start_method``: ``"forkserver"`` (default where available: fresh rank
      processes forked from a server that loaded torch once), ``"spawn"``
      (exactly upstream) or ``"fork"``;
      the ``DISTSPAWN_START_METHOD`` environment variable sets it for a run.
    * ``lenient_skips``: when True, use upstream's rule for ranks that disagree
      about skipping (rank 0 decides); by default that is a failure.
    """

    MAIN_PROCESS_RANK = -1
    TEST_ERROR_EXIT_CODE = TEST_ERROR_EXIT_CODE
    Event = Event

    start_method: str | None = None
    lenient_skips: bool = False
    # Seconds every rank may wait in collectives that cannot finish before the
    # test fails, naming them (engine.stall); None: DISTSPAWN_STALL_WINDOW or
    # 3 s; 0: only the deadline ends a hung test, as upstream.
    stall_window: float | None = None
    # Where upstream's verdict differs from distspawn's on purpose, give
    # upstream's (the stand-in mode sets it, for files run unchanged).
    upstream_verdicts: bool = False

    def _should_stop_test_suite(self) -> bool:
        # A distributed failure must not stop the rest of the suite.
        return False

    @property
    def destroy_pg_upon_exit(self) -> bool:
        """Whether each rank destroys a still-initialised default group after the test."""
        return True

    @property
    def world_size(self) -> int:
        return DEFAULT_WORLD_SIZE

    # -- parent / child dispatch -------------------------------------------

    _MAIN_DESCRIPTION = "the parent"

    def _is_main(self, rank: int) -> bool:
        return rank == self.MAIN_PROCESS_RANK

    def _join_ranks(self, fn: Callable) -> None:
        self._join_processes(fn)

    def setUp(self) -> None:
        super().setUp()
        # Tests expected to end with another exit code (e.g. SIGABRT from a watchdog).
        self.special_return_code_checks: dict = {}
        # Tests whose exit codes are not checked at all (only errors and timeouts).
        self.skip_return_code_checks: list = []
        self.processes: list = []
        self.rank = self.MAIN_PROCESS_RANK
        self.pid_to_pipe: dict = {}
        self._rank_processes: list[RankProcess] = []
        self._rank_outcomes: list = []
        self._work_dir = tempfile.mkdtemp(prefix="distspawn-")
        leftovers.remove_if_killed(self._work_dir)
        self.addCleanup(shutil.rmtree, self._work_dir, ignore_errors=True)
        self.addCleanup(self._end_rank_processes)
        with tempfile.NamedTemporaryFile(delete=False, dir=self._work_dir, prefix="store-") as f:
            self.file_name = f.name

    def tearDown(self) -> None:
        super().tearDown()
        self._end_rank_processes()

    def _current_test_name(self) -> str:
        return self.id().split(".")[-1]

    # -- starting ranks ------------------------------------------------------

    def _start_processes(self, proc) -> None:
        world_size = self._ranks_to_start()
        get_timeout(self.id())  # a bad TIMEOUT_DEFAULT a file set fails before any rank starts
        test_name = self._current_test_name()
        run_kwargs = {"fake_pg": self.fake_pg} if hasattr(self, "fake_pg") else {}
        self.processes = []
        self._rank_processes = []
        self._started_at = time.monotonic()
        environ = rank_environment(world_size)
        # Ranks leave together only where this class's own join will tell
        # them when (an upstream-style override of the join would not).
        leave_with_peers = type(self)._join_processes is MultiProcessTestCase._join_processes
        for rank in range(world_size):
            control_parent, control_child = mp.Pipe()
            results_parent, results_child = mp.Pipe()  # duplex: LEAVE goes back on it
            files = worker.RankFiles.in_dir(self._work_dir, rank)
            try:
                process = proc(
                    target=worker.child_main,
                    name=f"process {rank}",
                    args=(class_ref(type(self)), rank, test_name, self.file_name,
                          control_child, results_child, files, os.getpid(), run_kwargs,
                          environ, leave_with_peers),
                )
                process.start()
            except Exception as exc:
                for conn in (control_parent, control_child, results_parent, results_child):
                    conn.close()
                raise RuntimeError(
                    f"could not start rank {rank} of {type(self).__qualname__}.{test_name}: "
                    f"{exc}{start_failure_hint(exc)}") from exc
            # Our copies of the child's ends must go, or end-of-file never arrives.
            control_child.close()
            results_child.close()
            logger.debug("started rank %s as pid %s", rank, process.pid)
            self.pid_to_pipe[process.pid] = control_parent
            self.processes.append(process)
            self._rank_processes.append(
                RankProcess(rank, process, control_parent, results_parent, files))

    def _spawn_processes(self) -> None:
        owner = type(self).__name__
        method = launch.resolve_start_method(type(self).start_method, f"{owner}.start_method")
        world_size = self._ranks_to_start()
        if world_size == 0:
            return  # the stand-in mode: upstream passes a world of no ranks
        check_rank_capacity(world_size, method, f"{owner}.world_size")
        threads_per_rank(world_size)  # a bad setting fails here, before any start
        self._stall_window_s = stall.window_for(type(self))
        self._started_at = time.monotonic()
        self._start_processes(launch.process_class(method, type(self).__module__))

    def _ranks_to_start(self) -> int:
        return ranks_to_start(self.world_size, f"{type(self).__name__}.world_size",
                              type(self).upstream_verdicts)

    def _ranks_started_upstream_way(self) -> list[RankProcess]:
        """Handles for ranks a subclass's own ``_start_processes`` put in
        ``self.processes`` and ``self.pid_to_pipe``, as upstream's contract says."""
        handles = []
        for rank, process in enumerate(self.processes):
            pipe = self.pid_to_pipe.get(process.pid)
            if pipe is None:
                raise RuntimeError(
                    f"{type(self).__name__}._start_processes put process {process.pid} "
                    f"(rank {rank}) in self.processes but no pipe for it in "
                    "self.pid_to_pipe: the parent cannot hear from that rank. Map each "
                    "started process's pid to the parent's end of the pipe passed to it.")
            files = worker.RankFiles.in_dir(self._work_dir, rank)
            handles.append(RankProcess(rank, process, pipe, pipe, files, upstream_contract=True))
        return handles

    def _end_rank_processes(self) -> None:
        end_processes(getattr(self, "processes", []))
        for handle in getattr(self, "_rank_processes", []):
            handle.control.close()
            handle.results.close()
        self.processes = []
        self._rank_processes = []

    # -- inside a rank -------------------------------------------------------

    @staticmethod
    def _event_listener(parent_pipe, signal_pipe, rank: int) -> None:
        """Answers the parent's requests until the test ends (runs in each rank)."""
        while True:
            # Its pauses keep the rank's collective log (engine.collective_log).
            ready = wait([parent_pipe, signal_pipe], timeout=collective_log.HEARTBEAT_S)
            if not ready:
                collective_log.tick()
                continue
            if signal_pipe in ready:
                return
            try:
                event = parent_pipe.recv()
            except (EOFError, OSError):
                return  # the parent closed its end
            if event == Event.GET_TRACEBACK:
                with tempfile.TemporaryFile(mode="w+") as dump:
                    faulthandler.dump_traceback(dump, all_threads=True)
                    dump.seek(0)
                    parent_pipe.send(dump.read())

    @classmethod
    def _run(cls, rank: int, test_name: str, file_name: str, parent_pipe, **kwargs) -> None:
        self = cls(test_name)
        self.rank = rank
        self.file_name = file_name
        self.run_test(test_name, parent_pipe)

    def run_test(self, test_name: str, parent_pipe) -> None:
        stop_recv, stop_send = mp.Pipe(duplex=False)
        listener = threading.Thread(
            target=type(self)._event_listener,
            args=(parent_pipe, stop_recv, self.rank),
            daemon=True,
        )
        listener.start()
        worker.enable_native_crash_dump()
        keep_destroyed_groups()  # already done in distspawn's own rank processes
        set_rng_seed()
        try:
            getattr(self, test_name)()
            worker.leave_together()  # before the group goes: peers may still use it
        except unittest.SkipTest as skip:
            if worker.in_rank_process():
                worker.report_skip(str(skip))
            else:  # started upstream's way: its parent hears on this pipe (reason kept)
                _send_quietly(parent_pipe, RankReport(self.rank, test_name,
                                                      ReportStatus.SKIPPED, reason=str(skip)))
            sys.exit(TEST_SKIPS["generic"].exit_code)
        except Exception:
            formatted = worker.format_user_exception()
            if worker.in_rank_process():
                worker.report_failure(formatted)
            else:  # upstream's contract: the traceback, as a string, on this pipe
                _send_quietly(parent_pipe, formatted)
            sys.exit(self.TEST_ERROR_EXIT_CODE)
        finally:
            stop_send.send(None)
            listener.join()
            stop_send.close()
            stop_recv.close()
            parent_pipe.close()
        if self.destroy_pg_upon_exit and c10d.is_available() and c10d.is_initialized():
            c10d.destroy_process_group()
        if not worker.ends_without_finalizing():  # a forked rank just exits (see there)
            release_kept_groups()

    # -- in the parent -------------------------------------------------------

    def _join_processes(self, fn: Callable) -> None:
        if not self._rank_processes and self.processes:
            self._rank_processes = self._ranks_started_upstream_way()
        if not self._rank_processes:
            if self._ranks_to_start() == 0:
                return  # (the stand-in mode's pass, warned of at the start)
            test = f"{type(self).__name__}.{self._current_test_name()}"
            if type(self).upstream_verdicts:
                # Upstream's harness passes such a test without running its body
                # (it only logs that no subprocess was spawned); run unchanged, a
                # file gets that verdict, and the user a warning that says so.
                warn_passed_unrun(test, "rank processes", "_spawn_processes")
                return
            raise RuntimeError(
                f"{test} started no rank processes: call self._spawn_processes() in setUp, "
                "after super().setUp()"
            )
        timeout = get_timeout(self.id())
        # (A class that starts its ranks its own way may not have said when.)
        started_at = getattr(self, "_started_at", time.monotonic())
        policy = self._return_code_policy(fn)
        window = getattr(self, "_stall_window_s", None)  # (unset where ranks started elsewhere)
        supervisor = RankSupervisor(
            self._rank_processes, timeout, lambda outcome: is_decisive(outcome, policy),
            stall_window_s=stall.window_for(type(self)) if window is None else window)
        try:
            self._rank_outcomes = supervisor.watch()
            self._timeout_s = timeout
            self._check_return_codes(fn, time.monotonic() - started_at)
        finally:  # (after Ctrl-C, run() does the clean-ups unittest skips)
            for pipe in self.pid_to_pipe.values():
                pipe.close()

    def _matches(self, fn: Callable, registered) -> Any:
        # Upstream registers the original bound methods; accept names as well.
        name = getattr(fn, "__name__", None)
        for key in registered:
            if key == fn or key == name or getattr(key, "__name__", object()) == name:
                return key
        return None

    def _return_code_policy(self, fn: Callable) -> ReturnCodePolicy:
        special = self._matches(fn, self.special_return_code_checks)
        return ReturnCodePolicy(
            expected_exit_code=0 if special is None else self.special_return_code_checks[special],
            check_exit_codes=self._matches(fn, self.skip_return_code_checks) is None,
            skip_rule=self._skip_rule(),  # upstream's: rank 0's exit code alone decides
            skips_pass=IS_SANDCASTLE,
        )

    def _check_return_codes(self, fn: Callable, elapsed_time: float) -> None:
        """Turn the ranks' outcomes into this test's verdict (raise on fail / skip)."""
        __tracebackhide__ = True
        verdict = decide_verdict(self._rank_outcomes, self._return_code_policy(fn),
                                 process_words)
        if verdict.kind is VerdictKind.SKIP:
            raise unittest.SkipTest(verdict.message)
        if verdict.kind is VerdictKind.PASS:
            if verdict.message:
                logger.info("%s skipped on sandcastle: %s", self.id(), verdict.message)
            return
        header = f"{self.id()} failed after {elapsed_time:.1f}s"
        if any(o.timed_out for o in self._rank_outcomes):
            header += f" (deadline {self._timeout_s}s)"
        raise RankFailure(header, verdict, f"Re-run just this test:\n  {rerun_command(self)}")

    def _check_no_test_errors(self, elapsed_time: float) -> None:
        """Fail only if a rank raised or ran out of time (exit codes are not judged)."""
        __tracebackhide__ = True
        policy = ReturnCodePolicy(check_exit_codes=False)
        verdict = decide_verdict(self._rank_outcomes, policy, process_words)
        if verdict.kind is VerdictKind.FAIL:
            raise RankFailure(f"{self.id()} failed after {elapsed_time:.1f}s", verdict)

    @property
    def is_master(self) -> bool:
        return self.rank == 0

