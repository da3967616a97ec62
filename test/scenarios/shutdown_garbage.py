"""A spawned rank's destroyed group, kept alive by garbage, is freed before shutdown.

Each rank leaves its process group in a reference cycle (as DDP leaves it, in
functions whose defaults captured the default group) with gc off, so only a
full collection frees it. The cycle's ``__del__`` writes down whether the
interpreter was already shutting down: freed during shutdown, gloo's worker
thread can abort and hang the rank at exit.
"""

import gc
import os
import sys

import torch
import torch.distributed as dist

from distspawn import run_tests
from two_ranks import TwoRankTestCase


class GroupInGarbage(TwoRankTestCase):
    start_method = "spawn"

    def test_group_left_in_a_cycle(self):
        dist.init_process_group("gloo", rank=self.rank, world_size=self.world_size,
                                init_method=f"file://{self.file_name}")
        gc.disable()
        report = f"{os.environ['GARBAGE_REPORT']}.{self.rank}"

        class Holder:
            def __del__(self):
                with open(report, "w") as f:
                    f.write(f"shutting down: {sys.is_finalizing()}")

        holder = Holder()

        def uses_the_group(group=dist.group.WORLD, holder=holder):
            return group, holder

        holder.fn = uses_the_group
        del holder, uses_the_group
        dist.all_reduce(torch.ones(1))
        dist.destroy_process_group()


if __name__ == "__main__":
    run_tests()
