"""Dynamo's two bases on a machine without an accelerator, where upstream's
verdicts and distspawn's differ on purpose; run unchanged (the stand-in mode)
a file gets upstream's.

- SingleProc: upstream's class asks torch.accelerator for its device and
  fails in setUpClass without one; distspawn's runs on the CPU with gloo.
- MultiProc: one rank per accelerator, so a world of 0. Upstream's harness
  starts no rank and passes each test without running it; distspawn skips.

UPSTREAM_HARNESS=1 imports upstream's harness (also what the stand-in mode runs).
"""

import os

import torch.distributed as dist

if os.environ.get("UPSTREAM_HARNESS") == "1":
    from torch.testing._internal.common_distributed import (
        DynamoDistributedMultiProcTestCase,
        DynamoDistributedSingleProcTestCase,
        skip_if_lt_x_gpu,
    )
    from torch.testing._internal.common_utils import run_tests
else:
    from distspawn import run_tests
    from distspawn.compat import (
        DynamoDistributedMultiProcTestCase,
        DynamoDistributedSingleProcTestCase,
        skip_if_lt_x_gpu,
    )


class SingleProc(DynamoDistributedSingleProcTestCase):
    def test_world_of_one(self):
        self.assertEqual(dist.get_world_size(), 1)


class MultiProc(DynamoDistributedMultiProcTestCase):
    @skip_if_lt_x_gpu(2)
    def test_on_two_gpus(self):
        raise AssertionError("the body ran")

    def test_on_every_accelerator(self):
        raise AssertionError("the body ran")


if __name__ == "__main__":
    run_tests()
