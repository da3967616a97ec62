"""Collectives that can never finish, and two that only take a while.

DISTSPAWN_STALL_TIER picks the base: "processes" (distspawn's
MultiProcessTestCase), "reused" (MultiProcContinuousTest) or "upstream"
(upstream's MultiProcessTestCase, for the stand-in mode and upstream's own
harness). The deadline (DISTRIBUTED_TESTS_DEFAULT_TIMEOUT) is left alone: a
stalled row must fail long before it, a slow one must pass.
"""

import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

TIER = os.environ.get("DISTSPAWN_STALL_TIER", "processes")
if TIER == "upstream":
    from torch.testing._internal.common_distributed import MultiProcessTestCase
    from torch.testing._internal.common_utils import run_tests
else:
    from distspawn import MultiProcContinuousTest, MultiProcessTestCase, run_tests


class Rows:
    def test_shapes_differ(self):
        t = torch.ones(2)
        dist.all_reduce(t)
        dist.all_reduce(torch.ones(2 + (self.rank == 1)))

    def test_dtypes_differ(self):
        dtype = torch.float64 if self.rank == 2 else torch.float32
        dist.all_reduce(torch.ones(4, dtype=dtype))

    def test_all_reduce_against_broadcast(self):
        t = torch.ones(4)
        if self.rank == 0:
            dist.broadcast(t, src=0)
        else:
            dist.all_reduce(t)

    def test_broadcast_roots_differ(self):
        t = torch.ones(4)
        dist.broadcast(t, src=1 if self.rank == 2 else 0)

    def test_a_rank_skips_a_collective_and_returns(self):
        t = torch.ones(2)
        dist.all_reduce(t)
        if self.rank != 2:
            dist.all_reduce(t)

    def test_reduce_ops_differ(self):
        # Nothing waits: gloo combines with each rank's own op.
        dist.all_reduce(torch.ones(2))
        op = dist.ReduceOp.MAX if self.rank == 1 else dist.ReduceOp.SUM
        dist.all_reduce(torch.ones(2), op=op)

    def test_a_rank_calls_a_subgroup_collective_it_is_not_in(self):
        group = dist.new_group([0, 1])
        t = torch.ones(2)
        if self.rank == 2:
            dist.all_reduce(t, group=group)  # not a member: returns at once
        elif self.rank == 0:
            dist.all_reduce(t, group=group)
        else:
            dist.all_reduce(t)  # the default group instead

    def test_a_rank_exits_early(self):
        if self.rank == 1:
            sys.stdout.flush()
            os._exit(0)
        dist.all_reduce(torch.ones(2))

    def test_send_facing_send(self):
        if self.rank < 2:
            dist.send(torch.ones(2), dst=1 - self.rank)

    def test_recv_facing_recv(self):
        if self.rank < 2:
            dist.recv(torch.ones(2), src=1 - self.rank)

    def test_a_rank_waits_in_the_store_outside_any_collective(self):
        t = torch.ones(2)
        dist.all_reduce(t)
        if self.rank == 2:
            store().get("never set")
        dist.all_reduce(t)

    def test_every_rank_still_running_waits_in_the_store(self):
        if self.rank < 2:
            store().get(f"set by rank {1 - self.rank} later")

    def test_a_store_wait_that_gives_up_before_the_deadline(self):
        # Not judged: the rank gets its error back after 4 s and goes on.
        if self.rank == 2:
            try:
                store().wait(["never set"], timedelta(seconds=4))
            except Exception:  # noqa: BLE001 - the store's timeout, as the test expects
                pass
        dist.all_reduce(torch.ones(2))

    def test_a_store_key_set_by_a_busy_rank(self):
        if self.rank == 0:
            time.sleep(4)
            store().set("ready", "1")
        else:
            store().get("ready")
        dist.all_reduce(torch.ones(2))

    def test_slow_rank_joins_a_matching_collective(self):
        if self.rank == 1:
            time.sleep(8)
        dist.all_reduce(torch.ones(2))

    def test_compiled_all_reduce_with_a_reduce_op(self):
        # torch.compile rewrites dist.all_reduce into a traceable collective;
        # distspawn's recording wrapper must be rewritten the same way.
        def doubled_max(t):
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            return t * 2

        compiled = torch.compile(doubled_max, fullgraph=True, backend="eager")
        out = compiled(torch.full((2,), float(self.rank)))
        assert out.tolist() == [2.0 * (self.world_size - 1)] * 2, out

    def test_large_matching_all_reduce(self):
        t = torch.ones(8 * 1024 * 1024)  # 32 MB a rank
        dist.all_reduce(t)
        assert t[0].item() == self.world_size


def store():
    """The default group's store: what rank processes share."""
    return dist.distributed_c10d._get_default_store()


if TIER == "reused":
    class Stalls(Rows, MultiProcContinuousTest):
        world_size = 3
        start_method = "fork"

        @classmethod
        def backend_str(cls):
            return "gloo"
else:
    class Stalls(Rows, MultiProcessTestCase):
        @property
        def world_size(self):
            return 3

        def setUp(self):
            super().setUp()
            self._spawn_processes()

        def tearDown(self):
            super().tearDown()
            try:
                os.remove(self.file_name)
            except OSError:
                pass

        def run_test(self, test_name, parent_pipe):
            # Each rank joins the default group first, as upstream-style files do.
            dist.init_process_group("gloo", rank=self.rank, world_size=self.world_size,
                                    init_method=f"file://{self.file_name}")
            super().run_test(test_name, parent_pipe)


if __name__ == "__main__":
    run_tests()
