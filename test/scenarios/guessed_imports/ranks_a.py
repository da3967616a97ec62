"""A test module the rank server imports on a guess, while pytest imports it
too (test_warm_ranks). Each import is logged (GUESS_IMPORT_LOG): the process,
and when it began and ended. With GUESS_WAIT_FOR_SERVER=1 the test process's
import waits until the server's has begun (at most 90 s); with
GUESS_WAIT_FOR_NEXT=1 the test's ranks wait until the server has begun
importing ranks_b, the module whose tests come next (at most 90 s)."""

import importlib.machinery
import multiprocessing
import os
import sys
import time

import guess_shadowed
from distspawn import MultiProcessTestCase

PROCESS = multiprocessing.current_process().name
LATE_VAR_AT_IMPORT = os.environ.get("GUESS_LATE_VAR")


def _log(event):
    with open(os.environ["GUESS_IMPORT_LOG"], "a") as log:
        log.write(f"{__name__} {event} {PROCESS!r} {time.time():.3f}\n")


def _server_began(module=__name__):
    with open(os.environ["GUESS_IMPORT_LOG"]) as log:
        return any(f"{module} began 'distspawn rank server'" in line for line in log)


_log("began")
if os.environ.get("GUESS_WAIT_FOR_SERVER") == "1" and PROCESS == "MainProcess":
    deadline = time.monotonic() + 90
    while not _server_began() and time.monotonic() < deadline:
        time.sleep(0.05)
_log("ended")


class GuessedA(MultiProcessTestCase):
    world_size = 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def test_ranks_see_what_their_own_import_would(self):
        if os.environ.get("GUESS_WAIT_FOR_NEXT") == "1":
            deadline = time.monotonic() + 90
            while not _server_began("guessed_imports.ranks_b") and time.monotonic() < deadline:
                time.sleep(0.05)
            assert _server_began("guessed_imports.ranks_b"), "ranks_b is not being imported"
        # As in a rank that imported this module itself, with its environment.
        assert LATE_VAR_AT_IMPORT == os.environ.get("GUESS_LATE_VAR"), LATE_VAR_AT_IMPORT
        found = importlib.machinery.PathFinder.find_spec("guess_shadowed", sys.path)
        assert found.origin == guess_shadowed.__file__, (found.origin, guess_shadowed.__file__)
