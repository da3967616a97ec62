"""skip_names_by_release.py with distspawn's imports: both spellings skip.

distspawn's TEST_SKIPS has both spellings of "needs N devices", so a file
written for either release runs with its imports; in a stand-in run beside
skip_names_by_release.py, that file sees the installed release's table and
this one distspawn's whole. ``SKIP_NAMES`` gives the two, installed one first.
"""

import os
import sys

from distspawn import TEST_SKIPS, MultiProcessTestCase, run_tests

INSTALLED_NAME, OTHER_NAME = os.environ["SKIP_NAMES"].split(",")


class SkipsByNameWithDistspawn(MultiProcessTestCase):
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
