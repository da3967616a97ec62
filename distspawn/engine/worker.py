"""Child side: the entry point of every rank process.

``child_main`` prepares the process (output to a per-rank log, a stack dump on
request, death with the parent), hands over to the test class's ``_run``
override point, and makes sure exactly one :class:`RankReport` reaches the
parent however the test ends.
"""

from __future__ import annotations

import faulthandler
import multiprocessing.forkserver
import os
import signal
import sys
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from . import cuda_refusal, forked_exit, leftovers, parent_death, reduce_ops
from .collective_log import start_recording, write_final_summary
from .exit_codes import TEST_ERROR_EXIT_CODE
from .group_keeper import free_groups_before_shutdown, keep_destroyed_groups
from .rank_threads import RankEnvironment, apply_thread_count
from .protocol import DEPARTING, LEAVE, RankReport, ReportStatus

# Signal a rank answers by writing every thread's Python stack to its stack file.
# It works where a Python thread could not run (a rank stuck in native code).
STACK_DUMP_SIGNAL = getattr(signal, "SIGUSR1", None)
# SIGINTs closer together than this are one interrupt (see interrupt_once).
INTERRUPT_WINDOW_S = 2.0


@dataclass(frozen=True)
class RankFiles:
    """Where one rank writes its combined stdout/stderr, stack dumps, crash stack
    and recorded collectives (``collective_log``)."""

    log_path: str
    stack_path: str
    crash_path: str | None = None
    collectives_path: str | None = None

    @classmethod
    def in_dir(cls, directory: str, rank: int) -> "RankFiles":
        """The files of ``rank`` in ``directory`` (removed with it)."""
        base = os.path.join(directory, f"rank-{rank}")
        return cls(f"{base}.log", f"{base}.stack", f"{base}.crash", f"{base}.collectives")


class ResultReporter:
    """Sends this rank's single report to the parent; later reports are ignored."""

    def __init__(self, conn: Connection, rank: int, test_name: str) -> None:
        self._conn = conn
        self._rank = rank
        self._test_name = test_name
        self.sent = False

    def send(self, status: ReportStatus, **details: Any) -> None:
        if self.sent:
            return
        self.sent = True
        report = RankReport(self._rank, self._test_name, status,
                            reduce_ops=reduce_ops.take(), **details)
        # Before the report: once the parent has it, the log says what this
        # rank last did (a peer may be left waiting for more).
        write_final_summary()
        try:
            self._conn.send(report)
        except (OSError, ValueError):
            pass  # parent already gone: nobody left to tell

    def wait_to_leave(self) -> None:
        """Tell the parent this rank is done, and wait until it says to leave."""
        try:
            self._conn.send(DEPARTING)
            while self._conn.recv() != LEAVE:
                pass
        except (OSError, EOFError, ValueError):
            pass  # the parent is gone: nothing to wait for

    def close(self) -> None:
        self._conn.close()


_reporter: ResultReporter | None = None
# Set when the parent coordinates this rank's departure (see leave_together).
_leaves_with_peers = False


def leave_together() -> None:
    """Wait until every rank of this test is done with it (once per rank).

    A rank that finished first with its process group still open stays until
    the others finish too: a peer still connecting to it (gloo builds a full
    mesh lazily) would otherwise see it vanish and fail with "Connection closed
    by peer". A rank that failed does not wait, and the parent frees waiting
    ranks once one rank has exited.
    """
    global _leaves_with_peers
    coordinated, _leaves_with_peers = _leaves_with_peers, False
    dist = sys.modules.get("torch.distributed")
    if not coordinated or _reporter is None or dist is None or not (
            dist.is_available() and dist.is_initialized()):
        return  # no group left open (none made, or the test destroyed it): nothing to keep
    _reporter.wait_to_leave()


def in_rank_process() -> bool:
    """True inside a rank process started by distspawn."""
    return _reporter is not None


def report_failure(formatted_traceback: str) -> None:
    """Record that the running test raised (no-op outside a rank process)."""
    if _reporter is not None:
        _reporter.send(ReportStatus.FAILED, traceback=formatted_traceback)


def report_skip(reason: str) -> None:
    """Record that the running test skipped itself (no-op outside a rank process)."""
    if _reporter is not None:
        _reporter.send(ReportStatus.SKIPPED, reason=reason)


def exit_code_of(exc: SystemExit) -> int:
    """The process exit status ``sys.exit(exc.code)`` produces."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    return 1  # sys.exit("message") prints the message and exits 1


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # distspawn/
# distspawn's own test suite is test code, not harness: its frames stay in reports.
_SUITE_PATHS = (os.path.join(_PACKAGE_DIR, "conformance") + os.sep,
                os.path.join(_PACKAGE_DIR, "distributed_test.py"))


def is_harness_frame(filename: str) -> bool:
    """Whether a frame in ``filename`` is distspawn's own (not its test suites')."""
    return filename.startswith(_PACKAGE_DIR) and not filename.startswith(_SUITE_PATHS)


def format_user_exception() -> str:
    """The exception being handled, formatted without distspawn's own frames."""
    exc = sys.exc_info()[1]
    summary = traceback.TracebackException.from_exception(exc)
    for part in _chain(summary):
        kept = [f for f in part.stack if not is_harness_frame(f.filename)]
        part.stack = traceback.StackSummary.from_list(kept or list(part.stack))
    text = "".join(summary.format())
    return text + cuda_refusal.note_for(text)


