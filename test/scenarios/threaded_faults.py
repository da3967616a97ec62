"""Fault cases on the threaded backend: one test per case, run by test_threaded.py."""

import sys
import time

import torch
import torch.distributed as dist

from distspawn import (
    TEST_SKIPS, MultiThreadedTestCase, TestCase, run_tests, spawn_threads_and_init_comms,
)


class ThreadedFaults(MultiThreadedTestCase):
    @property
    def world_size(self):
        return 4

    def setUp(self):
        super().setUp()
        self._spawn_threads()

    def test_pass(self):
        t = torch.ones(2) * self.rank
        dist.all_reduce(t)
        self.assertEqual(t, torch.full((2,), 6.0))

    def test_exception_on_rank1(self):
        if self.rank == 1:
            raise ValueError("boom on rank 1")
        dist.all_reduce(torch.ones(1))

    def test_exception_while_peers_compute(self):
        if self.rank == 0:
            raise RuntimeError("rank 0 broke while the others compute")
        while True:  # ended by distspawn once rank 0's failure is known
            time.sleep(0.02)

    def test_shape_mismatch(self):
        dist.all_reduce(torch.ones(5 if self.rank == 2 else 4))

    def test_op_mismatch(self):
        op = dist.ReduceOp.MAX if self.rank == 3 else dist.ReduceOp.SUM
        dist.all_reduce(torch.ones(2), op=op)

    def test_collective_mismatch(self):
        if self.rank == 1:
            dist.broadcast(torch.ones(2), src=0)
        else:
            dist.all_reduce(torch.ones(2))

    def test_group_mismatch(self):
        low, high = dist.new_group([0, 1]), dist.new_group([1, 2])
        if self.rank == 0:
            dist.all_reduce(torch.ones(1), group=low)
        elif self.rank == 1:
            dist.all_reduce(torch.ones(1), group=high)

    def test_rank_skips_collective(self):
        if self.rank != 1:
            dist.all_reduce(torch.ones(1))

    def test_send_send_deadlock(self):
        if self.rank < 2:
            dist.send(torch.ones(1), dst=1 - self.rank)
            dist.recv(torch.ones(1), src=1 - self.rank)

    def test_skip_on_all(self):
        self.skipTest("nothing to see on any rank")

    def test_skip_on_some(self):
        if self.rank % 2:
            self.skipTest("odd ranks skip")

    def test_exit_with_skip_code(self):
        sys.exit(TEST_SKIPS["multi-gpu-2"].exit_code)

    def test_exit_nonzero(self):
        if self.rank == 2:
            sys.exit(3)

    def test_assert_equal_on_rank_msg(self):
        self.assertEqualOnRank(self.rank, 5, msg="rank zero has its own opinion")

    def test_assert_not_equal_on_rank_msg(self):
        self.assertNotEqualOnRank(1, 1, msg="ones should differ here", rank=2)

    def test_errors_reach_every_rank(self):
        # A collective that fails fails on every rank, as it would on gloo.
        with self.assertRaisesRegex(RuntimeError, "bitwise"):
            dist.all_reduce(torch.ones(2), op=dist.ReduceOp.BAND)

    def test_stuck_rank(self):
        if self.rank == 1:
            while True:
                time.sleep(0.02)
        dist.all_reduce(torch.ones(1))


class Decorated(TestCase):
    @spawn_threads_and_init_comms
    def test_bare(self):
        self.assertEqual(dist.get_world_size(), 4)

    @spawn_threads_and_init_comms(world_size=2)
    def test_world_size_2(self):
        t = torch.ones(1)
        dist.all_reduce(t)
        self.assertEqual(t.item(), 2.0)

    @spawn_threads_and_init_comms(world_size=3, timeout=2)
    def test_timeout_honoured(self):
        if dist.get_rank() == 2:
            while True:
                time.sleep(0.02)
        dist.barrier()

    @spawn_threads_and_init_comms(world_size=2)
    def test_failure(self):
        self.assertEqual(dist.get_rank(), 0, "only rank 0 is rank 0")


if __name__ == "__main__":
    run_tests()
