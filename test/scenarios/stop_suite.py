"""_should_stop_test_suite, as upstream's run consults it (UPSTREAM_HARNESS=1: on upstream's).

Tests run in name order: a_* first. A distributed class never stops the run;
a class whose hook says so stops it after that test, failed or passed.
"""

import os
import sys

if os.environ.get("UPSTREAM_HARNESS") == "1":
    from torch.testing._internal.common_distributed import MultiProcessTestCase
    from torch.testing._internal.common_utils import TestCase, run_tests
else:
    from distspawn import MultiProcessTestCase, TestCase, run_tests

STOP_AFTER = os.environ.get("STOP_AFTER", "")


class A_DistributedFailureGoesOn(MultiProcessTestCase):
    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def test_fails(self):
        sys.exit(3)


class B_StopsWhenAsked(TestCase):
    def _should_stop_test_suite(self):
        return self._testMethodName == STOP_AFTER

    def test_a_fails(self):
        self.fail("the first failure")

    def test_b_passes(self):
        pass

    def test_c_runs_unless_stopped(self):
        print("TEST C RAN")


if __name__ == "__main__":
    run_tests()
