"""One process as rank 3 of 8 on the fake backend; prints what it saw as JSON.

Usage: python fake_world.py [upstream]   (upstream: torch.testing._internal's fake_pg)
"""

import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

if "upstream" in sys.argv[1:]:
    from torch.testing._internal.distributed.fake_pg import FakeStore
else:
    from distspawn.fake_pg import FakeStore

dist.init_process_group("fake", store=FakeStore(), rank=3, world_size=8)
tensor = torch.ones(4)
dist.all_reduce(tensor)
gathered = [torch.empty(2) for _ in range(8)]
dist.all_gather(gathered, torch.zeros(2))
mesh = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
sharded = distribute_tensor(torch.arange(64.0).reshape(8, 8), mesh, [Replicate(), Shard(0)])
seen = {
    "rank": dist.get_rank(),
    "world_size": dist.get_world_size(),
    "backend": dist.get_backend(),
    "mesh": mesh.mesh.tolist(),
    "tp_coordinate": mesh.get_coordinate(),
    "local_shape": list(sharded.to_local().shape),
    "global_shape": list(sharded.shape),
    "gathered": len(gathered),
}
dist.destroy_process_group()
print("SEEN " + json.dumps(seen, sort_keys=True))
