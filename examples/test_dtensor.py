"""A DTensor test file as DTensor-based projects write them, on distspawn.

Moved from upstream's harness by changing one import (``common_dtensor`` ->
``distspawn.dtensor``). Without 4 GPUs, the 4 ranks run on CPU with gloo.
"""

import torch
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from distspawn import run_tests
from distspawn.dtensor import DTensorTestBase, MLPModule, with_comms


class TensorParallelMLP(DTensorTestBase):
    @with_comms
    def test_sharded_mlp_matches_the_local_one(self):
        mesh = self.build_device_mesh()
        reference = MLPModule(self.device_type)
        sharded = parallelize_module(MLPModule(self.device_type), mesh,
                                     {"net1": ColwiseParallel(), "net2": RowwiseParallel()})
        x = torch.rand(8, 10, generator=torch.Generator().manual_seed(0))
        self.assertEqual(sharded(x), reference(x))

    @with_comms
    def test_redistribute_round_trip(self):
        mesh = self.build_device_mesh()
        full = torch.arange(24.0).reshape(8, 3)
        rows = distribute_tensor(full, mesh, [Shard(0)])
        self.assertEqual(rows.redistribute(mesh, [Replicate()]).to_local(), full)


if __name__ == "__main__":
    run_tests()
