"""Ranks that leave a temporary folder to the interpreter's exit.

tempfile.TemporaryDirectory removes its folder when the object is freed or,
failing that, when the interpreter exits normally. Each test keeps one alive
in a module global, as torch 2.8's torch.distributed.nn does at import: a
spawned rank removes it on its way out, and a forked one (which leaves
through os._exit) must too. EXIT_CLEANUPS_TIER picks fresh processes or
reused workers; DISTSPAWN_START_METHOD the start method.
"""

import os
import tempfile

from distspawn import run_tests
from two_ranks import TwoRankReusedTestCase, TwoRankTestCase

KEPT = []


class Rows:
    def test_a_folder_left_to_the_exit(self):
        folder = tempfile.TemporaryDirectory(prefix="left-to-exit-")
        KEPT.append(folder)
        with open(os.path.join(folder.name, "made-by-rank"), "w") as f:
            f.write(str(self.rank))


if os.environ.get("EXIT_CLEANUPS_TIER") == "reused":
    class ExitCleanups(Rows, TwoRankReusedTestCase):
        start_method = os.environ.get("DISTSPAWN_START_METHOD", "fork")
else:
    class ExitCleanups(Rows, TwoRankTestCase):
        pass


if __name__ == "__main__":
    run_tests()
