"""Tests on the sharded-tensor base, as pytorch's checkpoint tests write them.

UPSTREAM_HARNESS=1 imports upstream's base; otherwise distspawn's.
"""

import os

import torch
import torch.distributed as dist
from torch.distributed._shard import sharded_tensor
from torch.distributed._shard.sharding_spec import ChunkShardingSpec

if os.environ.get("UPSTREAM_HARNESS") == "1":
    from torch.testing._internal.distributed._shard.sharded_tensor import (
        ShardedTensorTestBase,
        with_comms,
    )
else:
    from distspawn.sharded_tensor import ShardedTensorTestBase, with_comms


class ShardedTensors(ShardedTensorTestBase):
    @with_comms(init_rpc=False, backend="gloo")
    def test_a_chunked_tensor_holds_its_rows_on_each_rank(self):
        spec = ChunkShardingSpec(dim=0, placements=[f"rank:{r}/cpu" for r in range(4)])
        st = sharded_tensor.ones(spec, 8, 2)
        self.assertEqual(len(st.local_shards()), 1)
        self.assertEqual(st.local_shards()[0].tensor, torch.ones(2, 2))
        self.assertEqual(dist.get_world_size(), self.world_size)
        self.assertEqual(st.metadata().size, torch.Size([8, 2]))

    @with_comms(init_rpc=False, backend="gloo")
    def test_rank_2_fails(self):
        self.assertNotEqual(self.rank, 2)

    @with_comms(init_rpc=False)
    def test_nccl_needs_gpus(self):
        raise AssertionError("never runs without 4 GPUs")
