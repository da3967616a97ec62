"""An FSDP2 test file as FSDP-based projects write them, on distspawn.

Moved from upstream's harness by changing one import (``common_fsdp`` ->
``distspawn.fsdp``). Upstream's FSDPTest skips on a machine without a GPU;
here the ranks run on CPU with gloo.
"""

import copy

import torch
from torch.distributed.fsdp import fully_shard

from distspawn import run_tests
from distspawn.fsdp import MLP, FSDPTest, check_sharded_parity


class FullyShardParity(FSDPTest):
    def test_sharded_parameters_are_slices_of_the_replicated_ones(self):
        torch.manual_seed(0)
        reference = MLP(8)
        model = fully_shard(copy.deepcopy(reference))
        check_sharded_parity(self, reference, model)
        self.assertEqual(model(torch.ones(2, 8)), reference(torch.ones(2, 8)))


if __name__ == "__main__":
    run_tests()