def _chain(summary: traceback.TracebackException):
    seen = set()
    while summary is not None and id(summary) not in seen:
        seen.add(id(summary))
        yield summary
        summary = summary.__cause__ or summary.__context__


def resolve_class(ref: Any) -> type:
    """The test class a rank runs: given, or found by the reference it was sent.

    A reference is anything with a ``resolve()`` method (the test case layer
    sends one, so that the test module is imported only once the rank has
    taken the test process's environment).
    """
    return ref if isinstance(ref, type) else ref.resolve()


def adopt_environment(environ: dict[str, str] | None) -> None:
    """Take the test process's environment as it was when it started this rank."""
    if environ is not None and environ != os.environ:
        os.environ.clear()
        os.environ.update(environ)


def _release_forkserver_keepalive() -> None:
    # A process forked by multiprocessing's forkserver (or forked from a test
    # process that runs one) holds a copy of the pipe end whose closing tells
    # the server that the test process is gone. While any rank held it, a
    # SIGKILLed test process left the server, and so every rank (whose
    # parent-death signal watches the server), running. A rank never starts
    # processes through its parent's server (multiprocessing starts a new
    # one there), so it lets go. Private to multiprocessing: where it is
    # missing, nothing is released and ranks end with the test body instead.
    server = getattr(multiprocessing.forkserver, "_forkserver", None)
    keepalive_fd = getattr(server, "_forkserver_alive_fd", None)
    if keepalive_fd is None:
        return
    try:
        os.close(keepalive_fd)
    except OSError:
        pass
    server._forkserver_alive_fd = None


def _die_with_parent(parent_pid: int) -> None:
    """Tie this rank's life to the test process's, however that process ends."""
    _release_forkserver_keepalive()
    # A forked rank inherits the test process's SIGTERM handler (which stops a
    # run as Ctrl-C would); a rank must end on SIGTERM, as a fresh one does.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    # If the parent is killed outright it cannot end us; let the kernel do it.
    if not parent_death.end_with_parent():
        return
    # The kernel watches our direct parent: the test process under spawn and
    # fork, the server under forkserver (which exits when the test process
    # does). Either way, the test process must still be there now.
    try:
        os.kill(parent_pid, 0)
    except ProcessLookupError:
        os._exit(1)  # it died before the request took effect


def forked_process() -> bool:
    """True in a process started by ``fork`` or ``forkserver``: multiprocessing
    ends it through ``os._exit``, so its interpreter is never shut down."""
    forked = (multiprocessing.context.ForkProcess, multiprocessing.context.ForkServerProcess)
    return isinstance(multiprocessing.current_process(), forked)


def ends_without_finalizing() -> bool:
    """True in a distspawn rank forked by ``fork`` or ``forkserver``: it leaves
    through ``os._exit`` right after its test, so nothing left alive in it is
    ever torn down (no destructor, no interpreter shutdown)."""
    return _reporter is not None and forked_process()


def _destroy_process_group() -> None:
    # A group left to interpreter shutdown (spawned ranks shut the interpreter
    # down) can abort there: "terminate called without an active exception"
    # from a gloo thread. Torn down here, after every rank is done, it cannot.
    # A forked rank skips the teardown: every rank is done with the group, and
    # gloo's destructor takes 10-40 ms a rank, a third of a trivial test.
    if ends_without_finalizing():
        return
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - the rank's report is already sent
        pass
    free_groups_before_shutdown()


def _redirect_output(log_path: str) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _register_stack_dump(stack_path: str):
    if STACK_DUMP_SIGNAL is None:
        return None
    stack_file = open(stack_path, "w")  # noqa: SIM115 - must live as long as the process
    faulthandler.register(STACK_DUMP_SIGNAL, file=stack_file, all_threads=True, chain=False)
    return stack_file


def _record_python_stack_on_crash(crash_path: str | None) -> None:
    # A fatal signal (SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL) writes every
    # thread's Python stack here before the process dies; the report shows it
    # first. Handlers installed later (torch's native dump) run before this
    # one and then hand the signal on, so both are kept.
    if crash_path is None:
        return
    crash_file = open(crash_path, "w")  # noqa: SIM115 - must live as long as the process
    faulthandler.enable(file=crash_file, all_threads=True)


