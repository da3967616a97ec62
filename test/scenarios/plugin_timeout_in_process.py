"""A test that hangs in the test process itself, with distspawn imported.

Run by test_pytest_plugin under pytest-timeout's thread method: no rank runs,
so the plugin's report is all there is.
"""

import threading

from distspawn import TestCase


class HangsWithoutRanks(TestCase):
    def test_hangs_in_the_test_process(self):
        threading.Event().wait(300)  # nothing sets it: the plugin's timer ends the run
