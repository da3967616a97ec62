"""Rank tests written for upstream's harness that all run under LocalTensorMode.

As in pytorch's ``tensor/parallel/test_tp_style.py``: a DTensor class is made
into per-device classes for every device but the CPU (so, on a machine
without an accelerator, into none), and into a ``create_local_tensor_test_class``
copy that runs every rank in the test process. No rank process starts, so the
stand-in mode should start no rank server; run with ``-p count_server_starts``,
the run ends with how many it started.
"""

import torch.distributed as dist
from torch.testing._internal.common_device_type import instantiate_device_type_tests
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.common_dtensor import (
    DTensorTestBase,
    create_local_tensor_test_class,
    with_comms,
)


class Sums(DTensorTestBase):
    @with_comms
    def test_world(self):
        self.assertEqual(dist.get_world_size(), self.world_size)


SumsWithLocalTensor = create_local_tensor_test_class(Sums)

instantiate_device_type_tests(Sums, globals(), except_for=["cpu"])

if __name__ == "__main__":
    run_tests()
