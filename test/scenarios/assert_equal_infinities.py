"""assertEqual on infinities, in rank threads, written for upstream's harness.

pytorch's tensor/test_op_strategy.py checks that a redistribute cost is
float("inf"). SWITCHED=1 imports distspawn's names instead (a file whose
imports were switched). On every harness: equal infinities pass, opposite
ones fail.
"""

import os

if os.environ.get("SWITCHED") == "1":
    from distspawn import MultiThreadedTestCase, run_tests
else:
    from torch.testing._internal.common_distributed import MultiThreadedTestCase
    from torch.testing._internal.common_utils import run_tests

INF = float("inf")


class Infinities(MultiThreadedTestCase):
    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_threads()

    def test_equal_infinities(self):
        self.assertEqual(INF, INF)
        self.assertEqual([-INF, 1.0], [-INF, 1.0])

    def test_opposite_infinities(self):
        self.assertEqual(INF, -INF)


if __name__ == "__main__":
    run_tests()
