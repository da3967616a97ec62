"""A tiny suite for python -m distspawn: passes, fails only at world size 3, skips."""

import os, unittest
import torch, torch.distributed as dist
from distspawn import MultiProcessTestCase

class M(MultiProcessTestCase):
    @property
    def world_size(self): return int(os.environ["WORLD_SIZE"])
    def setUp(self):
        super().setUp(); self._spawn_processes()
    def _init(self):
        dist.init_process_group(os.environ["BACKEND"], rank=self.rank, world_size=self.world_size, init_method=f"file://{self.file_name}")
    def test_all_reduce(self):
        self._init(); t = torch.ones(1); dist.all_reduce(t); self.assertEqual(t.item(), self.world_size); dist.destroy_process_group()
    def test_fails_at_3(self):
        self.assertNotEqual(self.world_size, 3)
    def test_skip(self):
        self.skipTest("never here")
