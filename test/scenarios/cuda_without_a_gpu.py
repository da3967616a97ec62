"""A rank reaches for CUDA on a machine without a GPU (run only there).

On a CUDA build without a driver, torch refuses the call in a forked rank
with advice to use 'spawn', which would give no device either: the failure
must say what is missing.
"""

import torch

from distspawn import run_tests
from two_ranks import TwoRankTestCase


# As upstream's common_utils does at import (TEST_CUDA), and so in the process
# the ranks are forked from.
HAS_CUDA = torch.cuda.is_available()


class CudaWithoutAGpu(TwoRankTestCase):
    def test_a_cuda_call(self):
        torch.ones(1).cuda()


if __name__ == "__main__":
    run_tests()
