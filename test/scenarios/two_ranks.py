"""The base every scenario uses: two ranks, started in setUp as upstream files do."""

from distspawn import MultiProcessTestCase


class TwoRankTestCase(MultiProcessTestCase):
    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()
