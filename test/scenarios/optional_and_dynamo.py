"""torchvision-dependent tests and the Dynamo bases, on a machine without accelerators."""

import os

import torch.distributed as dist

from distspawn import (
    DynamoDistributedMultiProcTestCase,
    DynamoDistributedSingleProcTestCase,
    HAS_TORCHVISION,
    TestCase,
    run_tests,
    skipIfNoTorchVision,
)
from distspawn.compat import _dynamo_dist_per_rank_init
from two_ranks import TwoRankTestCase


class VisionTest(TestCase):
    @skipIfNoTorchVision
    def test_uses_torchvision(self):
        import torchvision  # noqa: F401

    def test_flag_agrees(self):
        print(f"HAS_TORCHVISION={bool(HAS_TORCHVISION)}")


class SingleProc(DynamoDistributedSingleProcTestCase):
    def test_world_of_one(self):
        self.assertEqual(dist.get_world_size(), 1)
        self.assertEqual(self.rank, 0)
        self.assertNotEqual(os.environ["MASTER_PORT"], "12355")  # no fixed port


class MultiProc(DynamoDistributedMultiProcTestCase):
    def test_runs_per_accelerator(self):
        pass


class PerRankInit(TwoRankTestCase):
    def test_per_rank_init(self):
        with _dynamo_dist_per_rank_init(self.rank, self.world_size):
            self.assertEqual(dist.get_world_size(), 2)
            self.assertEqual(dist.get_backend(), "gloo")
        self.assertFalse(dist.is_initialized())


if __name__ == "__main__":
    run_tests()
