"""Fifty harness tests of every kind, for the nothing-left-behind check."""

import os
import signal
import threading
import unittest

import torch.distributed as dist

from distspawn import run_tests
from two_ranks import TwoRankTestCase


def _make(kind):
    def test(self):
        if kind == "skip":
            raise unittest.SkipTest("planned skip")
        store = dist.FileStore(self.file_name, self.world_size)
        dist.init_process_group("gloo", rank=self.rank, world_size=self.world_size, store=store)
        if kind == "fail" and self.rank == 1:
            raise AssertionError("planned failure")
        if kind == "crash" and self.rank == 0:
            signal.pthread_kill(threading.get_ident(), signal.SIGSEGV)
        dist.barrier()

    return test


class Many(TwoRankTestCase):
    pass

KINDS = ["pass", "fail", "crash", "skip", "pass"]
for index in range(50):
    setattr(Many, f"test_{index:02d}_{KINDS[index % 5]}", _make(KINDS[index % 5]))


if __name__ == "__main__":
    run_tests()
