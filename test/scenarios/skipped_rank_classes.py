"""Multi-process classes whose every test is skipped before it runs (unittest's
and pytest's skip decorators): the rank server preloads nothing of this file,
so a run of it pays no module import in the background, and the server the
file's text made pytest start early is ended once collection shows no test
starts ranks. With ``RUNNABLE_TOO=1`` one class has a test that runs, and
the file is preloaded.
"""

import os
import sys
import unittest

import pytest

from child_processes import forkservers_of
from distspawn import MultiProcessTestCase, TestCase

RUNNABLE_TOO = os.environ.get("RUNNABLE_TOO") == "1"


class SkippedByUnittest(MultiProcessTestCase):
    @unittest.skipIf(True, "needs an accelerator")
    def test_needs_an_accelerator(self):
        raise AssertionError("ran")

    @unittest.skip("never here")
    def test_never_here(self):
        raise AssertionError("ran")


@unittest.skip("the whole class")
class SkippedClass(MultiProcessTestCase):
    def test_in_a_skipped_class(self):
        raise AssertionError("ran")


class SkippedByPytest(MultiProcessTestCase):
    @pytest.mark.skip(reason="never here")
    def test_marked_skip(self):
        raise AssertionError("ran")

    @pytest.mark.skipif(sys.platform.startswith("linux"), reason="on Linux")
    def test_marked_skipif(self):
        raise AssertionError("ran")


if RUNNABLE_TOO:
    class Runs(MultiProcessTestCase):
        world_size = 2

        def setUp(self):
            super().setUp()
            self._spawn_processes()

        def test_runs(self):
            pass


class PreloadCheck(TestCase):
    def test_the_rank_server_was_asked_for_this_file_only_if_a_test_can_run(self):
        from distspawn.engine import rank_server

        self.assertEqual(__name__ in rank_server._wanted, RUNNABLE_TOO)

    def test_the_rank_server_runs_only_if_a_test_can_start_ranks(self):
        self.assertEqual(len(forkservers_of(os.getpid())), int(RUNNABLE_TOO))
