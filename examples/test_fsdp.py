"""FSDP test files as FSDP-based projects write them, on distspawn.

Moved from upstream's harness by changing one import (``common_fsdp`` ->
``distspawn.fsdp``). Upstream's FSDPTest skips on a machine without a GPU;
here the ranks run on CPU with gloo, FSDP2 (``fully_shard``) and FSDP1
(``FullyShardedDataParallel``, through upstream's test models) alike.
"""

import copy

import torch
from torch.distributed.fsdp import ShardingStrategy, fully_shard

from distspawn import run_tests
from distspawn.fsdp import (
    MLP,
    DEVICEInitMode,
    FSDPInitMode,
    FSDPTest,
    NestedWrappedModule,
    check_sharded_parity,
)


class FullyShardParity(FSDPTest):
    def test_sharded_parameters_are_slices_of_the_replicated_ones(self):
        torch.manual_seed(0)
        reference = MLP(8)
        model = fully_shard(copy.deepcopy(reference))
        check_sharded_parity(self, reference, model)
        self.assertEqual(model(torch.ones(2, 8)), reference(torch.ones(2, 8)))


class FullyShardedDataParallelParity(FSDPTest):
    def test_fsdp_trains_like_ddp(self):
        # Two steps under FSDP1 and under DDP from the same seed: same losses and
        # parameters, for each sharding strategy.
        self.run_subtests(
            {"sharding_strategy": [ShardingStrategy.FULL_SHARD, ShardingStrategy.NO_SHARD]},
            self._test_fsdp_parity, NestedWrappedModule, FSDPInitMode.RECURSIVE,
            DEVICEInitMode.DEVICE_BEFORE)


if __name__ == "__main__":
    run_tests()
