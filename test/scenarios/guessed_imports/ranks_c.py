"""A test file whose only rank class (distspawn's MultiProcessTestCase) is
ranks_b's: pytest collects it here, and ranks need ranks_b alone. The server's
guess names this module, wrongly (test_warm_ranks)."""

import multiprocessing
import os
import time

from guessed_imports.ranks_b import GuessedB  # noqa: F401 - collected here

with open(os.environ["GUESS_IMPORT_LOG"], "a") as log:
    log.write(f"{__name__} began {multiprocessing.current_process().name!r} {time.time():.3f}\n")
