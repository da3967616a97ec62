"""A first DistributedDataParallel test: gloo on CPU, one fresh process per rank.

Run with ``python examples/test_ddp.py`` or ``python -m pytest examples``.
DDP's gradients must equal those of the same model trained in one process on
the whole batch.
"""

import copy

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from distspawn import MultiProcessTestCase, run_tests


class DDPTest(MultiProcessTestCase):
    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def test_gradients_match_a_single_process(self):
        dist.init_process_group("gloo", rank=self.rank, world_size=self.world_size,
                                init_method=f"file://{self.file_name}")
        torch.manual_seed(0)  # the same model and batch on every rank
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                    torch.nn.Linear(16, 1))
        reference = copy.deepcopy(model)
        batch = torch.randn(4 * self.world_size, 8)

        ddp = DDP(model)
        mine = batch.chunk(self.world_size)[self.rank]
        ddp(mine).sum().backward()  # DDP averages gradients over ranks
        (reference(batch).sum() / self.world_size).backward()

        for ours, expected in zip(ddp.module.parameters(), reference.parameters()):
            self.assertEqual(ours.grad, expected.grad, atol=1e-6, rtol=1e-5)
        dist.destroy_process_group()


if __name__ == "__main__":
    run_tests()
