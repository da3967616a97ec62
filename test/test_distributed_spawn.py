"""Entry file: run the backend conformance suite through TestDistBackend.

Shaped like upstream's ``test/distributed/test_distributed_spawn.py``; the
run is chosen by environment variables, e.g.::

    BACKEND=gloo WORLD_SIZE=2 TEMP_DIR=$(mktemp -d) python test/test_distributed_spawn.py

A missing or invalid variable stops the run with a message saying which and
what is expected (upstream prints "Invalid backend" and exits 0 instead).
"""

import os
import sys

import torch
import torch.distributed as dist

torch.backends.cuda.matmul.allow_tf32 = False

if not dist.is_available():
    print("Distributed not available, skipping tests", file=sys.stderr)
    sys.exit(0)

from distspawn import (  # noqa: E402
    NO_MULTIPROCESSING_SPAWN,
    DistEnvError,
    read_dist_env,
    run_tests,
)
from distspawn.distributed_test import DistributedTest, TestDistBackend  # noqa: E402

if NO_MULTIPROCESSING_SPAWN:
    print("Spawn not available, skipping tests.", file=sys.stderr)
    sys.exit(0)

_allowed_backends = ("gloo", "nccl", "ucc")

try:
    BACKEND = read_dist_env(_allowed_backends, program=__file__).backend
except DistEnvError as error:
    sys.exit(f"{os.path.basename(__file__)}: {error}")


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()
        torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()


if __name__ == "__main__":
    run_tests()
