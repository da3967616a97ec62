"""The same fault cases on every tier; test/test_fault_table.py reads the reports.

DISTSPAWN_FAULT_TIER picks the tier the class runs on: ``processes`` (fresh
rank processes), ``reused`` (MultiProcContinuousTest) or ``threads``
(MultiThreadedTestCase). Cases that would take the test process down with a
thread (a signal, a kill) exist only on the process tiers.
"""

import os
import signal
import threading
import sys
import time

import torch.distributed as dist

from distspawn import (
    TIMEOUT_OVERRIDE,
    MultiProcContinuousTest,
    MultiProcessTestCase,
    MultiThreadedTestCase,
    run_tests,
)

TIER = os.environ.get("DISTSPAWN_FAULT_TIER", "processes")
TIMEOUT_OVERRIDE["test_hang"] = 4


def hang_here():
    """Stands in for a rank that never reaches the collective the others wait in."""
    give_up = time.monotonic() + 120
    while time.monotonic() < give_up:
        time.sleep(0.02)


class Cases:
    """The fault bodies, shared by every tier's class."""

    def group(self):
        if not dist.is_initialized():  # fresh processes make their own group
            store = dist.FileStore(self.file_name, self.world_size)
            dist.init_process_group("gloo", rank=self.rank, world_size=self.world_size,
                                    store=store)

    def test_pass(self):
        self.group()
        dist.barrier()

    def test_raise(self):
        self.group()
        if self.rank == 1:
            print("rank 1 about to raise", flush=True)
            raise ValueError("boom from rank 1")
        dist.barrier()

    def test_exit_code(self):
        self.group()
        if self.rank == 1:
            print("rank 1 about to exit", flush=True)
            sys.exit(3)
        dist.barrier()

    def test_sigsegv(self):
        self.group()
        if self.rank == 1:
            print("rank 1 about to crash", flush=True)
            signal.pthread_kill(threading.get_ident(), signal.SIGSEGV)
        dist.barrier()

    def test_sigkill(self):
        self.group()
        if self.rank == 1:
            print("rank 1 about to be killed", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        dist.barrier()

    def test_hang(self):
        self.group()
        if self.rank == 0:
            print("rank 0 about to hang", flush=True)
            hang_here()
        dist.barrier()

    def test_skip_on_some_ranks(self):
        self.group()
        if self.rank == 1:
            self.skipTest("rank 1 lacks a widget")

    def test_skip_everywhere(self):
        self.skipTest("no widgets anywhere")

    def test_every_rank_raises(self):
        self.group()
        # Every rank is connected before any leaves: gloo builds its mesh
        # lazily, and a peer still connecting would fail on the departure.
        dist.barrier()
        print(f"rank {self.rank} about to raise", flush=True)
        raise ValueError(f"rank {self.rank} fails on its own")


if TIER == "processes":
    class FaultTable(Cases, MultiProcessTestCase):
        @property
        def world_size(self):
            return 3

        def setUp(self):
            super().setUp()
            self._spawn_processes()

elif TIER == "reused":
    class FaultTable(Cases, MultiProcContinuousTest):
        world_size = 3

        @classmethod
        def backend_str(cls):
            return "gloo"

elif TIER == "threads":
    class FaultTable(Cases, MultiThreadedTestCase):
        @property
        def world_size(self):
            return 3

        def setUp(self):
            super().setUp()
            self._spawn_threads()

        # A signal or a kill would take the whole test process with the thread.
        test_sigsegv = test_sigkill = None

else:
    raise ValueError(f"DISTSPAWN_FAULT_TIER={TIER!r}: expected processes, reused or threads")

# Copies of the every-rank-raises case: whether each rank is named with its own
# error must not depend on how the ranks happened to be scheduled.
for copy in range(1, int(os.environ.get("DISTSPAWN_FAULT_REPEAT", "1"))):
    setattr(FaultTable, f"test_every_rank_raises_{copy}", Cases.test_every_rank_raises)


if __name__ == "__main__":
    run_tests()
