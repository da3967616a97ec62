"""The bases the scenarios use: two ranks, started in setUp as upstream files
do, or two reused gloo workers."""

from distspawn import MultiProcContinuousTest, MultiProcessTestCase


class TwoRankTestCase(MultiProcessTestCase):
    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()


class TwoRankReusedTestCase(MultiProcContinuousTest):
    world_size = 2

    @classmethod
    def backend_str(cls):
        return "gloo"
