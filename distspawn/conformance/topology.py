"""Groups: ranks, sizes, backends and membership as the process group API reports them."""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..cases.dist_backend import require_backend_feature
from .common import backend, full, place


class GroupTests:
    """new_group, new_subgroups, rank translation, group queries, destroying a group."""

    def test_world_queries(self):
        self.assertTrue(dist.is_initialized())
        self.assertEqual(dist.get_world_size(), self.world_size)
        self.assertEqual(dist.get_rank(), self.rank)
        self.assertEqual(dist.get_backend(), backend())
        self.assertEqual(dist.get_process_group_ranks(dist.group.WORLD),
                         list(range(self.world_size)))

    @require_backend_feature("subgroup")
    def test_subgroup_queries_and_rank_translation(self):
        at = place("subgroup")
        if at.member:
            self.assertEqual(dist.get_world_size(at.group), at.size)
            self.assertEqual(dist.get_rank(at.group), at.group_rank)
            self.assertEqual(dist.get_process_group_ranks(at.group), at.members)
            for group_rank, global_rank in enumerate(at.members):
                self.assertEqual(dist.get_global_rank(at.group, group_rank), global_rank)
                self.assertEqual(dist.get_group_rank(at.group, global_rank), group_rank)
            self.assertEqual(dist.get_backend(at.group), backend())
        else:
            self.assertEqual(dist.get_rank(at.group), -1)
            self.assertEqual(dist.get_world_size(at.group), -1)

    @require_backend_feature("subgroup")
    def test_new_group_with_ranks_out_of_order(self):
        world = dist.get_world_size()
        order = list(reversed(range(world)))
        group = dist.new_group(order)
        # Group ranks follow the sorted global ranks, whatever order was given.
        self.assertEqual(dist.get_process_group_ranks(group), sorted(order))
        tensor = full(float(dist.get_rank()))
        dist.all_reduce(tensor, group=group)
        self.assertEqual(tensor, full(float(sum(range(world)))))

    @require_backend_feature("subgroup")
    def test_new_subgroups_split_the_world(self):
        world = dist.get_world_size()
        size = 2 if world % 2 == 0 else 1
        mine, groups = dist.new_subgroups(group_size=size)
        self.assertEqual(len(groups), world // size)
        tensor = torch.tensor([float(dist.get_rank())])
        dist.all_reduce(tensor, group=mine)
        start = dist.get_rank() - dist.get_rank() % size
        self.assertEqual(tensor.item(), float(sum(range(start, start + size))))

    @require_backend_feature("subgroup")
    def test_new_subgroups_by_enumeration(self):
        world = dist.get_world_size()
        evens, odds = list(range(0, world, 2)), list(range(1, world, 2))
        mine, groups = dist.new_subgroups_by_enumeration([evens, odds])
        self.assertEqual(len(groups), 2)
        tensor = torch.tensor([1.0])
        dist.all_reduce(tensor, group=mine)
        self.assertEqual(tensor.item(), float(len(evens if dist.get_rank() % 2 == 0 else odds)))

    @require_backend_feature("subgroup")
    def test_destroy_a_subgroup_keeps_the_world(self):
        group = dist.new_group(list(range(dist.get_world_size())))
        dist.barrier(group=group)
        dist.destroy_process_group(group)
        tensor = full(1.0)
        dist.all_reduce(tensor)
        self.assertEqual(tensor, full(float(dist.get_world_size())))

    def test_collective_on_an_explicit_world_group_handle(self):
        tensor = full(1.0)
        dist.all_reduce(tensor, group=dist.group.WORLD)
        self.assertEqual(tensor, full(float(dist.get_world_size())))
