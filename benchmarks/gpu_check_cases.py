"""The cases benchmarks/gpu_check.py runs: faults and stalls on one device.

A test file, run under pytest by gpu_check.py once per configuration, which
it picks through the environment:
- GPU_CHECK_BACKEND: ``nccl`` (on ``cuda``) or ``gloo`` (on ``cpu``: the
  rehearsal, ``gpu_check.py --cpu``, which proves the check itself here);
- GPU_CHECK_TIER: ``forkserver`` (fresh rank processes, distspawn's default),
  ``spawn`` (fresh, started afresh; also what upstream's harness does) or
  ``reused`` (``MultiProcContinuousTest``);
- GPU_CHECK_WORLD: the world size (every rank on device 0 when there is one
  device: NCCL_MULTI_RANK_GPU_ENABLE=1, which gpu_check.py sets);
- GPU_CHECK_COPIES: more copies of the passing test, for the per-test cost;
- UPSTREAM_HARNESS=1: upstream's harness instead of distspawn's.
"""

import os
import sys
import time

import torch
import torch.distributed as dist

if os.environ.get("UPSTREAM_HARNESS") == "1":
    from torch.testing._internal.common_distributed import (
        TIMEOUT_OVERRIDE,
        MultiProcContinuousTest,
        MultiProcessTestCase,
    )
    from torch.testing._internal.common_utils import run_tests
else:
    from distspawn import TIMEOUT_OVERRIDE, MultiProcContinuousTest, MultiProcessTestCase, run_tests

BACKEND = os.environ.get("GPU_CHECK_BACKEND", "gloo")
DEVICE = "cuda" if BACKEND == "nccl" else "cpu"
TIER = os.environ.get("GPU_CHECK_TIER", "forkserver")
WORLD = int(os.environ.get("GPU_CHECK_WORLD", "2"))
HANG_DEADLINE_S = 10
TIMEOUT_OVERRIDE["test_hang"] = HANG_DEADLINE_S


class Cases:
    """Fault and stall bodies: rank 1 misbehaves, the others do their part."""

    def group(self):
        if DEVICE == "cuda":
            torch.cuda.set_device(self.rank % torch.cuda.device_count())
        if not dist.is_initialized():  # fresh processes make their own group
            store = dist.FileStore(self.file_name, self.world_size)
            dist.init_process_group(BACKEND, rank=self.rank, world_size=self.world_size,
                                    store=store)

    def ones(self, *shape):
        return torch.ones(*shape, device=DEVICE)

    def all_reduce_and_check(self):
        t = self.ones(4)
        dist.all_reduce(t)
        assert t.tolist() == [float(self.world_size)] * 4, t

    def test_pass(self):
        self.group()
        self.all_reduce_and_check()

    def test_raise(self):
        self.group()
        self.all_reduce_and_check()
        if self.rank == 1:
            raise ValueError("boom from rank 1")
        self.all_reduce_and_check()

    def test_exit_code(self):
        self.group()
        self.all_reduce_and_check()
        if self.rank == 1:
            sys.exit(3)
        self.all_reduce_and_check()

    def test_segfault(self):
        self.group()
        self.all_reduce_and_check()
        if self.rank == 1:
            import signal
            import threading

            signal.pthread_kill(threading.get_ident(), signal.SIGSEGV)
        self.all_reduce_and_check()

    def test_hang(self):
        # rank 1 sleeps outside any collective: no stall to name, the deadline ends it
        self.group()
        self.all_reduce_and_check()
        if self.rank == 1:
            time.sleep(10 * HANG_DEADLINE_S)
        self.all_reduce_and_check()

    def test_skip(self):
        self.skipTest("skipped on every rank")

    # -- stalls: collectives that can never complete ---------------------------

    def test_stall_shapes_differ(self):
        self.group()
        self.all_reduce_and_check()
        dist.all_reduce(self.ones(3 if self.rank == 1 else 2))

    def test_stall_ops_differ(self):
        self.group()
        self.all_reduce_and_check()
        if self.rank == 1:
            dist.broadcast(self.ones(4), src=0)
        else:
            dist.all_reduce(self.ones(4))

    def test_stall_a_rank_skips_a_collective(self):
        self.group()
        self.all_reduce_and_check()
        if self.rank != 1:
            dist.all_reduce(self.ones(4))

    def test_stall_send_facing_send(self):
        self.group()
        self.all_reduce_and_check()
        if self.rank in (0, 1):
            dist.send(self.ones(4), dst=1 - self.rank)

    def test_slow_but_matching(self):
        self.group()
        self.all_reduce_and_check()
        if self.rank == 1:
            time.sleep(6)
        self.all_reduce_and_check()


for copy in range(1, int(os.environ.get("GPU_CHECK_COPIES", "1"))):
    setattr(Cases, f"test_pass_{copy}", Cases.test_pass)


if TIER in ("forkserver", "spawn"):
    class OnFreshRanks(Cases, MultiProcessTestCase):
        @property
        def world_size(self):
            return WORLD

        def setUp(self):
            super().setUp()
            self._spawn_processes()

elif TIER == "reused":
    class OnReusedRanks(Cases, MultiProcContinuousTest):
        world_size = WORLD

        @classmethod
        def backend_str(cls):
            return BACKEND

        @classmethod
        def device_type(cls):
            return DEVICE

else:
    raise ValueError(f"GPU_CHECK_TIER={TIER!r}: expected forkserver, spawn or reused")


if __name__ == "__main__":
    run_tests()
