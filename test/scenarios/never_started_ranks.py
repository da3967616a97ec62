"""A MultiProcessTestCase class whose setUp never starts the rank processes.

Upstream's harness passes each test without running its body (it only logs
that no subprocess was spawned); distspawn fails it, saying how to start the
ranks; run unchanged (the stand-in mode), a file gets upstream's pass, with a
warning. A real file that checks ``skip_if_lt_x_gpu`` on each base has such
a class: a world of 8 and ``skip_if_lt_x_gpu(8)`` on a body that fails
where it runs without 8 GPUs.

UPSTREAM_HARNESS=1 imports upstream's harness (also what the stand-in mode runs).
"""

import os

import torch

if os.environ.get("UPSTREAM_HARNESS") == "1":
    from torch.testing._internal.common_distributed import MultiProcessTestCase, skip_if_lt_x_gpu
    from torch.testing._internal.common_utils import run_tests
else:
    from distspawn import run_tests
    from distspawn.compat import MultiProcessTestCase, skip_if_lt_x_gpu


class NeverStartsProcesses(MultiProcessTestCase):
    @property
    def world_size(self):
        return 8

    @skip_if_lt_x_gpu(8)
    def test_guarded_by_a_gpu_count(self):
        if torch.cuda.device_count() < 8:
            raise AssertionError("the body ran without 8 GPUs")

    def test_body_that_would_fail(self):
        raise AssertionError("the body ran")


if __name__ == "__main__":
    run_tests()
