"""A reused nccl world larger than the GPU count: its ranks may share a GPU.

Upstream's reused workers (torch 2.15 on) set NCCL_MULTI_RANK_GPU_ENABLE=1
before ``_init_pg`` when the world is larger than the accelerator count, since
nccl refuses two ranks on one device otherwise. ``NcclNamed`` names nccl but
sets its group up on gloo, so the rank's environment can be checked on a
machine without a GPU wherever torch is built with nccl. UPSTREAM_HARNESS=1
runs this file on upstream's harness.
"""

import os

import torch.distributed as dist

if os.environ.get("UPSTREAM_HARNESS") == "1":
    from torch.testing._internal.common_distributed import MultiProcContinuousTest
    from torch.testing._internal.common_utils import run_tests
else:
    from distspawn import MultiProcContinuousTest, run_tests

SHARED_DEVICE_ENV = "NCCL_MULTI_RANK_GPU_ENABLE"


class NcclNamed(MultiProcContinuousTest):
    world_size = 2

    @classmethod
    def backend_str(cls):
        return "nccl"

    @classmethod
    def _init_pg(cls, rank, world_size, rdvz_file):
        store = dist.FileStore(rdvz_file, world_size)
        dist.init_process_group("gloo", rank=rank, world_size=world_size, store=store)

    def test_ranks_may_share_a_device(self):
        self.assertEqual(os.environ.get(SHARED_DEVICE_ENV), "1")


class GlooNamed(MultiProcContinuousTest):
    world_size = 2

    @classmethod
    def backend_str(cls):
        return "gloo"

    def test_nothing_set_for_gloo(self):
        self.assertNotIn(SHARED_DEVICE_ENV, os.environ)


if __name__ == "__main__":
    run_tests()
