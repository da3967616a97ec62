"""MultiThreadedTestCase and spawn_threads_and_init_comms: ranks as threads.

The TestCase glue over ``threaded_pg`` (the backend and its sessions) and
``verdict`` (the same pass / fail / skip rules as for rank processes). Each
test gets a fresh :class:`~distspawn.threaded_pg.ThreadedSession`; every rank
thread runs inside :func:`_rank_thread_main`, which records how the rank ended
on that session, so a result can never be attributed to another test.
"""

from __future__ import annotations

import ctypes
import logging
import os
import queue
import sys
import threading
import time
import traceback
import unittest
from dataclasses import dataclass, field
from functools import partial, wraps
from typing import Any, Callable

import torch.distributed as c10d

from ..backends import threaded_pg
from ..fixtures.environment import (
    DEFAULT_WORLD_SIZE,
    IS_SANDCASTLE,
    SEED,
    TIMEOUT_DEFAULT,
    get_timeout,
    restore_environ,
)
from ..engine.capacity import check_rank_capacity
from ..engine.capacity import validate_world_size
from .empty_world import ranks_to_start, warn_passed_unrun
from ..engine.protocol import RankReport, ReportStatus
from ..engine.exit_codes import skip_message_for
from .testcase import RankDispatchingTestCase
from ..backends.thread_rng import (
    ThreadRNG,
    current_thread_rng,
    install_thread_rng,
    uninstall_thread_rng,
)
from ..backends.threaded_pg import DeadlineReached, PeerFailed, ThreadedSession
from ..engine.verdict import (
    RankFailure,
    RankFailureAsUpstreamRaises,
    RankOutcome,
    ReturnCodePolicy,
    SkipRule,
    VerdictKind,
    decide_verdict,
    thread_words,
)
from ..engine.worker import exit_code_of, format_user_exception

__all__ = ["MultiThreadedTestCase", "spawn_threads_and_init_comms"]

logger = logging.getLogger(__name__)

# After a rank failed, how long the others get to stop before the verdict.
STOP_GRACE_S = 2.0
# After the first decisive failure, how long ranks still running their own
# code get to end by themselves (several failing together are then each named
# with their own error) before the harness interrupts them.
FAILURE_GRACE_S = 0.5


class RankTimedOut(TimeoutError):
    """A rank thread was still running at the test's deadline."""

    def __init__(self, rank: int, timeout: float, stack: str) -> None:
        super().__init__(f"rank {rank} did not finish within {timeout:g} s")
        self.stack = stack


@dataclass
class _SessionRecord:
    """What the rank threads of one session reported, in the order they did.

    The main thread sleeps on ``changed`` until every rank finished or one
    failed decisively; ranks notify only then, so it wakes once per test.
    """

    world_size: int
    failures: list = field(default_factory=list)  # (rank, exc_info)
    failed_at: dict = field(default_factory=dict)  # rank -> when its first failure came
    finished: set = field(default_factory=set)
    decisive: bool = False
    random_draws: int = 0  # random ops the ranks ran on their own generators
    changed: threading.Condition = field(default_factory=threading.Condition)

    def note_failure(self, rank: int, exc_info, decisive: bool) -> None:
        with self.changed:
            self.failures.append((rank, exc_info))
            self.failed_at.setdefault(rank, time.monotonic())
            if decisive:
                self.decisive = True
                self.changed.notify_all()

    def note_finished(self, rank: int) -> None:
        with self.changed:
            self.finished.add(rank)
            if len(self.finished) >= self.world_size:
                self.changed.notify_all()

    def running(self) -> list[int]:
        with self.changed:
            return [r for r in range(self.world_size) if r not in self.finished]

    def wait(self, until: float, predicate: Callable[[], bool]) -> None:
        with self.changed:
            self.changed.wait_for(predicate, max(0.0, until - time.monotonic()))


_context = threading.local()


