"""An upstream-style file whose rank tests all skip by decorator.

Under the stand-in mode, pytest starts the rank server early on the file's
text; once collection shows that no test starts ranks, the server must have
ended: a run that starts no rank pays for none.
"""

import os
import unittest

from child_processes import forkservers_of
from torch.testing._internal.common_distributed import MultiProcessTestCase
from torch.testing._internal.common_utils import TestCase, run_tests


class NeedsEightAccelerators(MultiProcessTestCase):
    @unittest.skip("needs 8 accelerators")
    def test_all_reduce(self):
        raise AssertionError("ran")


class ServerCheck(TestCase):
    def test_no_rank_server_runs(self):
        self.assertEqual(forkservers_of(os.getpid()), [])


if __name__ == "__main__":
    run_tests()
