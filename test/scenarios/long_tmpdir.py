"""A TMPDIR too long for a Unix socket below it (set before any rank starts).

LONG_TMPDIR_UNDER names where to make it (the test's own temp dir, so that the
test sees anything left behind). UPSTREAM_HARNESS=1 imports upstream's harness
(also what the stand-in mode runs). MP_FOLDER_FIRST=1 has multiprocessing make
its temp folder under that TMPDIR before any rank starts. Run as a script, it
prints at exit where multiprocessing's folder was, for the test to see it removed.
"""

import atexit
import multiprocessing.util
import os
import tempfile

if os.environ.get("UPSTREAM_HARNESS") == "1":
    from torch.testing._internal.common_distributed import MultiProcessTestCase
    from torch.testing._internal.common_utils import run_tests
else:
    from distspawn import MultiProcessTestCase, run_tests

_long = os.path.join(os.environ["LONG_TMPDIR_UNDER"], "a-directory-name-long-enough-" * 3)
os.makedirs(_long, exist_ok=True)
os.environ["TMPDIR"] = tempfile.tempdir = _long
if os.environ.get("MP_FOLDER_FIRST") == "1":
    multiprocessing.util.get_temp_dir()


class LongTmpdir(MultiProcessTestCase):
    world_size = 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def test_x(self):
        pass


if __name__ == "__main__":
    # Registered after multiprocessing's own exit clean-up, so it runs before it.
    atexit.register(lambda: print("MULTIPROCESSING FOLDER", multiprocessing.util.get_temp_dir()))
    run_tests()
