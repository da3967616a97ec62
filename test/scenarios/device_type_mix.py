"""Imports switched to distspawn's, beside upstream's instantiate_device_type_tests
(whose CPUTestBase is upstream's common_utils.TestCase), as pytorch's
test_c10d_object_collectives.py does."""

import torch.distributed as dist
from torch.testing._internal.common_device_type import instantiate_device_type_tests

from distspawn import run_tests
from distspawn.compat import DistributedTestBase


class MixedBases(DistributedTestBase):
    def test_all_gather_object(self, device):
        self.create_pg(device=device)
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, self.rank)
        self.assertEqual(gathered, list(range(self.world_size)))
        dist.destroy_process_group()


instantiate_device_type_tests(MixedBases, globals(), only_for=("cpu",))

if __name__ == "__main__":
    run_tests()
