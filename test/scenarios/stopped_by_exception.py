"""The test process's wait for its ranks is stopped by an exception of its own.

pytest-timeout's signal method does this: SIGALRM raises ``Failed: Timeout``
in the test process while its ranks still run. Here a thread of the test
process sends SIGALRM once both ranks are inside a temporary folder of their
own; the handler raises. The ranks must unwind (their with blocks remove the
folders) before they are ended, and the next test runs. STOPPED_TIER=fresh
(default) or reused. STOPPED_UNWIND=busy: each rank works for longer than the
1 s grace before its with block ends, as a rank on a loaded machine may.
STOPPED_SIGINT_IGNORED=1: the test process ignores SIGINT, as one started in
the background by a shell without job control does, and its ranks inherit it.
"""

import os
import signal
import tempfile
import threading
import time

import torch.distributed as dist

from distspawn import run_tests
from two_ranks import TwoRankReusedTestCase, TwoRankTestCase

READY_VAR = "STOPPED_READY_DIR"  # made by the test process, inherited by its ranks
BUSY_UNWIND_S = 2.5


class StoppedByPlugin(Exception):
    pass


def _raise_on_alarm(signum, frame):
    raise StoppedByPlugin("the wait was stopped by a plugin's timeout")


def _alarm_once_ranks_are_ready(ready_dir):
    while len(os.listdir(ready_dir)) < 2:
        time.sleep(0.05)
    for rank in ("0", "1"):
        os.rmdir(os.path.join(ready_dir, rank))
    os.rmdir(ready_dir)
    signal.pthread_kill(threading.main_thread().ident, signal.SIGALRM)


class Rows:
    def test_hang(self):
        with tempfile.TemporaryDirectory(prefix="rank-own-"):
            try:
                os.mkdir(os.path.join(os.environ[READY_VAR], str(self.rank)))
                time.sleep(120)
            finally:
                if os.environ.get("STOPPED_UNWIND") == "busy":
                    stop = time.monotonic() + BUSY_UNWIND_S
                    while time.monotonic() < stop:
                        pass

    def test_next(self):
        # Runs after test_hang: reused ranks were ended with it, and new ones
        # (a new group) run this one.
        if dist.is_initialized():
            dist.barrier()


if os.environ.get("STOPPED_TIER", "fresh") == "fresh":
    class Stopped(Rows, TwoRankTestCase):
        pass
else:
    class StoppedReused(Rows, TwoRankReusedTestCase):
        pass


if __name__ == "__main__":
    if os.environ.get("STOPPED_SIGINT_IGNORED") == "1":
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ[READY_VAR] = tempfile.mkdtemp(prefix="ready-")
    signal.signal(signal.SIGALRM, _raise_on_alarm)
    threading.Thread(target=_alarm_once_ranks_are_ready, args=(os.environ[READY_VAR],),
                     daemon=True).start()
    run_tests()
