"""Classes on rank threads made per device by instantiate_device_type_tests,
as pytorch's DTensor op tests do (DTensorOpTestBase). Such a class keeps its
precision in a thread-local the importing thread set; each rank thread needs
its own, or reading ``self.precision`` raises AttributeError in every rank.
Every test passes on upstream's harness, on distspawn's and unchanged in the
stand-in mode.

UPSTREAM_HARNESS=1 imports upstream's harness (also what the stand-in mode runs).
"""

import os

import torch
import torch.distributed as dist
from torch.testing._internal.common_device_type import (
    dtypes,
    instantiate_device_type_tests,
    precisionOverride,
)

if os.environ.get("UPSTREAM_HARNESS") == "1":
    from torch.testing._internal.common_distributed import MultiThreadedTestCase
    from torch.testing._internal.common_utils import run_tests
    from torch.testing._internal.distributed._tensor.common_dtensor import DTensorOpTestBase
else:
    from distspawn import run_tests
    from distspawn.compat import MultiThreadedTestCase
    from distspawn.dtensor import DTensorOpTestBase


class RankThreadsPerDevice(MultiThreadedTestCase):
    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_threads()

    def test_all_reduce(self, device):
        t = torch.ones(2, device=device)
        dist.all_reduce(t)
        self.assertEqual(t, torch.full((2,), 2.0, device=device))

    @dtypes(torch.float32)
    @precisionOverride({torch.float32: 0.5})
    def test_precision_override(self, device, dtype):
        # The override is set in the rank's thread, for this test only.
        self.assertEqual(self.precision, 0.5)
        self.assertEqual(torch.tensor(1.0), torch.tensor(1.4))


class DTensorOpsPerDevice(DTensorOpTestBase):
    def test_rank_sees_its_world(self, device):
        self.assertEqual(dist.get_world_size(), self.world_size)
        self.assertEqual(self.precision, 0)


instantiate_device_type_tests(RankThreadsPerDevice, globals(), only_for=("cpu",))
instantiate_device_type_tests(DTensorOpsPerDevice, globals(), only_for=("cpu",))

if __name__ == "__main__":
    run_tests()
