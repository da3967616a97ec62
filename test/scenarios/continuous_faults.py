"""Reused workers (MultiProcContinuousTest): one class, every fault case in order.

DISTSPAWN_TEST_ORDER=forward|reverse|shuffle decides the order the tests run in;
the verdicts must not depend on it.
"""

import os
import random
import threading
import time

import torch
import torch.distributed as dist

from distspawn import TEST_SKIPS, MultiProcContinuousTest, run_tests


def log_pid(test):
    """Note which process ran this rank of this test (DISTSPAWN_PID_LOG, if set)."""
    path = os.environ.get("DISTSPAWN_PID_LOG")
    if path:
        with open(path, "a") as f:
            f.write(f"{test._testMethodName} {test.rank} {os.getpid()}\n")


class Reused(MultiProcContinuousTest):
    world_size = 2
    start_method = "fork"

    @classmethod
    def backend_str(cls):
        return "gloo"

    def test_a_pass(self):
        log_pid(self)
        t = torch.ones(2) * (self.rank + 1)
        dist.all_reduce(t)
        self.assertEqual(t, torch.full((2,), 3.0))

    def test_b_fail_on_rank1(self):
        dist.barrier()
        self.assertEqual(self.rank, 0, "rank one disagrees")

    def test_c_pass_after_failure(self):
        log_pid(self)
        t = torch.ones(1)
        dist.all_reduce(t)
        self.assertEqual(t.item(), 2.0)

    def test_d_crash_on_rank0(self):
        if self.rank == 0:
            os._exit(3)
        dist.barrier()

    def test_e_skip_everywhere(self):
        self.skipTest("not on this pool")

    def test_f_skip_some_fail_others(self):
        if self.rank == 0:
            self.skipTest("rank 0 skips")
        raise RuntimeError("rank 1 fails")

    def test_g_leaves_a_thread(self):
        threading.Thread(target=time.sleep, args=(30,), name="forgotten-sleeper",
                         daemon=True).start()

    def test_h_destroys_the_group(self):
        dist.destroy_process_group()

    def test_i_pid_is_reused(self):
        pids = [None, None]
        dist.all_gather_object(pids, os.getpid())
        self.assertEqual(len(set(pids)), 2)

    def test_j_exit_with_skip_code(self):
        import sys

        sys.exit(TEST_SKIPS["multi-gpu-4"].exit_code)


class FreshGroups(MultiProcContinuousTest):
    world_size = 2
    start_method = "fork"
    fresh_process_group_per_test = True

    @classmethod
    def backend_str(cls):
        return "gloo"

    def test_one(self):
        log_pid(self)
        self.assertEqual(dist.get_world_size(), 2)

    def test_two(self):
        log_pid(self)
        t = torch.ones(1)
        dist.all_reduce(t)
        self.assertEqual(t.item(), 2.0)


def load_tests(loader, standard_tests, pattern):
    order = os.environ.get("DISTSPAWN_TEST_ORDER", "forward")
    import unittest

    suite = unittest.TestSuite()
    for cls in (Reused, FreshGroups):
        names = loader.getTestCaseNames(cls)
        if order == "reverse":
            names = list(reversed(names))
        elif order == "shuffle":
            names = list(names)
            random.Random(1234).shuffle(names)
        suite.addTests(cls(name) for name in names)
    return suite


if __name__ == "__main__":
    run_tests()
