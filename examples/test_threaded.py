"""Ranks as threads: the fastest way to test collective logic on one CPU.

Run with ``python examples/test_threaded.py`` or ``python -m pytest examples``.
Each test runs on ``world_size`` threads of this process, each one rank of a
``threaded`` process group; a collective whose ranks disagree fails at once
with every rank's call instead of hanging.
"""

import torch
import torch.distributed as dist

from distspawn import MultiThreadedTestCase, TestCase, run_tests, spawn_threads_and_init_comms


class ThreadedCollectives(MultiThreadedTestCase):
    @property
    def world_size(self):
        return 4

    def setUp(self):
        super().setUp()
        self._spawn_threads()

    def test_all_reduce(self):
        t = torch.full((3,), float(self.rank))
        dist.all_reduce(t)
        self.assertEqual(t, torch.full((3,), 6.0))

    def test_subgroup_and_all_gather(self):
        evens = dist.new_group([0, 2])
        if self.rank in (0, 2):
            out = [torch.zeros(1), torch.zeros(1)]
            dist.all_gather(out, torch.tensor([float(self.rank)]), group=evens)
            self.assertEqual(torch.cat(out), torch.tensor([0.0, 2.0]))

    def test_same_seed_same_numbers_on_every_rank(self):
        torch.manual_seed(0)
        x = torch.randn(4)
        everyone = [torch.empty(4) for _ in range(self.world_size)]
        dist.all_gather(everyone, x)
        for other in everyone:
            self.assertEqual(other, x)


class DecoratedTest(TestCase):
    @spawn_threads_and_init_comms(world_size=2)
    def test_ring_send_recv(self):
        rank = dist.get_rank()
        incoming = torch.zeros(1)
        ops = [dist.P2POp(dist.isend, torch.tensor([float(rank)]), 1 - rank),
               dist.P2POp(dist.irecv, incoming, 1 - rank)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        self.assertEqual(incoming.item(), float(1 - rank))


if __name__ == "__main__":
    run_tests()
