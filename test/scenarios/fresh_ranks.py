"""Every rank of every test is a process that ran no other test.

Each rank claims its pid in FRESH_DIR; a pid claimed twice means a process ran
two tests.
"""

import os

from distspawn import MultiProcessTestCase, run_tests


class FreshRanks(MultiProcessTestCase):
    world_size = 3

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def _claim_this_process(self):
        claim = os.path.join(os.environ["FRESH_DIR"], str(os.getpid()))
        fd = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY)  # fails if claimed
        os.close(fd)


for index in range(8):
    setattr(FreshRanks, f"test_{index}", FreshRanks._claim_this_process)


if __name__ == "__main__":
    run_tests()
