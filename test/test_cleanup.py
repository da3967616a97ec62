"""Nothing outlives its test: processes, temp dirs, store files; Ctrl-C ends the ranks."""

import multiprocessing
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

from harness import (MARKER_VAR, MAX_LOAD_FACTOR, SCENARIOS, is_torch_cache, load_factor,
                     processes_with_marker, run_python)


def test_fifty_harness_tests_leave_nothing_behind():
    # fork keeps fifty tests quick; what is checked here is the parent's clean-up,
    # which is the same for every start method (spawn runs are checked elsewhere).
    run = run_python(["many.py"], env={"DISTSPAWN_START_METHOD": "fork"})
    assert "Ran 50 tests" in run.output, run.output
    assert "FAILED (failures=20, skipped=10)" in run.output, run.output
    assert run.leftover_files == []
    assert run.leftover_pids == []


@pytest.mark.parametrize("start_method", ["forkserver", "fork"])
def test_an_interrupt_in_setup_after_the_ranks_started_leaves_no_rank_and_no_file(
        start_method):
    # Seen with SIGINT sent to the process group under fork: the signal can
    # land before the join, where unittest alone would skip every clean-up.
    run = run_python(["interrupt_in_setup.py"], env={"DISTSPAWN_START_METHOD": start_method},
                     timeout=120)
    assert "KeyboardInterrupt" in run.output, run.output
    assert run.leftover_files == [], run.output
    assert run.leftover_pids == []


def test_a_spawned_rank_frees_its_garbage_groups_before_interpreter_shutdown(tmp_path):
    report = tmp_path / "freed"
    run = run_python(["shutdown_garbage.py"], env={"GARBAGE_REPORT": str(report)},
                     timeout=180)
    assert run.returncode == 0, run.output
    for rank in (0, 1):
        freed = Path(f"{report}.{rank}")
        assert freed.exists(), f"rank {rank} never freed its group\n{run.output}"
        assert freed.read_text() == "shutting down: False"


def _alive(pid):
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0]
    except OSError:
        return False
    return state != "Z"


def _still_alive_after(pids, timeout):
    """The pids still alive once each had ``timeout`` seconds to exit (pidfd waits)."""
    deadline = time.monotonic() + timeout
    for pid in pids:
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            continue
        try:
            select.select([pidfd], [], [], max(0.0, deadline - time.monotonic()))
        finally:
            os.close(pidfd)
    return [pid for pid in pids if _alive(pid)]


def _read_pids(fifo, count, timeout=120):
    # Read-write: the FIFO never reports end-of-file, so select waits for data.
    reader = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
    pids, buffer = [], b""
    deadline = time.monotonic() + timeout
    try:
        while len(pids) < count and time.monotonic() < deadline:
            ready, _, _ = select.select([reader], [], [], 1.0)
            try:
                buffer += os.read(reader, 1024) if ready else b""
            except BlockingIOError:
                continue
            pids = [int(p) for p in buffer.split()]
    finally:
        os.close(reader)
    return pids