def _begin_session(world_size: int, timeout: float) -> ThreadedSession:
    """A new session, installed, with seeding routed to each rank thread's RNG."""
    missing = threaded_pg.missing_threaded_hooks()
    if missing:
        raise unittest.SkipTest(
            "the threaded backend needs private torch hooks that this torch lacks: "
            + ", ".join(missing))
    session = ThreadedSession(world_size, timeout)
    # The record lives on its session: a late thread of an earlier test can
    # only ever write to its own test's record.
    session.harness_record = _SessionRecord(world_size)
    threaded_pg.install(session)
    install_thread_rng()
    return session


def _record_of(session: ThreadedSession) -> _SessionRecord:
    return session.harness_record


def _is_decisive(exc: BaseException) -> bool:
    """Whether this exception alone fails the test (so the other ranks may stop)."""
    if isinstance(exc, (unittest.SkipTest, PeerFailed, DeadlineReached)):
        return False  # DeadlineReached: the harness's own deadline names the stuck ranks
    if isinstance(exc, SystemExit):
        code = exit_code_of(exc)
        return code != 0 and skip_message_for(code) is None
    return True


def record_rank_failure(rank: int, exc_info) -> None:
    """Note that ``rank`` ended with ``exc_info`` in the running session."""
    session = getattr(_context, "session", None) or threaded_pg.active_session()
    if session is None:
        MultiThreadedTestCase.exception_queue.put((rank, exc_info))
        return
    decisive = _is_decisive(exc_info[1])
    if decisive:
        session.stop(f"rank {rank} raised {type(exc_info[1]).__name__}")
    _record_of(session).note_failure(rank, exc_info, decisive)


# Set to 1 to give all rank threads the process's one generator, as upstream
# does, for a run, without editing the classes (per_thread_rng = False does it
# for one class).
SHARED_RNG_VAR = "DISTSPAWN_SHARED_THREAD_RNG"

_SHARED_RNG_NOTE = (
    "Note: the rank threads drew random numbers, each from its own generator (distspawn's "
    "default, so that every rank sees what a rank process would). Upstream's harness "
    "shares one generator between threads; if this test relies on that, set "
    f"per_thread_rng = False on the class, or {SHARED_RNG_VAR}=1 for the run.")


def shared_rng_requested() -> bool:
    """Whether the environment asks for upstream's one shared generator."""
    value = os.environ.get(SHARED_RNG_VAR, "").strip().lower()
    if value in ("", "0", "false", "no"):
        return False
    if value in ("1", "true", "yes"):
        return True
    raise ValueError(f"{SHARED_RNG_VAR}={value!r}: expected 1 (share one generator, as "
                     "upstream) or 0 (a generator per rank thread, the default)")


def _rank_thread_main(session: ThreadedSession, rank: int, body: Callable[[], None],
                      go: threading.Event, own_rng: bool) -> None:
    try:
        go.wait()
        if own_rng:
            with ThreadRNG(SEED):
                _run_rank(session, rank, body)
        else:
            _run_rank(session, rank, body)
    except PeerFailed:
        pass  # an interrupt that landed after the rank had already reported


def _run_rank(session: ThreadedSession, rank: int, body: Callable[[], None]) -> None:
    _context.session, _context.rank = session, rank
    try:
        body()
    except BaseException:  # noqa: BLE001 - every way a rank ends is a result
        record_rank_failure(rank, sys.exc_info())
    finally:
        _context.session = _context.rank = None
        # How it ended, for deadlock reports: the rank's own first recorded failure.
        record = _record_of(session)
        rng = current_thread_rng()
        if rng is not None:
            with record.changed:
                record.random_draws += rng.draws
        first = next((e for r, (_, e, _) in record.failures if r == rank), None)
        how = ("passed" if first is None else "skipped" if isinstance(first, unittest.SkipTest)
               else f"raised {type(first).__name__}")
        session.rank_finished(rank, how)
        record.note_finished(rank)


