"""Ranks that each create only their own subgroup, as c10d's tag lookup does.

``_find_or_create_pg_by_ranks_and_tag(tag, [0, 1, 2, 3], 2)`` makes ranks 0 and
1 create the group [0, 1] and ranks 2 and 3 the group [2, 3]. Both groups get
the same name (the thread's own group count), so a backend that rendezvouses
by group name alone puts four ranks into a two-rank barrier: upstream's
threaded world hangs there now and then (its store-based barrier overshoots).
Each test here repeats it so that a race would show, and checks that each
subgroup's collectives see their own two ranks only.
"""

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from distspawn import MultiThreadedTestCase, run_tests

ROUNDS = 40


class SubgroupsByTag(MultiThreadedTestCase):
    @property
    def world_size(self):
        return 4

    def setUp(self):
        super().setUp()
        self._spawn_threads()

    def test_each_rank_creates_only_its_own_subgroup(self):
        for round_ in range(ROUNDS):
            group = c10d._find_or_create_pg_by_ranks_and_tag(f"tag{round_}", [0, 1, 2, 3], 2)
            members = [0, 1] if self.rank < 2 else [2, 3]
            self.assertEqual(dist.get_process_group_ranks(group), members)
            total = torch.tensor([float(self.rank)])
            dist.all_reduce(total, group=group)
            self.assertEqual(total.item(), float(sum(members)))

    def test_the_same_tag_finds_the_same_group(self):
        first = c10d._find_or_create_pg_by_ranks_and_tag("again", [0, 1, 2, 3], 2)
        self.assertIs(c10d._find_or_create_pg_by_ranks_and_tag("again", [0, 1, 2, 3], 2),
                      first)


if __name__ == "__main__":
    run_tests()
