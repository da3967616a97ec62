"""The project's own base class for tests that start rank processes."""

import torch.distributed as dist

from distspawn import MultiProcessTestCase


class ProjectRankBase(MultiProcessTestCase):
    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def init_world(self):
        store = dist.FileStore(self.file_name, self.world_size)
        dist.init_process_group("gloo", store=store, rank=self.rank, world_size=self.world_size)