# (signal, sent to the process group rather than the pid, seconds allowed)
STOPS = {
    "SIGKILL to the pid": (signal.SIGKILL, False, 2.0),
    # A CI job's limit: the test process, its rank server and ranks at once
    # (torch 2.8's server holds a folder only its own exit removes).
    "SIGKILL to the group": (signal.SIGKILL, True, 2.0),
    "SIGINT to the pid": (signal.SIGINT, False, 3.0),
    "SIGINT to the group": (signal.SIGINT, True, 3.0),
    "SIGTERM to the pid": (signal.SIGTERM, False, 3.0),
}
TIERS = [("fresh", "forkserver"), ("fresh", "spawn"), ("fresh", "fork"),
         ("reused", "forkserver"), ("reused", "spawn")]


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("stop", list(STOPS))
@pytest.mark.parametrize("tier, start_method", TIERS)
def test_a_stopped_test_process_leaves_no_rank_and_no_file(tier, start_method, stop):
    sig, to_group, promised_s = STOPS[stop]
    # The promise, scaled on a loaded machine (harness.load_factor): by the
    # load before the stop or after it, the larger, since on a CI runner the
    # load changes while the processes end (CI once measured 1.8 before a stop
    # that took 5.8 s against 3 s promised).
    load_before = load_factor()
    # Unique to this run: rows that send the same signal may run at once on
    # other xdist workers, and the clean-up below kills every marked process.
    marker = f"stop-{tier}-{start_method}-{uuid.uuid4().hex}"
    with tempfile.TemporaryDirectory() as tmp:
        fifo = os.path.join(tmp, "pids")
        os.mkfifo(fifo)
        # A rank's own temporary folder, left to its with block: a stop it can
        # unwind from removes it (a terminal's Ctrl-C does on upstream's harness).
        env = {**os.environ, "PID_FIFO": fifo, "TMPDIR": tmp, MARKER_VAR: marker,
               "INTERRUPT_TIER": tier, "DISTSPAWN_START_METHOD": start_method,
               "INTERRUPT_USER_TEMP": "0" if sig == signal.SIGKILL else "1"}
        # SIGINT at its default in the child: a suite started as a background
        # job (where bash ignores SIGINT) would hand SIG_IGN on to it.
        parent = subprocess.Popen([sys.executable, "interrupt.py"], cwd=SCENARIOS, env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  start_new_session=to_group, preexec_fn=_default_sigint)
        try:
            pids = _read_pids(fifo, 2)
            assert len(pids) == 2, "the ranks never started"
            stopped = time.monotonic()
            if to_group:
                os.killpg(parent.pid, sig)
            else:
                parent.send_signal(sig)
            parent.wait(timeout=30)
            # Waits (on pidfds, not a timer) for what is still alive to exit,
            # as long as the most loaded machine could need: what is alive
            # after that was left behind.
            left = processes_with_marker(marker, settle_s=promised_s * MAX_LOAD_FACTOR)
            took = time.monotonic() - stopped
            allowed_s = promised_s * max(load_before, load_factor())
        finally:
            parent.kill()
            parent.wait()
            for pid in processes_with_marker(marker, settle_s=0):
                os.kill(pid, signal.SIGKILL)
        assert left == [], f"still running {took:.1f} s after {stop}: {left}"
        assert took <= allowed_s, f"everything ended only {took:.1f} s after {stop}"
        # A rank in the middle of exiting may no longer show its environment.
        assert _still_alive_after(pids, allowed_s) == []
        # A SIGKILLed process cannot remove its own files: its watcher
        # (engine.leftovers) does, before it ends.
        files = [p.name for p in Path(tmp).iterdir() if not is_torch_cache(Path(p.name))]
        assert files == ["pids"]


@pytest.mark.parametrize("tier, sigint", [("fresh", "default"), ("reused", "default"),
                                          ("fresh", "ignored"), ("reused", "ignored")])
def test_an_exception_that_stops_the_wait_says_where_each_rank_was_and_lets_them_unwind(
        tier, sigint):
    # pytest-timeout's signal method raises in the test process while its ranks
    # run, and dumps only that process's stacks: the exception carries each
    # rank's, and the ranks' own with blocks still remove their folders. Also
    # where the test process ignores SIGINT, as a CI script's "pytest &" does:
    # both ranks' folders were left there, each rank ignoring the interrupt.
    run = run_python(["stopped_by_exception.py", "-v"],
                     env={"STOPPED_TIER": tier,
                          "STOPPED_SIGINT_IGNORED": "1" if sigint == "ignored" else "0"},
                     timeout=120)
    shown = "StoppedByPlugin: the wait was stopped by a plugin's timeout\n"
    assert shown in run.output, run.output
    note = run.output.split(shown, 1)[1]
    assert note.startswith("distspawn: 2 of 2 ranks (ranks 0, 1) still ran when this "
                           "stopped the test process's wait for them"), run.output
    for rank, next_heading in (("0", "rank 1: in its test"), ("1", "-" * 20)):
        part = note.split(f"rank {rank}: in its test\n", 1)[1].split(next_heading, 1)[0]
        assert "its stack when the wait was stopped (all threads):" in part, run.output
        assert re.search(r'stopped_by_exception\.py", line \d+ in test_hang', part), run.output
    # Upstream's reused ranks would still be in test_hang: every later test of
    # the class waits for them until its own timeout.
    assert run.verdict_line("test_next").endswith("ok"), run.output
    assert run.leftover_files == [] and run.leftover_pids == [], run.output


