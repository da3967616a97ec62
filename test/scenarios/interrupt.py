"""Ranks report their pids on a FIFO, then hang until the parent is interrupted."""

import os
import time

from distspawn import run_tests
from two_ranks import TwoRankTestCase


class Interrupted(TwoRankTestCase):
    def test_hang(self):
        with open(os.environ["PID_FIFO"], "w") as fifo:
            fifo.write(f"{os.getpid()}\n")
        time.sleep(120)


if __name__ == "__main__":
    run_tests()
