"""A file that names a rank-process class without deriving a test class from it.

It imports ``MultiProcessTestCase`` for an ``isinstance`` check and a type
hint (as files written for upstream's harness do beside their threaded
tests): no rank process starts, so the plugin should start no rank server;
run with ``-p count_server_starts``, the run ends with how many it started.
UPSTREAM_HARNESS=1 imports the names from upstream's harness (for the
stand-in mode).
"""

import os

import torch
import torch.distributed as dist

if os.environ.get("UPSTREAM_HARNESS") == "1":
    from torch.testing._internal.common_distributed import (
        MultiProcessTestCase,
        MultiThreadedTestCase,
    )
    from torch.testing._internal.common_utils import run_tests
else:
    from distspawn import MultiProcessTestCase, MultiThreadedTestCase, run_tests


def runs_on_rank_processes(case: object) -> bool:
    return isinstance(case, MultiProcessTestCase)


class Threads(MultiThreadedTestCase):
    @property
    def world_size(self) -> int:
        return 2

    def setUp(self) -> None:
        super().setUp()
        self._spawn_threads()

    def test_all_reduce_on_threads(self) -> None:
        tensor = torch.ones(2)
        dist.all_reduce(tensor)
        self.assertEqual(tensor, torch.full((2,), 2.0))
        self.assertFalse(runs_on_rank_processes(self))


if __name__ == "__main__":
    run_tests()
