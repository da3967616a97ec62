"""Two threaded tests whose verdicts differ between upstream's harness and
distspawn's on purpose; run unchanged (the stand-in mode) they get upstream's.

- NeverStartsThreads: its setUp does not start the rank threads. Upstream's
  harness passes the test without running the body; distspawn fails it.
- WrapsAThreadedTest: a rank's AssertionError reaches the caller as upstream's
  RuntimeError; distspawn's failure is both, so assertRaises(AssertionError)
  catches it only there.

UPSTREAM_HARNESS=1 imports upstream's harness (also what the stand-in mode runs).
"""

import os

import torch.distributed as dist

if os.environ.get("UPSTREAM_HARNESS") == "1":
    from torch.testing._internal.common_distributed import (
        MultiThreadedTestCase,
        spawn_threads_and_init_comms,
    )
    from torch.testing._internal.common_utils import TestCase, run_tests
else:
    from distspawn import MultiThreadedTestCase, TestCase, run_tests, spawn_threads_and_init_comms


@spawn_threads_and_init_comms(world_size=2)
def rank_1_asserts(test):
    if dist.get_rank() == 1:
        raise AssertionError("rank 1 asserts")


class NeverStartsThreads(MultiThreadedTestCase):
    @property
    def world_size(self):
        return 2

    def test_body_that_would_fail(self):
        raise AssertionError("the body ran")


class WrapsAThreadedTest(TestCase):
    def test_expects_the_ranks_assertion_error(self):
        with self.assertRaises(AssertionError):
            rank_1_asserts(self)

    def test_expects_a_runtime_error(self):
        with self.assertRaisesRegex(RuntimeError, "rank 1 asserts|Thread 1"):
            rank_1_asserts(self)


if __name__ == "__main__":
    run_tests()