@pytest.mark.parametrize("tier", ["fresh", "reused"])
def test_a_rank_still_at_work_on_its_unwinding_gets_past_the_first_second(tier):
    # On a loaded machine a rank's finally and with blocks can take longer than
    # the 1 s an interrupted rank gets (CI saw both ranks' folders left). One
    # that is visibly at work (running, or waiting for the disk) gets longer.
    run = run_python(["stopped_by_exception.py", "-v"],
                     env={"STOPPED_TIER": tier, "STOPPED_UNWIND": "busy"}, timeout=120)
    assert "StoppedByPlugin: the wait was stopped by a plugin's timeout\n" in run.output, \
        run.output
    assert run.verdict_line("test_next").endswith("ok"), run.output
    assert run.leftover_files == [] and run.leftover_pids == [], run.output


def _asleep_through_interrupts():
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Event().wait()


def test_an_interrupted_rank_asleep_in_a_wait_is_ended_after_the_grace_not_the_limit():
    # Ranks hung in a collective sleep in native code an interrupt cannot end:
    # a Ctrl-C or a plugin's timeout ends them after INTERRUPT_GRACE_S, as
    # before, not after UNWIND_LIMIT_S.
    from distspawn.engine import ending

    asleep = multiprocessing.get_context("fork").Process(target=_asleep_through_interrupts)
    asleep.start()
    try:
        deadline = time.monotonic() + 30
        while ending.scheduler_state(asleep.pid) != "S" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ending.scheduler_state(asleep.pid) == "S"
        assert ending.scheduler_state(os.getpid()) == "R"
        started = time.monotonic()
        try:
            raise KeyboardInterrupt  # end_processes interrupts first only while one stops us
        except KeyboardInterrupt:
            ending.end_processes([asleep])
        took = time.monotonic() - started
    finally:
        asleep.kill()
        asleep.join()
    assert asleep.exitcode == -signal.SIGTERM
    assert ending.INTERRUPT_GRACE_S <= took < ending.UNWIND_LIMIT_S - 1, took
    assert ending.scheduler_state(asleep.pid) is None


@pytest.mark.parametrize("tier, start_method", [("fresh", "forkserver"), ("fresh", "fork"),
                                                ("reused", "fork"), ("fresh", "spawn")])
def test_a_temporary_folder_a_rank_leaves_to_its_exit_is_removed(tier, start_method):
    # A forked rank leaves through os._exit, which skips Python's exit clean-ups:
    # distspawn runs the ones the rank made itself (a spawned rank runs them anyway).
    run = run_python(["exit_cleanups.py", "-v"],
                     env={"EXIT_CLEANUPS_TIER": tier, "DISTSPAWN_START_METHOD": start_method},
                     timeout=120)
    assert run.verdict_line("test_a_folder_left_to_the_exit").endswith("ok"), run.output
    assert run.leftover_files == [] and run.leftover_pids == [], run.output


def test_the_rank_server_leaves_out_only_the_exit_steps_that_undo_in_process_state():
    # torch.library's at-exit callbacks remove its operators from torch's
    # dispatcher, which ends with the process anyway (hundreds of them, about
    # 50 ms the server's exit made the test process's reader wait for). A
    # temporary folder left to the exit is still removed.
    script = """
import atexit, tempfile, weakref
import torch
from distspawn.engine import forked_exit

kept = tempfile.TemporaryDirectory(prefix="kept-to-exit-")
library = torch.library.Library("distspawn_exit_steps", "DEF")
library.define("noop(Tensor x) -> Tensor")

def count():  # runs after the server's step, before weakref's callbacks
    alive = [f for f in weakref.finalize._registry if f.atexit and f.peek()]
    dispatcher = [f for f in alive if f.peek()[1].__module__ == "torch.library"]
    print("torch.library steps left:", len(dispatcher), "others:", len(alive) - len(dispatcher))

atexit.register(count)
forked_exit.skip_in_process_cleanups_at_exit()
"""
    run = run_python(["-c", script], timeout=120)
    assert run.returncode == 0, run.output
    assert "torch.library steps left: 0 others: " in run.output, run.output
    assert "others: 0" not in run.output, run.output  # the folder's, at least
    assert run.leftover_files == [] and run.leftover_pids == [], run.output
