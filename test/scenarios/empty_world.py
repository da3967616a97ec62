"""Classes whose world size is 0, one per kind of rank, as a class that sizes
its world from the machine gets on one without GPUs (torchtitan's FSDP tests:
``min(torch.cuda.device_count(), 4)``). Each body would fail if it ran.

Upstream's harness starts no rank and passes each test; distspawn skips each,
naming the class and its world size; run unchanged (the stand-in mode) they
get upstream's pass, with a warning. NoGPUsButAFixedWorld keeps a world of 2
and must still run.

UPSTREAM_HARNESS=1 imports upstream's harness (also what the stand-in mode runs).
"""

import os

import torch.distributed as dist

if os.environ.get("UPSTREAM_HARNESS") == "1":
    from torch.testing._internal.common_distributed import MultiProcessTestCase, MultiThreadedTestCase

    try:
        from torch.testing._internal.common_distributed import MultiProcContinuousTest
    except ImportError:  # torch 2.8 has no reused ranks
        MultiProcContinuousTest = None
    from torch.testing._internal.common_fsdp import FSDPTest
    from torch.testing._internal.common_utils import run_tests
    from torch.testing._internal.distributed._tensor.common_dtensor import (
        DTensorTestBase,
        with_comms,
    )
else:
    from distspawn import run_tests
    from distspawn.compat import MultiProcContinuousTest, MultiProcessTestCase, MultiThreadedTestCase
    from distspawn.dtensor import DTensorTestBase, with_comms
    from distspawn.fsdp import FSDPTest


def gpu_world():
    # What min(torch.cuda.device_count(), 4) gives without GPUs, on any machine.
    return 0


class RankProcesses(MultiProcessTestCase):
    @property
    def world_size(self):
        return 0

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def test_on_rank_processes(self):
        raise AssertionError("the body ran")


class FSDPOnGPUs(FSDPTest):
    @property
    def world_size(self):
        return gpu_world()

    def test_fsdp_on_gpus(self):
        raise AssertionError("the body ran")


class DTensorOnGPUs(DTensorTestBase):
    @property
    def world_size(self):
        return gpu_world()

    @with_comms
    def test_dtensor_on_gpus(self):
        raise AssertionError("the body ran")


class RankThreads(MultiThreadedTestCase):
    @property
    def world_size(self):
        return 0

    def setUp(self):
        super().setUp()
        self._spawn_threads()

    def test_on_rank_threads(self):
        raise AssertionError("the body ran")


if MultiProcContinuousTest is not None:
    class ReusedRanks(MultiProcContinuousTest):
        world_size = 0

        def test_on_reused_ranks(self):
            raise AssertionError("the body ran")


class NoGPUsButAFixedWorld(MultiThreadedTestCase):
    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_threads()

    def test_ranks_run(self):
        dist.barrier()
        if dist.get_rank() == 1:
            raise AssertionError("rank 1 ran and fails")


if __name__ == "__main__":
    run_tests()
