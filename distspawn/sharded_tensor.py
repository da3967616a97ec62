"""Upstream's sharded-tensor test base (``distributed/_shard/sharded_tensor``
under ``torch/testing/_internal/`` in the torch wheel), which pytorch's
checkpoint and sharding tests build on.

    from distspawn.sharded_tensor import ShardedTensorTestBase, with_comms
"""

from __future__ import annotations

from .cases.multiprocess import MultiProcessTestCase
from .cases.sharded_tensor import TEST_GPU_NUM, ShardedTensorTestBase, with_comms
from .fixtures.helpers import tp_transports
from .fixtures.skips import TEST_SKIPS

__all__ = ["TEST_GPU_NUM", "ShardedTensorTestBase", "with_comms",
           # from the rest of the harness, as upstream's module has them
           "MultiProcessTestCase", "TEST_SKIPS", "tp_transports"]
