"""Ranks that disagree about skipping a test: some skip, the others pass.

Upstream's harness has one rule per kind of rank: rank processes take rank
0's exit code alone (rank 1's skip passes the test, rank 0's skips it);
rank threads and reused rank processes skip the test on any rank's skip.
distspawn fails such a test, naming who skipped (``lenient_skips = True``
restores upstream's rule); run unchanged (the stand-in mode), a file gets
upstream's verdicts. A rank other than 0 that exits with a code that is not
a skip fails the test on distspawn, in the stand-in mode too: upstream's
harness never reads that rank's exit code, and passes.

UPSTREAM_HARNESS=1 imports upstream's harness (also what the stand-in mode runs).
"""

import os
import sys

import torch.distributed as dist

if os.environ.get("UPSTREAM_HARNESS") == "1":
    from torch.testing._internal import common_distributed as upstream
    from torch.testing._internal.common_distributed import (
        TEST_SKIPS,
        MultiProcessTestCase,
        MultiThreadedTestCase,
    )

    # torch 2.8's harness spells it MultiProcContinousTest.
    MultiProcContinuousTest = getattr(upstream, "MultiProcContinuousTest", None) or getattr(
        upstream, "MultiProcContinousTest")
    from torch.testing._internal.common_utils import run_tests
else:
    from distspawn import run_tests
    from distspawn.compat import (
        TEST_SKIPS,
        MultiProcContinuousTest,
        MultiProcessTestCase,
        MultiThreadedTestCase,
    )

SKIP_CODE = TEST_SKIPS["generic"].exit_code


class OnProcesses(MultiProcessTestCase):
    world_size = 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def test_rank_1_skips(self):
        if self.rank == 1:
            sys.exit(SKIP_CODE)

    def test_rank_0_skips(self):
        if self.rank == 0:
            self.skipTest("rank 0 has no use for it")

    def test_rank_1_exits_with_3(self):
        if self.rank == 1:
            sys.exit(3)


class OnThreads(MultiThreadedTestCase):
    world_size = 3

    def setUp(self):
        super().setUp()
        self._spawn_threads()

    def test_rank_2_skips(self):
        if dist.get_rank() == 2:
            self.skipTest("rank 2 has no use for it")


class OnReusedRanks(MultiProcContinuousTest):
    world_size = 2

    @classmethod
    def backend_str(cls):
        return "gloo"

    @classmethod
    def device_type(cls):
        return "cpu"

    def test_rank_1_skips(self):
        if self.rank == 1:
            # (self.skipTest() here errors on torch 2.13's harness, which takes
            # it for the rank's exception; 2.8's, 2.15's and distspawn skip.)
            sys.exit(SKIP_CODE)


if __name__ == "__main__":
    run_tests()
