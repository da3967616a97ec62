"""Ending rank processes: after a verdict, or while the test process is stopped.

A verdict ends ranks as upstream's harness does, with SIGTERM. A test process
stopped by an exception (Ctrl-C; SIGTERM, which distspawn raises as
KeyboardInterrupt; pytest-timeout's ``Failed: Timeout``) first interrupts its
ranks, so that their finally and with blocks run, and gives them time to
unwind. How much time is read from each rank's scheduler state, not fixed: a
rank asleep in a wait that an interrupt cannot end (a collective in native
code) is ended after a short grace, while one still at work on its unwinding
(running, or waiting for the disk on a loaded machine) gets longer.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess

from ..early import rank_server_boot

# How long ranks get to exit after SIGTERM before SIGKILL.
TERMINATE_GRACE_S = 3.0
# A stopped test process: how long every interrupted rank gets to unwind...
INTERRUPT_GRACE_S = 1.0
# ...and how long in all one that is still at work on it may take.
UNWIND_LIMIT_S = 5.0
# A rank is taken to have stopped working on its unwinding once this many
# samples in a row (UNWIND_SAMPLE_S apart) find it asleep: a thread waiting
# for the GIL sleeps too, for a moment.
ASLEEP_SAMPLES = 3
UNWIND_SAMPLE_S = 0.1
# Scheduler states (proc(5)) of a process at work: running or runnable, and
# uninterruptible sleep, which is mostly disk I/O (a page fault, a journal
# commit) on a loaded machine.
WORKING_STATES = frozenset("RD")


def wait_for_exits(processes: list[BaseProcess], timeout: float) -> None:
    """Wait until every given process has exited, or ``timeout`` seconds have
    passed: each gets the whole time (``wait()`` alone returns at the first exit)."""
    stop_by = time.monotonic() + timeout
    pending = [p.sentinel for p in processes]
    while pending and (left := stop_by - time.monotonic()) > 0:
        for ready in wait(pending, timeout=left):
            pending.remove(ready)


def scheduler_state(pid: int) -> str | None:
    """The one-letter state of ``pid``'s main thread (``R``, ``S``, ``D``, ...),
    or None where it cannot be read (no /proc; the process is gone)."""
    fields = rank_server_boot.proc_stat_fields(pid)
    return fields[0].decode("ascii", "replace") if fields else None


def wait_while_unwinding(processes: list[BaseProcess]) -> None:
    """After an interrupt: give the processes :data:`INTERRUPT_GRACE_S` to
    exit, then longer, up to :data:`UNWIND_LIMIT_S` in all, while any of those
    left is still at work (its state is in :data:`WORKING_STATES`)."""
    give_up = time.monotonic() + UNWIND_LIMIT_S
    wait_for_exits(processes, INTERRUPT_GRACE_S)
    asleep_in_a_row = 0
    while asleep_in_a_row < ASLEEP_SAMPLES and time.monotonic() < give_up:
        live = [p for p in processes if p.exitcode is None]
        if not live:
            return
        working = any(scheduler_state(p.pid) in WORKING_STATES for p in live)
        asleep_in_a_row = 0 if working else asleep_in_a_row + 1
        wait_for_exits(live, UNWIND_SAMPLE_S)


def end_processes(processes: list[BaseProcess]) -> None:
    """SIGTERM the given live processes, SIGKILL what is left after a grace, reap all.

    Called while an exception stops the test process, the processes are
    interrupted first and given time to unwind (:func:`wait_while_unwinding`).
    """
    live = [p for p in processes if p.exitcode is None]
    if live and sys.exc_info()[1] is not None:
        # A terminal's Ctrl-C reaches every process of its group, and upstream's
        # ranks unwind from it: a temporary folder a rank holds in a with block
        # is removed. SIGTERM's default ends a rank on the spot, so before it
        # they get the interrupt too (it reaches them twice after a Ctrl-C;
        # worker.interrupt_once counts one) and a moment to act on it. A rank
        # blocked in native code (a collective) acts on it only once that
        # returns: it is ended once it is seen asleep after the grace.
        for process in live:
            try:
                os.kill(process.pid, signal.SIGINT)
            except ProcessLookupError:
                pass
        wait_while_unwinding(live)
        live = [p for p in live if p.exitcode is None]
    for process in live:
        process.terminate()
    wait_for_exits(live, TERMINATE_GRACE_S)
    for process in live:
        if process.exitcode is None:
            process.kill()
        process.join()
