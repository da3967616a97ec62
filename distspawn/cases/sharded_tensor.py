"""``ShardedTensorTestBase`` and its ``with_comms``: upstream's base for the
sharded-tensor and checkpoint tests, on distspawn's rank processes.

Each test runs on ``TEST_GPU_NUM`` (4) ranks; ``with_comms`` sets up the
default group (and, unless told not to, torch RPC) around the test and takes
them down after it. A backend that needs accelerators the machine lacks makes
every rank skip with upstream's multi-GPU reason.
"""

from __future__ import annotations

import sys
from functools import partial, wraps
from typing import Any, Callable

import torch
import torch.distributed as dist

from ..fixtures.helpers import tp_transports
from ..fixtures.skips import gpu_count_skip
from .multiprocess import MultiProcessTestCase

TEST_GPU_NUM = 4
_BACKENDS = ("nccl", "gloo", "mpi", "hccl", "xccl")
_ACCELERATOR_BACKENDS = ("nccl", "xccl", "hccl")


class ShardedTensorTestBase(MultiProcessTestCase):
    """Rank processes for sharded-tensor tests, started in ``setUp``."""

    @property
    def world_size(self) -> int:
        return TEST_GPU_NUM

    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()

    def init_pg(self, backend: str = "nccl") -> None:
        if backend not in _BACKENDS:
            raise RuntimeError(f"Backend {backend} not supported!")
        dist.init_process_group(backend=backend, world_size=self.world_size, rank=self.rank,
                                init_method=f"file://{self.file_name}")
        if backend in ("nccl", "xccl"):
            torch.accelerator.set_device_index(self.rank)

    def init_rpc(self) -> None:
        from torch.distributed import rpc

        options = rpc.TensorPipeRpcBackendOptions(_transports=tp_transports())
        options.init_method = f"file://{self.file_name}"
        for peer in range(self.world_size):
            options.set_device_map(f"worker{peer}", {peer: self.rank, self.rank: peer})
        rpc.init_rpc(name=f"worker{self.rank:d}", rank=self.rank, world_size=self.world_size,
                     rpc_backend_options=options)

    def init_comms(self, init_rpc: bool = True, backend: str = "nccl") -> None:
        if init_rpc:
            self.init_rpc()
        self.init_pg(backend=backend)

    def destroy_comms(self, destroy_rpc: bool = True) -> None:
        dist.barrier()  # every rank is done before any tears down
        if destroy_rpc:
            from torch.distributed import rpc

            rpc.shutdown()
        dist.destroy_process_group()

    def assert_sharded_tensor_equal(self, st1: Any, st2: Any) -> None:
        mine, theirs = st1.local_shards(), st2.local_shards()
        self.assertEqual(len(mine), len(theirs))
        for shard, other in zip(mine, theirs):
            self.assertEqual(shard.tensor, other.tensor)
            self.assertEqual(shard.metadata, other.metadata)
        self.assertEqual(st1.metadata(), st2.metadata())
        self.assertEqual(st1.sharding_spec(), st2.sharding_spec())
        self.assertEqual(len(st1.remote_shards()), len(st2.remote_shards()))


def _lacks_devices_for(backend: str, world_size: int) -> bool:
    if backend not in _ACCELERATOR_BACKENDS:
        return False
    accelerator = torch.accelerator.current_accelerator()
    return (accelerator is None
            or dist.get_default_backend_for_device(accelerator) != backend
            or torch.accelerator.device_count() < world_size)


def with_comms(func: Callable | None = None, init_rpc: bool = True,
               backend: str = "nccl") -> Callable:
    """Run the test between ``self.init_comms(...)`` and ``self.destroy_comms(...)``.

    Bare (``@with_comms``) or with arguments (``@with_comms(init_rpc=False,
    backend="gloo")``).
    """
    if func is None:
        return partial(with_comms, init_rpc=init_rpc, backend=backend)

    @wraps(func)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> None:
        if _lacks_devices_for(backend, self.world_size):
            sys.exit(gpu_count_skip(self.world_size).exit_code)
        self.init_comms(init_rpc=init_rpc, backend=backend)
        func(self, *args, **kwargs)
        self.destroy_comms(destroy_rpc=init_rpc)

    return wrapper
