"""A threaded test that relies on upstream's one generator shared by all threads.

It passes on upstream's harness (UPSTREAM_HARNESS=1) and fails on distspawn's
default per-thread generators, with a note on how to switch back.
"""

import os

import torch
import torch.distributed as dist

if os.environ.get("UPSTREAM_HARNESS") == "1":
    from torch.testing._internal.common_distributed import MultiThreadedTestCase
    from torch.testing._internal.common_utils import run_tests
else:
    from distspawn import MultiThreadedTestCase, run_tests


class SharedGeneratorAssumed(MultiThreadedTestCase):
    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_threads()

    def test_ranks_draw_different_numbers(self):
        mine = torch.rand(3)
        from_rank0 = mine.clone()
        dist.broadcast(from_rank0, src=0)
        self.assertNotEqualOnRank(from_rank0, mine, rank=1)


if __name__ == "__main__":
    run_tests()