def _start_rank_threads(session: ThreadedSession, world_size: int,
                        body: Callable[[int], None], label: str,
                        own_rng: bool = True) -> list[threading.Thread]:
    # Ranks wait for ``go`` so that starting the next thread does not compete for
    # the GIL with ranks already running their test.
    go = threading.Event()
    threads = []
    own_rng = own_rng and not shared_rng_requested()
    try:
        for rank in range(world_size):
            thread = threading.Thread(
                target=_rank_thread_main,
                args=(session, rank, partial(body, rank), go, own_rng),
                name=f"{label} rank {rank}", daemon=True)
            thread.start()
            threads.append(thread)
    finally:
        go.set()
    return threads


def _interrupt(thread: threading.Thread) -> None:
    """Raise PeerFailed inside ``thread`` at its next Python instruction (once)."""
    if thread.ident is None or not thread.is_alive() or getattr(thread, "_ds_stopped", False):
        return
    thread._ds_stopped = True
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread.ident), ctypes.py_object(PeerFailed))


_HIDDEN_FILES = (os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,
                 threading.__file__)


def _stack_of(thread: threading.Thread) -> str:
    frame = sys._current_frames().get(thread.ident)
    if frame is None:
        return "(no stack: the thread ended)"
    frames = traceback.extract_stack(frame)
    kept = [f for f in frames if not f.filename.startswith(_HIDDEN_FILES)]
    return "".join(traceback.format_list(kept or frames))


def _wait_for_ranks(session: ThreadedSession, threads: list[threading.Thread]) -> list:
    """Wait for the rank threads under one deadline; return (rank, exc_info) failures."""
    record = _record_of(session)
    deadline = session.deadline
    record.wait(deadline, lambda: record.decisive or not record.running())
    if record.decisive and record.running():
        # The verdict is known. Ranks waiting in a collective were woken by the
        # session's stop; ranks still running their own code get a moment to end
        # by themselves (a rank about to raise its own error is named with it,
        # never relabelled as interrupted); whoever is left is then stopped.
        record.wait(min(deadline, time.monotonic() + FAILURE_GRACE_S),
                    lambda: not record.running())
        reported = {rank for rank, _ in record.failures}
        for rank in record.running():
            if rank not in reported:
                _interrupt(threads[rank])
        record.wait(min(deadline, time.monotonic() + STOP_GRACE_S),
                    lambda: not record.running())
    at_deadline = time.monotonic() >= deadline
    if at_deadline and record.running():
        # Ranks blocked in a collective report their own timeout; give them a moment.
        record.wait(time.monotonic() + 1.0, lambda: not record.running())
        session.stop("the test's deadline passed")
    failures = list(record.failures)
    for rank in record.running():
        thread = threads[rank]
        if at_deadline:
            error = RankTimedOut(rank, session.timeout, _stack_of(thread))
            failures.append((rank, (RankTimedOut, error, None)))
        else:
            failures.append((rank, (PeerFailed, PeerFailed("still running"), None)))
        _interrupt(thread)
    return failures


def _outcomes(failures: list, world_size: int,
              failed_at: dict[int, float]) -> list[RankOutcome]:
    outcomes = {rank: RankOutcome(rank, report=RankReport(rank, "", ReportStatus.PASSED),
                                  exit_code=0)
                for rank in range(world_size)}
    seen: set[int] = set()
    for rank, exc_info in failures:
        exc = exc_info[1]
        if rank in seen:
            continue  # how a rank first ended is what counts (later: e.g. our interrupt)
        seen.add(rank)
        outcome = outcomes.setdefault(rank, RankOutcome(rank))
        outcome.failed_at = failed_at.get(rank)
        if isinstance(exc, RankTimedOut):
            outcome.timed_out, outcome.stack, outcome.exit_code = True, exc.stack, None
            outcome.stack_scope = "its thread"
            outcome.report = None
        elif isinstance(exc, PeerFailed):
            outcome.ended_by_harness, outcome.report, outcome.exit_code = True, None, None
        elif isinstance(exc, unittest.SkipTest):
            outcome.report = RankReport(rank, "", ReportStatus.SKIPPED, reason=str(exc))
            outcome.exit_code = 0
        elif isinstance(exc, SystemExit):
            code = exit_code_of(exc)
            outcome.report = RankReport(rank, "", ReportStatus.EXITED, exit_code=code)
            outcome.exit_code = code
        else:
            outcome.report = RankReport(rank, "", ReportStatus.FAILED,
                                        traceback=_format(exc_info))
            outcome.exit_code = 1
    return [outcomes[r] for r in sorted(outcomes)]


