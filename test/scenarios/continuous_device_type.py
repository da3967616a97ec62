"""Reused ranks and the device type, written for upstream's harness.

SWITCHED=1 imports distspawn's names instead (a file whose imports were
switched). On a CUDA build without a GPU, upstream's device_type() is "cuda":
a class without a world size skips and a tensor made on that device fails;
the stand-in mode gives the same verdicts, distspawn's own rule runs both on
the CPU.
"""

import os

import torch
import torch.distributed as dist

if os.environ.get("SWITCHED") == "1":
    from distspawn import MultiProcContinuousTest, run_tests
else:
    from torch.testing._internal.common_distributed import MultiProcContinuousTest
    from torch.testing._internal.common_utils import run_tests


class OneRankPerDevice(MultiProcContinuousTest):
    def test_all_reduce(self):
        t = torch.ones(1)
        dist.all_reduce(t)
        self.assertEqual(t.item(), dist.get_world_size())


class TwoRanks(MultiProcContinuousTest):
    world_size = 2

    def test_tensor_on_the_device_type(self):
        t = torch.ones(1, device=type(self).device_type())
        dist.all_reduce(t)
        self.assertEqual(t.item(), 2.0)


if __name__ == "__main__":
    run_tests()
