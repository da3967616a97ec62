"""Object collectives: pickled Python objects between ranks."""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..cases.dist_backend import require_backend_feature
from .common import place

# Objects of several kinds: containers, None, a tensor, a nested structure.
_OBJECTS = [
    {"key": "value", "numbers": [1, 2, 3]},
    None,
    "a string with unicode: \u00e9\u00e8",
    (1.5, ("nested", {"deep": [None]})),
    12345678901234567890,
]


def _object_of(rank: int):
    return _OBJECTS[rank % len(_OBJECTS)], rank


class ObjectTests:
    """broadcast_object_list, all_gather_object, gather_object, scatter_object_list,
    send/recv_object_list, on the world and on a group."""

    def test_broadcast_object_list_from_every_rank(self):
        for src in range(dist.get_world_size()):
            holder = list(_object_of(src)) if dist.get_rank() == src else [None, None]
            dist.broadcast_object_list(holder, src=src)
            self.assertEqual(tuple(holder), _object_of(src))

    def test_broadcast_object_list_with_tensor(self):
        holder = [torch.arange(4.0)] if dist.get_rank() == 0 else [None]
        dist.broadcast_object_list(holder, src=0)
        self.assertEqual(holder[0], torch.arange(4.0))

    def test_all_gather_object_every_kind(self):
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, _object_of(dist.get_rank()))
        self.assertEqual(gathered, [_object_of(r) for r in range(dist.get_world_size())])

    def test_gather_object(self):
        dst = dist.get_world_size() - 1
        out = [None] * dist.get_world_size() if dist.get_rank() == dst else None
        dist.gather_object(_object_of(dist.get_rank()), out, dst=dst)
        if dist.get_rank() == dst:
            self.assertEqual(out, [_object_of(r) for r in range(dist.get_world_size())])

    def test_scatter_object_list(self):
        world = dist.get_world_size()
        inputs = [_object_of(r) for r in range(world)] if dist.get_rank() == 0 else None
        out = [None]
        dist.scatter_object_list(out, inputs, src=0)
        self.assertEqual(out[0], _object_of(dist.get_rank()))

    def test_send_recv_object_list(self):
        world, rank = dist.get_world_size(), dist.get_rank()
        if rank == 0:
            for peer in range(1, world):
                dist.send_object_list([_object_of(peer), {"to": peer}], dst=peer)
        else:
            holder = [None, None]
            dist.recv_object_list(holder, src=0)
            self.assertEqual(holder, [_object_of(rank), {"to": rank}])

    @require_backend_feature("subgroup")
    def test_all_gather_object_subgroup(self):
        at = place("subgroup")
        gathered = [None] * at.size
        dist.all_gather_object(gathered, _object_of(at.rank), group=at.group)
        if at.member:
            self.assertEqual(gathered, [_object_of(r) for r in at.members])
        else:
            self.assertEqual(gathered, [None] * at.size)

    @require_backend_feature("subgroup")
    def test_broadcast_object_list_subgroup(self):
        at = place("subgroup")
        src = at.members[-1]
        holder = ["from", src] if at.rank == src else [None, None]
        dist.broadcast_object_list(holder, src=src, group=at.group)
        self.assertEqual(holder, ["from", src] if at.member else [None, None])
