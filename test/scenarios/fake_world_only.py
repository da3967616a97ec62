"""A file that names distspawn only for its TestCase and the fake backend.

As pytorch's ``tensor/debug/test_comm_mode.py`` with its imports switched: no
rank process starts, so the plugin should start no rank server; run with
``-p count_server_starts``, the run ends with how many it started.
"""

import torch
import torch.distributed as dist

from distspawn import TestCase, run_tests
from distspawn.fake_pg import FakeStore


class FakeWorld(TestCase):
    def tearDown(self):
        if dist.is_initialized():
            dist.destroy_process_group()
        super().tearDown()

    def test_all_reduce_keeps_the_shape(self):
        dist.init_process_group("fake", rank=0, world_size=2, store=FakeStore())
        tensor = torch.ones(3)
        dist.all_reduce(tensor)
        self.assertEqual(tensor.shape, (3,))


if __name__ == "__main__":
    run_tests()
