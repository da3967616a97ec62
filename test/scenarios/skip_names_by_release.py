"""Rank tests written for upstream's harness that skip by a TEST_SKIPS name.

torch 2.14 renamed "needs N GPUs" from ``multi-gpu-N`` to ``multi-device-N``.
One test looks up the installed release's spelling (its ranks skip), the other
the other release's (upstream's table lacks it: each rank fails with a
KeyError). ``SKIP_NAMES`` gives the two, installed one first.
"""

import os
import sys

from torch.testing._internal.common_distributed import MultiProcessTestCase, TEST_SKIPS
from torch.testing._internal.common_utils import run_tests

INSTALLED_NAME, OTHER_NAME = os.environ["SKIP_NAMES"].split(",")


class SkipsByName(MultiProcessTestCase):
    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def test_installed_releases_name(self):
        sys.exit(TEST_SKIPS[INSTALLED_NAME].exit_code)

    def test_other_releases_name(self):
        sys.exit(TEST_SKIPS[OTHER_NAME].exit_code)


if __name__ == "__main__":
    run_tests()
