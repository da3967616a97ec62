"""World-size markers and rank-labelled failures under the pytest plugin."""

import os
import sys

import pytest
import torch
import torch.distributed as dist

from distspawn import MultiProcContinuousTest, MultiProcessTestCase, MultiThreadedTestCase


class Processes(MultiProcessTestCase):
    @property
    def world_size(self):
        return 2  # the marker overrides it for the methods that carry one

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def _init(self):
        store = dist.FileStore(self.file_name, self.world_size)
        dist.init_process_group("gloo", rank=self.rank, world_size=self.world_size, store=store)

    @pytest.mark.world_size(2, 3)
    def test_sum(self):
        self._init()
        t = torch.ones(1)
        dist.all_reduce(t)
        assert t.item() == dist.get_world_size() == self.world_size
        os.write(1, f"ws={self.world_size} rank={self.rank}\n".encode())

    @pytest.mark.world_size(2, 512)
    def test_too_big(self):
        self._init()

    def test_plain(self):
        assert self.world_size == 2

    @pytest.mark.world_size(3)
    def test_fails_on_rank_1(self):
        print(f"rank {self.rank} says hello", flush=True)
        if self.rank == 1:
            print("rank 1 is about to fail", file=sys.stderr, flush=True)
            raise ValueError("rank one broke")


@pytest.mark.world_size(2, 4)
class Threads(MultiThreadedTestCase):
    def setUp(self):
        super().setUp()
        self._spawn_threads()

    def test_world(self):
        t = torch.ones(1)
        dist.all_reduce(t)
        assert t.item() == dist.get_world_size() == self.world_size


class Reused(MultiProcContinuousTest):
    world_sizes = (2, 3)

    @classmethod
    def backend_str(cls):
        return "gloo"

    def test_world(self):
        assert dist.get_world_size() == self.world_size

    def test_again(self):
        t = torch.ones(1)
        dist.all_reduce(t)
        assert t.item() == self.world_size

