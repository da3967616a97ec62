"""Nothing outlives its test: processes, temp dirs, store files; Ctrl-C ends the ranks."""

import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import MARKER_VAR, SCENARIOS, processes_with_marker, run_python, is_torch_cache


def test_fifty_harness_tests_leave_nothing_behind():
    # fork keeps fifty tests quick; what is checked here is the parent's clean-up,
    # which is the same for every start method (spawn runs are checked elsewhere).
    run = run_python(["many.py"], env={"DISTSPAWN_START_METHOD": "fork"})
    assert "Ran 50 tests" in run.output, run.output
    assert "FAILED (failures=20, skipped=10)" in run.output, run.output
    assert run.leftover_files == []
    assert run.leftover_pids == []


def _alive(pid):
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0]
    except OSError:
        return False
    return state != "Z"


def test_ctrl_c_in_the_parent_ends_every_rank():
    with tempfile.TemporaryDirectory() as tmp:
        fifo = os.path.join(tmp, "pids")
        os.mkfifo(fifo)
        env = {**os.environ, "PID_FIFO": fifo, "TMPDIR": tmp, MARKER_VAR: "ctrl-c"}
        parent = subprocess.Popen([sys.executable, "interrupt.py"], cwd=SCENARIOS, env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            # Read-write: the FIFO never reports end-of-file, so select waits for data.
            reader = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
            pids, buffer = [], b""
            deadline = time.monotonic() + 120
            while len(pids) < 2 and time.monotonic() < deadline:
                ready, _, _ = select.select([reader], [], [], 1.0)
                try:
                    buffer += os.read(reader, 1024) if ready else b""
                except BlockingIOError:
                    continue
                pids = [int(p) for p in buffer.split()]
            os.close(reader)
            assert len(pids) == 2, "the ranks never started"
            interrupted = time.monotonic()
            parent.send_signal(signal.SIGINT)
            parent.wait(timeout=30)
            ended_after = time.monotonic() - interrupted
        finally:
            parent.kill()
            parent.wait()
        assert ended_after < 10, f"parent took {ended_after:.1f}s to stop after Ctrl-C"
        assert not [pid for pid in pids if _alive(pid)]
        assert processes_with_marker("ctrl-c") == []
        left = [p.name for p in Path(tmp).iterdir() if not is_torch_cache(Path(p.name))]
        assert left == ["pids"]
