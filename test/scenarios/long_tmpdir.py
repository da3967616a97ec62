"""A TMPDIR too long for the rank server's Unix socket (set before any rank starts).

LONG_TMPDIR_UNDER names where to make it (the test's own temp dir, so that the
test sees anything left behind).
"""

import os
import tempfile

from distspawn import MultiProcessTestCase, run_tests

_long = os.path.join(os.environ["LONG_TMPDIR_UNDER"], "a-directory-name-long-enough-" * 3)
os.makedirs(_long, exist_ok=True)
os.environ["TMPDIR"] = tempfile.tempdir = _long


class LongTmpdir(MultiProcessTestCase):
    world_size = 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def test_x(self):
        pass


if __name__ == "__main__":
    run_tests()