def enable_native_crash_dump() -> None:
    """Have torch print native frames into the rank's output on a fatal signal."""
    torch_c = getattr(sys.modules.get("torch"), "_C", None)
    hook = getattr(torch_c, "_set_print_stack_traces_on_fatal_signal", None)
    if sys.platform.startswith("linux") and hook is not None:
        hook(True)
        # torch's dump answers SIGINT too, before Python's handler: every
        # thread's native stack after a mere Ctrl-C. With it in place, a
        # reused rank given the terminal's Ctrl-C and the test process's at
        # once sometimes did not unwind within the grace (1 run in 16 on a
        # loaded machine; none in 90 without it). SIGINT is not a crash: it
        # goes back to Python's handler.
        interrupt_once()
    os.environ["TORCH_SHOW_CPP_STACKTRACES"] = "1"


_last_interrupt = float("-inf")


def _on_sigint(signum: int, frame: Any) -> None:
    global _last_interrupt
    now = time.monotonic()
    repeated, _last_interrupt = now - _last_interrupt < INTERRUPT_WINDOW_S, now
    if not repeated:
        raise KeyboardInterrupt


def interrupted_since(moment: float) -> bool:
    """Whether a SIGINT reached this rank after ``moment`` (``time.monotonic()``)."""
    return _last_interrupt > moment


def interrupt_once() -> None:
    """Make SIGINTs that reach this rank within :data:`INTERRUPT_WINDOW_S` of
    each other one interrupt.

    A Ctrl-C at a terminal reaches a rank twice: from the terminal (a rank is
    in the test process's group) and from the test process, which interrupts
    its ranks as it stops (``ending.end_processes``). The second, raised
    while the rank is unwinding from the first, would cut its finally and
    with blocks short. Further apart, each SIGINT interrupts, as Python's own
    handler does. A handler the rank's code set is left alone. SIGINT ignored
    is taken over too: a test process started in the background by a shell
    without job control (``pytest &`` in a CI script) inherits it ignored, and
    so do its ranks, which could then never be asked to unwind.
    """
    if signal.getsignal(signal.SIGINT) in (signal.default_int_handler, _on_sigint,
                                           signal.SIG_IGN):
        signal.signal(signal.SIGINT, _on_sigint)


def prepare_rank_process(files: RankFiles, parent_pid: int,
                         environ: RankEnvironment | None, own_log_thread: bool = False):
    """Everything a rank process does before its first test, fresh or reused.

    ``own_log_thread``: the rank has no event listener to keep its collective
    log (a reused worker). Returns the open stack-dump file (None where there
    is no dump signal).
    """
    _die_with_parent(parent_pid)
    interrupt_once()
    if forked_process():
        forked_exit.note_inherited()
    if environ is not None:
        adopt_environment(environ.variables)
        apply_thread_count(environ.threads)
    _redirect_output(files.log_path)
    _record_python_stack_on_crash(files.crash_path)
    keep_destroyed_groups()
    start_recording(files.collectives_path, own_thread=own_log_thread)
    return _register_stack_dump(files.stack_path)


def child_main(
    cls: Any,
    rank: int,
    test_name: str,
    file_name: str,
    control_conn: Connection,
    result_conn: Connection,
    files: RankFiles,
    parent_pid: int,
    run_kwargs: dict[str, Any],
    environ: RankEnvironment | None = None,
    leave_with_peers: bool = False,
) -> None:
    """Run one rank of one test; the target of every rank process.

    ``environ`` is the parent's environment when it started the ranks: a rank
    forked from a long-lived server would otherwise see the server's, which
    misses whatever the test's setUp exported (TEMP_DIR, WORLD_SIZE, ...).
    ``leave_with_peers``: the parent coordinates the ranks' departure
    (:func:`leave_together`).
    """
    global _reporter, _leaves_with_peers
    _leaves_with_peers = leave_with_peers
    stack_file = prepare_rank_process(files, parent_pid, environ)
    _reporter = reporter = ResultReporter(result_conn, rank, test_name)
    try:
        cls = resolve_class(cls)
        leftovers.watch_torchs_exit_folders()  # its imports' folders, if it is killed
        cls._run(rank, test_name, file_name, control_conn, **run_kwargs)
    except SystemExit as exc:
        code = exit_code_of(exc)
        reporter.send(ReportStatus.EXITED, exit_code=code)
        if code != TEST_ERROR_EXIT_CODE:
            leave_together()  # a skip, or an exit code the test may expect
        _destroy_process_group()
        raise
    except BaseException:
        # Only reached when an override of run_test lets an exception escape.
        reporter.send(ReportStatus.FAILED, traceback=traceback.format_exc())
        raise SystemExit(TEST_ERROR_EXIT_CODE) from None
    else:
        reporter.send(ReportStatus.PASSED)
        leave_together()
        _destroy_process_group()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        reporter.close()
        _reporter = None
        if stack_file is not None:
            faulthandler.unregister(STACK_DUMP_SIGNAL)
            stack_file.close()
        forked_exit.run_own()  # forked: multiprocessing leaves through os._exit next