def _format(exc_info) -> str:
    try:
        raise exc_info[1].with_traceback(exc_info[2])
    except BaseException:  # noqa: BLE001 - re-raised only to format it
        return format_user_exception()


_NO_THREADS = ("no threaded world is running: call self._spawn_threads() in setUp, "
               "after super().setUp()")


class MultiThreadedTestCase(RankDispatchingTestCase):
    """Runs every test method on ``world_size`` threads of this process.

    Each thread is one rank of a ``threaded`` process group, initialised
    before the test body runs and destroyed after it. ``setUp`` and
    ``tearDown`` run once, in the main thread (``rank == MAIN_THREAD_RANK``);
    ``perThreadSetUp`` / ``perThreadTearDown`` run in each rank thread. A
    subclass's ``setUp`` must call ``self._spawn_threads()``.

    Verdicts follow the same rules as for rank processes; a collective that
    cannot complete fails the test with each rank's pending call instead of
    hanging. Threads share one process: ``os.environ``, global torch flags,
    CUDA generators, ``random``/``numpy.random`` and module state are shared
    between ranks; the c10d world is per thread, and so is the CPU random
    generator (seeded like a rank process; ``per_thread_rng = False`` shares
    it, as upstream does).
    """

    exception_queue: "queue.Queue" = queue.Queue()  # upstream's; kept for overrides
    MAIN_THREAD_RANK = -1
    # True: upstream's rule for ranks that disagree about skipping (one rank's
    # skip skips the test); by default that is a failure naming who skipped.
    lenient_skips: bool = False
    # Upstream's harness skips the test on the first rank's skip it meets.
    _UPSTREAM_SKIP_RULE = SkipRule.ANY_RANK
    # Each rank thread draws CPU random numbers from its own generator, seeded
    # like a rank process; False: all threads share the process's (upstream).
    per_thread_rng: bool = True
    # Where upstream's verdict differs from distspawn's on purpose, give
    # upstream's (the stand-in mode sets it, for files run unchanged).
    upstream_verdicts: bool = False

    @property
    def world_size(self) -> int:
        return DEFAULT_WORLD_SIZE

    @property
    def _current_test_name(self) -> str:
        return self.id().split(".")[-1]

    _MAIN_DESCRIPTION = "the main thread"

    def _is_main(self, rank: int) -> bool:
        return rank == self.MAIN_THREAD_RANK

    def _join_ranks(self, fn: Callable) -> None:
        if getattr(self, "_empty_world", False):
            return  # the stand-in mode: upstream passes a world of no ranks
        self._join_threads(self.threads, fn)

    def perThreadSetUp(self) -> None:  # noqa: N802 - upstream's name
        """Runs in each rank thread after its process group is initialised."""

    def perThreadTearDown(self) -> None:  # noqa: N802 - upstream's name
        """Runs in each rank thread after its process group is destroyed."""

    def setUp(self) -> None:
        super().setUp()
        self.rank = self.MAIN_THREAD_RANK
        self.threads: list[threading.Thread] = []
        previous = os.environ.get("TORCH_SHOW_CPP_STACKTRACES")
        os.environ["TORCH_SHOW_CPP_STACKTRACES"] = "1"
        self.addCleanup(restore_environ, {"TORCH_SHOW_CPP_STACKTRACES": previous})

    def tearDown(self) -> None:
        super().tearDown()
        self.threads = []

    def _spawn_threads(self) -> None:
        """Start the rank threads for the current test (call from setUp)."""
        world_size = ranks_to_start(self.world_size, f"{type(self).__name__}.world_size",
                                    type(self).upstream_verdicts)
        self._empty_world = world_size == 0
        if self._empty_world:
            return
        check_rank_capacity(world_size, None, f"{type(self).__name__}.world_size")
        session = _begin_session(world_size, float(get_timeout(self.id())))
        self.addCleanup(_end_session, session, self.threads)
        type(self).global_store = c10d.HashStore()
        test_name = self._current_test_name
        cls = type(self)
        self.threads.extend(_start_rank_threads(
            session, world_size, lambda rank: cls._run(test_name, rank, world_size),
            f"{cls.__name__}.{test_name}", own_rng=cls.per_thread_rng))

    @classmethod
    def _run(cls, test_name: str, rank: int, world_size: int, **kwargs: Any) -> None:
        self = cls(test_name)
        self.rank = rank
        if isinstance(getattr(self, "_tls", None), threading.local):
            # A class made by instantiate_device_type_tests keeps its precision
            # in a thread-local set in the thread that made the class: give
            # this rank's thread its own, at the defaults, as upstream's does.
            self._tls = threading.local()
            self._tls.precision = getattr(self, "_precision", 0)
            self._tls.rel_tol = getattr(self, "_rel_tol", 0)
        self.run_test_with_threaded_pg(test_name, rank, world_size)

    def run_test_with_threaded_pg(self, test_name: str, rank: int, world_size: int) -> None:
        """Run ``test_name`` as ``rank`` on a fresh threaded process group."""
        c10d.init_process_group(backend="threaded", rank=rank, world_size=world_size,
                                store=type(self).global_store)
        try:
            self.perThreadSetUp()
            getattr(self, test_name)()
        except BaseException:  # noqa: BLE001 - every way a rank ends is a result
            record_rank_failure(rank, sys.exc_info())
        finally:
            if c10d.is_initialized():
                c10d.destroy_process_group()
            self.perThreadTearDown()

    @classmethod
    def _join_threads(cls, threads: list[threading.Thread], fn: Callable) -> None:
        session = threaded_pg.active_session()
        if session is None:
            if cls.upstream_verdicts:
                # Upstream's harness passes such a test without running its body.
                warn_passed_unrun(getattr(fn, "__qualname__", fn), "rank threads",
                                  "_spawn_threads")
                return
            raise RuntimeError(_NO_THREADS)
        try:
            failures = _wait_for_ranks(session, threads)
        finally:
            _end_session(session, threads)
        while not cls.exception_queue.empty():  # upstream-style overrides put here
            failures.append(cls.exception_queue.get())
        record = _record_of(session)
        cls._check_return_codes(failures, session.timeout, fn, world_size=len(threads),
                                failed_at=record.failed_at, random_draws=record.random_draws)

    @classmethod
    def _check_return_codes(cls, failed_ranks: list, timeout: float, fn: Callable,
                            world_size: int | None = None,
                            failed_at: dict[int, float] | None = None,
                            random_draws: int = 0) -> None:
        """Raise on a failing or skipped test, from each rank's (rank, exc_info).

        ``failed_at`` (rank -> monotonic time) orders the failing ranks, first first;
        ``random_draws`` > 0 (ranks drew from their own generators) adds a note on
        how upstream's shared generator differs.
        """
        __tracebackhide__ = True
        if world_size is None:
            world_size = max([rank for rank, _ in failed_ranks], default=-1) + 1
        policy = ReturnCodePolicy(skip_rule=cls._skip_rule(), skips_pass=IS_SANDCASTLE)
        verdict = decide_verdict(_outcomes(failed_ranks, world_size, failed_at or {}),
                                 policy, thread_words)
        if verdict.kind is VerdictKind.SKIP:
            raise unittest.SkipTest(verdict.message)
        if verdict.kind is VerdictKind.PASS:
            if verdict.message:
                logger.info("%s skipped on sandcastle: %s", fn, verdict.message)
            return
        name = getattr(fn, "__qualname__", getattr(fn, "__name__", str(fn)))
        header = f"{name} failed on the threaded backend"
        if any(isinstance(e, RankTimedOut) for _, (_, e, _) in failed_ranks):
            header += f" (deadline {timeout:g} s)"
        failure = RankFailureAsUpstreamRaises if cls.upstream_verdicts else RankFailure
        raise failure(header, verdict, _SHARED_RNG_NOTE if random_draws else "")

    def assertEqualOnRank(self, x: Any, y: Any, msg: Any = None, *, rank: int = 0) -> None:  # noqa: N802
        """``assertEqual`` checked on ``rank`` only."""
        if self.rank == rank:
            self.assertEqual(x, y, msg)

    def assertNotEqualOnRank(self, x: Any, y: Any, msg: Any = None, *,  # noqa: N802
                             rank: int = 0) -> None:
        """``assertNotEqual`` checked on ``rank`` only."""
        if self.rank == rank:
            self.assertNotEqual(x, y, msg)


