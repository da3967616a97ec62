"""A test file whose rank class comes from its project's helpers.

Its text names neither the harness nor a rank class; the plugin follows the base
into ``helpers`` and starts the rank server while pytest imports this file. Run
with ``-p count_server_starts``.
"""

import torch
import torch.distributed as dist
from helpers import ProjectRankBase


class OnProjectBase(ProjectRankBase):
    def test_all_reduce_sums_ranks(self):
        self.init_world()
        tensor = torch.tensor([float(self.rank)])
        dist.all_reduce(tensor)
        self.assertEqual(tensor.item(), 1.0)
        dist.destroy_process_group()
