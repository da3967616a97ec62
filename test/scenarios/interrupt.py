"""Ranks report their pids on a FIFO, then hang until the test process is stopped.

Each test runs in ``with_temp_dir``'s folder, made by a rank: it must not
outlive the stop either. INTERRUPT_USER_TEMP=1: the ranks also hang inside a
temporary folder of their own, which a stop that lets them unwind removes.

INTERRUPT_TIER=fresh (default) runs the hanging test on fresh rank processes,
INTERRUPT_TIER=reused on reused workers; DISTSPAWN_START_METHOD picks how
ranks start.
"""

import contextlib
import os
import tempfile
import time

from distspawn import run_tests
from distspawn.checkpoint_utils import with_temp_dir
from two_ranks import TwoRankReusedTestCase, TwoRankTestCase


def report_pid_then_hang():
    own_folder = (tempfile.TemporaryDirectory(prefix="rank-own-")
                  if os.environ.get("INTERRUPT_USER_TEMP") == "1" else contextlib.nullcontext())
    with own_folder:
        with open(os.environ["PID_FIFO"], "w") as fifo:
            fifo.write(f"{os.getpid()}\n")
        time.sleep(120)


if os.environ.get("INTERRUPT_TIER", "fresh") == "fresh":
    class Interrupted(TwoRankTestCase):
        @with_temp_dir
        def test_hang(self):
            report_pid_then_hang()
else:
    class InterruptedReused(TwoRankReusedTestCase):
        @with_temp_dir
        def test_hang(self):
            report_pid_then_hang()


if __name__ == "__main__":
    run_tests()
