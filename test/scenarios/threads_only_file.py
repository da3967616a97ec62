"""Rank threads only: a pytest run of this file alone starts no rank server.

Run beside a file with a multi-process class (``MIXED_IN_PROCESSES=1``), the
server (a child of the test process) is expected. The test checks which.
"""

import os
import unittest

import torch
import torch.distributed as dist

from distspawn import MultiThreadedTestCase

MIXED = os.environ.get("MIXED_IN_PROCESSES") == "1"


def children_of(pid):
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue  # ended meanwhile
            if int(fields[1]) == pid:
                found.append(int(entry))
    return found


def forkservers_of(pid):
    found = []
    for child in children_of(pid):
        try:
            with open(f"/proc/{child}/cmdline", "rb") as f:
                command = f.read()
        except OSError:
            continue
        if b"multiprocessing.forkserver" in command:
            found.append(child)
    return found


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
