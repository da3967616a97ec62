"""One class asks for world sizes, one does not: only the first can't be collected."""

import pytest

from distspawn import MultiThreadedTestCase


class Sized(MultiThreadedTestCase):
    @pytest.mark.world_size(2, 3)
    def test_needs_sizes(self):
        pass


class Plain(MultiThreadedTestCase):
    world_size = 2

    def setUp(self):
        super().setUp()
        self._spawn_threads()

    def test_runs_as_pytest_collects_it(self):
        self.assertLess(self.rank, 2)
