"""The conformance suite on a plugin backend, through the BACKEND / WORLD_SIZE / TEMP_DIR
contract. Run it with the matrix runner, which sets those for each run::

    python -m distspawn examples/plugin_conformance.py --backend wrapped_gloo --world-size 2,3

``--backend dropping_gloo`` runs it on the deliberately broken variant.
(Not named test_*: each backend needs its own process, which the runner gives it.)
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import wrapped_gloo  # noqa: E402

wrapped_gloo.register("wrapped_gloo")
wrapped_gloo.register("dropping_gloo", drop_rank=1)

from distspawn import read_dist_env, run_tests  # noqa: E402
from distspawn.distributed_test import DistributedTest, TestDistBackend  # noqa: E402

read_dist_env(("wrapped_gloo", "dropping_gloo"), program=__file__)


class TestPluginConformance(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()


if __name__ == "__main__":
    run_tests()
