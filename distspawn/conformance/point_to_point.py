"""Point-to-point messages and barriers (including ones that must time out)."""

from __future__ import annotations

import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from ..cases.dist_backend import require_backend_feature, require_world_size
from .common import backend, full, lacks_collective, value_of


class PointToPointTests:
    """send/recv, isend/irecv, batch_isend_irecv, tags, recv from any source."""

    def test_send_recv_every_pair(self):
        world, rank = dist.get_world_size(), dist.get_rank()
        for src in range(world):
            for dst in range(world):
                if src == dst:
                    continue
                if rank == src:
                    dist.send(full(100.0 * src + dst), dst)
                elif rank == dst:
                    got = full(-1.0)
                    dist.recv(got, src)
                    self.assertEqual(got, full(100.0 * src + dst))

    def test_isend_irecv_both_ways(self):
        world, rank = dist.get_world_size(), dist.get_rank()
        sends = [dist.isend(full(value_of(rank) * 10 + peer), peer)
                 for peer in range(world) if peer != rank]
        boxes = {peer: full(-1.0) for peer in range(world) if peer != rank}
        recvs = [dist.irecv(box, peer) for peer, box in boxes.items()]
        for work in sends + recvs:
            work.wait()
            self.assertTrue(work.is_completed())
        for peer, box in boxes.items():
            self.assertEqual(box, full(value_of(peer) * 10 + rank))

    def test_batch_isend_irecv_ring(self):
        world, rank = dist.get_world_size(), dist.get_rank()
        incoming = full(-1.0, size=4)
        ops = [dist.P2POp(dist.isend, full(value_of(rank), size=4), (rank + 1) % world),
               dist.P2POp(dist.irecv, incoming, (rank - 1) % world)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        self.assertEqual(incoming, full(value_of((rank - 1) % world), size=4))

    def test_send_recv_with_tags(self):
        world, rank = dist.get_world_size(), dist.get_rank()
        if rank == 0:
            for peer in range(1, world):
                dist.send(full(2.0), peer, tag=2)  # sent first, received second
                dist.send(full(1.0), peer, tag=1)
        else:
            first, second = full(-1.0), full(-1.0)
            second_work = dist.irecv(second, 0, tag=2)
            dist.recv(first, 0, tag=1)
            second_work.wait()
            self.assertEqual((first, second), (full(1.0), full(2.0)))

    def test_recv_from_any_source(self):
        if lacks_collective("sendrecv anysource"):
            self.skipTest(f"{backend()} cannot receive from any source")
        world, rank = dist.get_world_size(), dist.get_rank()
        if rank == 0:
            senders = set()
            for _ in range(world - 1):
                box = full(-1.0)
                sender = dist.recv(box)
                self.assertEqual(box, full(value_of(sender)))
                senders.add(sender)
            self.assertEqual(senders, set(range(1, world)))
        else:
            dist.send(full(value_of(rank)), 0)

    def test_send_recv_large_and_integer_tensors(self):
        world, rank = dist.get_world_size(), dist.get_rank()
        payload = torch.arange(1 << 18, dtype=torch.int64)
        if rank == 0:
            for peer in range(1, world):
                dist.send(payload + peer, peer)
        else:
            box = torch.empty_like(payload)
            dist.recv(box, 0)
            self.assertEqual(box, payload + rank)

    def test_send_to_self_is_an_error(self):
        with self.assertRaises((RuntimeError, ValueError)):
            dist.send(full(1.0), dist.get_rank())


class BarrierTests:
    """barrier, barrier on a group, a barrier that times out, monitored_barrier."""

    def test_barrier_orders_file_writes(self):
        test_dir = os.path.join(os.environ["TEMP_DIR"], "test_dir")
        with open(os.path.join(test_dir, f"arrived-{dist.get_rank()}"), "w"):
            pass
        dist.barrier()
        arrived = {name for name in os.listdir(test_dir) if name.startswith("arrived-")}
        self.assertEqual(arrived, {f"arrived-{r}" for r in range(dist.get_world_size())})
        dist.barrier()

    @require_backend_feature("subgroup")
    def test_barrier_subgroup(self):
        members = list(range(1, dist.get_world_size()))
        group = dist.new_group(members)
        result = dist.barrier(group=group)
        if dist.get_rank() not in members:
            self.assertIsNone(result)

    def test_barrier_timeout(self):
        if lacks_collective("cpu barrier"):
            self.skipTest(f"{backend()} has no CPU barrier")
        # Rank 0 never arrives on this group: everyone else must time out, not hang.
        timeout = timedelta(seconds=1)
        group = dist.new_group(timeout=timeout)
        if dist.get_rank() == 0:
            return
        started = time.monotonic()
        with self.assertRaises(RuntimeError):
            dist.barrier(group=group)
        self.assertLess(time.monotonic() - started, 30)

    @require_backend_feature("monitored_barrier")
    def test_monitored_barrier(self):
        dist.monitored_barrier(timeout=timedelta(seconds=30))
        dist.monitored_barrier(timeout=timedelta(seconds=30), wait_all_ranks=True)

    @require_backend_feature("monitored_barrier")
    def test_monitored_barrier_names_the_missing_rank(self):
        world, rank = dist.get_world_size(), dist.get_rank()
        group = dist.new_group(timeout=timedelta(seconds=5))
        missing = world - 1
        if rank == missing:
            return
        with self.assertRaises(RuntimeError) as caught:
            dist.monitored_barrier(group=group, timeout=timedelta(seconds=1))
        if rank == 0:
            self.assertIn(f"Rank {missing}", str(caught.exception))

    @require_world_size(3)
    @require_backend_feature("monitored_barrier")
    def test_monitored_barrier_wait_all_ranks_lists_every_missing_rank(self):
        world, rank = dist.get_world_size(), dist.get_rank()
        group = dist.new_group(timeout=timedelta(seconds=5))
        missing = list(range(1, world))
        if rank in missing:
            return
        with self.assertRaises(RuntimeError) as caught:
            dist.monitored_barrier(group=group, timeout=timedelta(seconds=1),
                                   wait_all_ranks=True)
        # gloo's wording: "Ranks 1, 2 failed to pass monitoredBarrier in 1000 ms"
        self.assertIn(f"Ranks {', '.join(map(str, missing))} failed", str(caught.exception))
