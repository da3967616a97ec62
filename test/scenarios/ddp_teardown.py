"""Many short DDP tests at world size 4 that destroy the group before the model dies.

The order every DDP test has (destroy_process_group() at the end of the body,
the model freed with the body's locals afterwards) used to hang about one test
in ten once ranks started warm: torch freed the gloo group from the DDP reducer
while holding the GIL. Every test here must pass.
"""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from distspawn import MultiProcessTestCase, run_tests

TESTS = 24


class DDPTeardown(MultiProcessTestCase):
    world_size = 4

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def _train_then_destroy(self):
        dist.init_process_group("gloo", rank=self.rank, world_size=self.world_size,
                                init_method=f"file://{self.file_name}")
        torch.manual_seed(0)
        model = DistributedDataParallel(torch.nn.Sequential(
            torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            optimizer.zero_grad()
            model(torch.randn(8, 16)).sum().backward()
            optimizer.step()
        dist.destroy_process_group()


for index in range(TESTS):
    setattr(DDPTeardown, f"test_step_{index:02d}", DDPTeardown._train_then_destroy)


if __name__ == "__main__":
    run_tests()
