"""Rank threads only: a pytest run of this file alone starts no rank server.

Run beside a file with a multi-process test that can run
(``MIXED_IN_PROCESSES=1``), the server (a child of the test process) is
expected. The test checks which.
"""

import os
import unittest

import torch
import torch.distributed as dist

from child_processes import forkservers_of
from distspawn import MultiThreadedTestCase

MIXED = os.environ.get("MIXED_IN_PROCESSES") == "1"


class Threads(MultiThreadedTestCase):
    world_size = 2

    def setUp(self):
        super().setUp()
        self._spawn_threads()

    def test_sum_and_no_server_unless_processes_are_mixed_in(self):
        t = torch.ones(2)
        dist.all_reduce(t)
        self.assertEqual(t, torch.full((2,), 2.0))
        if self.rank == 0:
            self.assertEqual(len(forkservers_of(os.getpid())), int(MIXED))


if __name__ == "__main__":
    unittest.main()
