"""One test per fault case; test/test_verdicts.py runs this file and reads the verdicts."""

import ctypes
import os
import signal
import sys
import threading
import time
import unittest

import torch
import torch.distributed as dist

from distspawn import TIMEOUT_OVERRIDE, run_tests, skip_if_lt_x_gpu
from two_ranks import TwoRankTestCase

TIMEOUT_OVERRIDE["test_hang_on_rank0"] = 8


class Faults(TwoRankTestCase):
    def test_pass(self):
        store = dist.FileStore(self.file_name, self.world_size)
        dist.init_process_group("gloo", rank=self.rank, world_size=self.world_size, store=store)
        tensor = torch.ones(2) * (self.rank + 1)
        dist.all_reduce(tensor)
        self.assertEqual(tensor, [3.0, 3.0])

    def test_assertion_on_rank1(self):
        print(f"about to compare on rank {self.rank}")
        if self.rank == 1:
            self.assertEqual(torch.tensor([1.0]), torch.tensor([2.0]), "rank one disagrees")

    def test_exception_on_rank0(self):
        if self.rank == 0:
            raise ValueError("boom on rank zero")
        time.sleep(60)  # would hang without early stop

    def test_sigsegv_on_rank1(self):
        print(f"rank {self.rank} reached the crash site", flush=True)
        if self.rank == 1:
            signal.pthread_kill(threading.get_ident(), signal.SIGSEGV)
        time.sleep(60)

    def test_sigkill_on_rank0(self):
        if self.rank == 0:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)

    def test_sys_exit_3_on_rank1(self):
        if self.rank == 1:
            sys.exit(3)

    def test_sys_exit_3_then_slow_exit(self):
        import threading

        if self.rank == 1:
            # A process leaves only after its non-daemon threads end: this one
            # stands in for a slow interpreter shutdown (spawn's), which outlasts
            # the half second the others get once the verdict is known.
            threading.Thread(target=time.sleep, args=(3,)).start()
            sys.exit(3)

    def test_os_exit_0_mid_test(self):
        if self.rank == 0:
            os._exit(0)

    def test_skip_on_all_ranks(self):
        raise unittest.SkipTest("no widgets on this machine")

    def test_skip_on_rank1_only(self):
        if self.rank == 1:
            raise unittest.SkipTest("rank one lacks a widget")

    @skip_if_lt_x_gpu(2)
    def test_skip_decorator_exit_code(self):
        pass

    def test_hang_on_rank0(self):
        if self.rank == 0:
            # Stuck in native code while holding the GIL: no Python thread can run.
            ctypes.PyDLL(None).sleep(120)
        time.sleep(120)


class ReturnCodeChecks(TwoRankTestCase):
    """Upstream's override points, registered the way upstream test files do it."""

    def setUp(self):
        super().setUp()
        self.skip_return_code_checks = [self.test_any_exit_code_is_fine]
        self.special_return_code_checks = {self.test_abort_is_expected: -signal.SIGABRT}

    def test_any_exit_code_is_fine(self):
        if self.rank == 1:
            sys.exit(7)

    def test_abort_is_expected(self):
        os.abort()


if __name__ == "__main__":
    run_tests()
