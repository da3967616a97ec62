"""Run under -n: the rank server starts on a guess, while the worker collects,
only where a core is left over for it (fewer workers than cores)."""

import os

import distspawn.early.plugin as distspawn_pytest
from distspawn import MultiProcessTestCase


class Ranks(MultiProcessTestCase):
    world_size = 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def test_ranks(self):
        assert self.rank in (0, 1)


def test_early_start_only_with_a_core_to_spare():
    workers = int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    spare = workers < len(os.sched_getaffinity(0))
    assert distspawn_pytest._early_server_tried == spare, (workers, spare)