def _end_session(session: ThreadedSession, threads: list[threading.Thread]) -> None:
    # Called twice for most tests (the join's finally, then the clean-up setUp
    # added): where the first already gave stuck threads their grace, the
    # second waiting for them again only doubled a hung test's stop.
    ending_now = threaded_pg.active_session() is session
    session.stop("the test ended")
    for rank, thread in enumerate(threads):
        if ending_now and not session.has_finished(rank):
            _interrupt(thread)
    # Interrupted threads usually end within moments; do not leave them to the next test.
    give_up = time.monotonic() + (STOP_GRACE_S if ending_now else 0.0)
    for thread in threads:
        thread.join(max(0.0, give_up - time.monotonic()))
    uninstall_thread_rng()
    threaded_pg.uninstall(session)


def spawn_threads_and_init_comms(func: Callable | None = None,
                                 timeout: float = TIMEOUT_DEFAULT,
                                 world_size: int = DEFAULT_WORLD_SIZE) -> Callable:
    """Decorate a test method to run on ``world_size`` rank threads.

    Usable bare (``@spawn_threads_and_init_comms``) or with arguments
    (``@spawn_threads_and_init_comms(world_size=2, timeout=10)``). Each thread
    initialises a ``threaded`` process group, runs the method, and destroys
    the group; the whole run ends by ``timeout`` seconds.
    """
    world_size = validate_world_size(world_size, "spawn_threads_and_init_comms(world_size=...)")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ValueError("spawn_threads_and_init_comms(timeout=...) must be a positive "
                         f"number of seconds, got {timeout!r}")
    if func is None:
        return partial(spawn_threads_and_init_comms, timeout=timeout, world_size=world_size)

    @wraps(func)
    def wrapper(self, *args, **kwargs):
        session = _begin_session(world_size, float(timeout))
        store = c10d.HashStore()

        def body(rank: int) -> None:
            c10d.init_process_group("threaded", rank=rank, world_size=world_size,
                                    store=store)
            try:
                func(self, *args, **kwargs)
            finally:
                if c10d.is_initialized():
                    c10d.destroy_process_group()

        threads: list[threading.Thread] = []
        try:
            threads = _start_rank_threads(session, world_size, body, func.__qualname__)
        except BaseException:
            _end_session(session, threads)
            raise
        MultiThreadedTestCase._join_threads(threads, func)

    return wrapper
