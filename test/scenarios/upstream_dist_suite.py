"""Upstream's own DistributedTest suite (from the torch wheel) on either harness.

BACKEND, WORLD_SIZE and TEMP_DIR choose the run, as in upstream's
test_distributed_spawn.py. UPSTREAM_HARNESS=1 runs it through upstream's
TestDistBackend; otherwise through distspawn's, with upstream's test bodies
unchanged. Needs torch.testing._internal to import (expecttest installed).
"""

import os

import torch
from torch.testing._internal.distributed.distributed_test import DistributedTest

if os.environ.get("UPSTREAM_HARNESS") == "1":
    from torch.testing._internal.common_utils import run_tests
    from torch.testing._internal.distributed.distributed_test import TestDistBackend
else:
    from distspawn import run_tests
    from distspawn.distributed_test import TestDistBackend


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()
        torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()


if __name__ == "__main__":
    run_tests()
