"""A file that moves the deadline by rebinding the harness module's name.

Files written for upstream's harness do ``common_distributed.TIMEOUT_DEFAULT =
600`` (at import, or before ``run_tests()``), and upstream's ``get_timeout``
reads the module's name at each test. distspawn read only its own, so such a
file kept the 300 s default: a slow test that passes on upstream's harness
timed out. Here the environment's default is 2 s (DISTRIBUTED_TESTS_DEFAULT_TIMEOUT),
the file raises it to 60 s, and a rank that takes 4 s passes; a class whose
test names a deadline of 3 s in TIMEOUT_OVERRIDE and a rank that waits for 60 s fails.

UPSTREAM_HARNESS=1 imports upstream's harness (also what the stand-in mode runs).
"""

import os
import threading
import time

if os.environ.get("UPSTREAM_HARNESS") == "1":
    from torch.testing._internal import common_distributed
    from torch.testing._internal.common_utils import run_tests
else:
    from distspawn import compat as common_distributed
    from distspawn import run_tests

common_distributed.TIMEOUT_DEFAULT = 60
common_distributed.TIMEOUT_OVERRIDE["test_rank_0_outlives_its_deadline"] = 3


class Deadlines(common_distributed.MultiProcessTestCase):
    world_size = 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def test_rank_0_takes_longer_than_the_old_default(self):
        if self.rank == 0:
            time.sleep(4)  # the slow work itself, not a wait for another rank

    def test_rank_0_outlives_its_deadline(self):
        if self.rank == 0:
            threading.Event().wait(60)


if __name__ == "__main__":
    run_tests()
