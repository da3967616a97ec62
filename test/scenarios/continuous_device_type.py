"""Reused ranks and the device type, written for upstream's harness.

SWITCHED=1 imports distspawn's names instead (a file whose imports were
switched). On a CUDA build without a GPU, upstream's device_type() is "cuda":
a class without a world size skips and a tensor made on that device fails;
the stand-in mode gives the same verdicts, distspawn's own rule runs both on
the CPU. With WORLD_SIZE_LOG set, rank 0 of the class without a world size
writes the size it got there: on the CPU upstream's one rank per device is
one rank, distspawn's own rule four.
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
        log = os.environ.get("WORLD_SIZE_LOG")
        if log and self.rank == 0:  # the world size each harness chose
            with open(log, "a") as file:
                file.write(f"{dist.get_world_size()}\n")


class TwoRanks(MultiProcContinuousTest):
    world_size = 2

    def test_tensor_on_the_device_type(self):
        t = torch.ones(1, device=type(self).device_type())
        dist.all_reduce(t)
        self.assertEqual(t.item(), 2.0)


if __name__ == "__main__":
    run_tests()
