"""A file written for upstream's harness and the bases built on it, imports untouched.

Run as it is, it uses upstream's harness; with distspawn's zero-change mode
(``pytest --distspawn-stand-in``, ``DISTSPAWN_STAND_IN=1 pytest`` or
``python -m distspawn.stand_in upstream_derived.py``) the same classes run on
distspawn's engine. Nothing here names distspawn, on purpose.
"""

import copy

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.testing._internal.common_device_type import instantiate_device_type_tests
from torch.testing._internal.common_distributed import MultiProcessTestCase, skip_if_lt_x_gpu
from torch.testing._internal.common_fsdp import MLP, FSDPTest, FSDPTestMultiThread
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.common_dtensor import (
    DTensorOpTestBase,
    DTensorTestBase,
    with_comms,
)

try:  # torch 2.9 and later; torch 2.8's common_dtensor has no local-tensor base
    from torch.testing._internal.distributed._tensor.common_dtensor import LocalDTensorTestBase
except ImportError:
    LocalDTensorTestBase = None


class DTensorOnRanks(DTensorTestBase):
    @property
    def world_size(self):
        return 4

    @with_comms
    def test_shard_then_replicate(self):
        mesh = self.build_device_mesh()
        full = torch.arange(16.0).reshape(4, 4)
        sharded = distribute_tensor(full, mesh, [Shard(0)])
        self.assertEqual(sharded.to_local(), full[self.rank:self.rank + 1])
        self.assertEqual(sharded.redistribute(mesh, [Replicate()]).to_local(), full)

    @with_comms
    def test_rank_2_disagrees(self):
        self.assertNotEqual(self.rank, 2, "rank 2 disagrees")

    @skip_if_lt_x_gpu(8)
    @with_comms
    def test_wants_eight_gpus(self):
        pass


if LocalDTensorTestBase is not None:
    class AllRanksInOneProcess(LocalDTensorTestBase):
        # Upstream's local-tensor base overrides the harness's own hooks
        # (_spawn_processes, run_test, join_or_run): every rank in this process.
        @property
        def world_size(self):
            return 4

        @with_comms
        def test_local_tensor_mode(self):
            mesh = self.build_device_mesh()
            with self._get_local_tensor_mode():
                full = torch.arange(16.0).reshape(4, 4)
                self.assertEqual(distribute_tensor(full, mesh, [Shard(0)]).full_tensor(), full)


class PerDeviceType(DTensorTestBase):
    # instantiate_device_type_tests mixes upstream's own TestCase subclass
    # (CPUTestBase) into the class: setUp must still reach the harness.
    @property
    def world_size(self):
        return 2

    @with_comms
    def test_mesh_on(self, device):
        self.assertEqual(self.build_device_mesh().device_type, device)


instantiate_device_type_tests(PerDeviceType, globals(), only_for=("cpu",))


class DTensorOnThreads(DTensorOpTestBase):
    @property
    def world_size(self):
        return 4

    def test_shard_on_threads(self):
        mesh = self.build_device_mesh()
        sharded = distribute_tensor(torch.ones(4, 4), mesh, [Shard(1)])
        self.assertEqual(sharded.full_tensor(), torch.ones(4, 4))


class PlainProcesses(MultiProcessTestCase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()

    @property
    def world_size(self):
        return 2

    def test_all_reduce(self):
        dist.init_process_group("gloo", rank=self.rank, world_size=self.world_size,
                                init_method=f"file://{self.file_name}")
        t = torch.ones(2)
        dist.all_reduce(t)
        self.assertEqual(t, torch.full((2,), 2.0))
        dist.destroy_process_group()


class FSDPOnRanks(FSDPTest):
    @property
    def world_size(self):
        return 2

    def test_fully_shard(self):  # upstream's FSDPTest: skips without 2 GPUs
        model = MLP(8)
        fully_shard(copy.deepcopy(model))


class FSDPOnThreads(FSDPTestMultiThread):
    @property
    def world_size(self):
        return 2

    def test_fully_shard_on_threads(self):
        model = MLP(8)
        fully_shard(model)
        model(torch.randn(2, 8)).sum().backward()
        self.assertIsNotNone(next(model.parameters()).grad)


if __name__ == "__main__":
    run_tests()
