"""A first distspawn test: all_reduce over gloo on two ranks.

Run it any of these ways:
    python examples/test_allreduce.py
    python examples/test_allreduce.py AllReduceTest.test_all_reduce_sum
    python -m pytest examples/test_allreduce.py
"""

import torch
import torch.distributed as dist

from distspawn import MultiProcessTestCase, requires_gloo, run_tests, skip_if_lt_x_gpu


class AllReduceTest(MultiProcessTestCase):
    @property
    def world_size(self) -> int:
        return 2

    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()

    def _init_gloo(self) -> None:
        store = dist.FileStore(self.file_name, self.world_size)
        dist.init_process_group("gloo", rank=self.rank, world_size=self.world_size, store=store)

    @requires_gloo()
    def test_all_reduce_sum(self) -> None:
        self._init_gloo()
        tensor = torch.full((3,), float(self.rank + 1))
        dist.all_reduce(tensor)
        self.assertEqual(tensor, torch.full((3,), 3.0))

    @requires_gloo()
    def test_broadcast_from_rank0(self) -> None:
        self._init_gloo()
        tensor = torch.arange(4) if self.rank == 0 else torch.zeros(4, dtype=torch.int64)
        dist.broadcast(tensor, src=0)
        self.assertEqual(tensor, [0, 1, 2, 3])

    @skip_if_lt_x_gpu(2)
    def test_needs_two_gpus(self) -> None:
        # Skipped on CPU-only machines, with the decorator's own reason.
        self.assertTrue(torch.cuda.is_available())


if __name__ == "__main__":
    run_tests()
