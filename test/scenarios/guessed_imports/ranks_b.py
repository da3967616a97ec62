"""A guessed test module (test_warm_ranks); its import is logged as ranks_a's."""

import multiprocessing
import os
import sys
import time

from distspawn import MultiProcessTestCase

LATE_VAR_AT_IMPORT = os.environ.get("GUESS_LATE_VAR")
with open(os.environ["GUESS_IMPORT_LOG"], "a") as log:
    log.write(f"{__name__} began {multiprocessing.current_process().name!r} {time.time():.3f}\n")


class GuessedB(MultiProcessTestCase):
    world_size = 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def test_ranks_see_what_their_own_import_would(self):
        if os.environ.get("GUESS_FOLDER_MADE_AT_START") == "1":
            # The rank server's own (made_at_start/sitecustomize.py): what
            # served ranks_a's ranks did not remove it as it ended.
            folder = sys.modules["sitecustomize"].FOLDER.name
            assert os.path.isdir(folder), folder
        assert LATE_VAR_AT_IMPORT == os.environ.get("GUESS_LATE_VAR"), LATE_VAR_AT_IMPORT
        # A rank imports this module alone: not ranks_c.py, which collects
        # this class, nor ranks_a.py, whose tests -k deselected.
        others = [name for name in sys.modules
                  if name.startswith("guessed_imports.ranks_") and name != __name__]
        assert others == [], others
