"""Run the backend conformance suite on gloo, the way test_distributed_spawn.py does.

Upstream's entry file needs BACKEND, WORLD_SIZE and TEMP_DIR set by hand; this
example fills in defaults (gloo, 2 ranks, the system temp dir) so that
``python -m pytest examples`` runs it as is. Override any of them to try another
configuration, e.g. ``BACKEND=gloo WORLD_SIZE=3 python -m pytest examples``.
For a plugin backend, add its name to ``DistTestCases.backend_feature["plugin"]``
(and to the feature sets it supports) and set BACKEND to it.
"""

import os
import tempfile

os.environ.setdefault("BACKEND", "gloo")
os.environ.setdefault("WORLD_SIZE", "2")
os.environ.setdefault("TEMP_DIR", tempfile.gettempdir())

from distspawn import run_tests  # noqa: E402
from distspawn.distributed_test import DistributedTest, TestDistBackend  # noqa: E402


class TestGlooConformance(TestDistBackend, DistributedTest._DistTestBase):
    # CPU-only ranks with no threads started yet: forking is safe and much faster.
    start_method = "fork"

    def setUp(self):
        super().setUp()
        self._spawn_processes()


if __name__ == "__main__":
    run_tests()
