"""For test_warm_ranks: the environment changes after the rank server was sent
its guess of the test modules (GUESS_SET_AFTER_COLLECTION=1)."""

import os
import sys
import time


def pytest_collection_modifyitems(config, items):
    if os.environ.get("GUESS_SET_AFTER_COLLECTION") != "1":
        return
    # Waits for the guess to have gone, so that its environment lacks the variable.
    plugin = sys.modules["distspawn_pytest"]
    deadline = time.monotonic() + 60
    while not plugin._guess_state["sent"] and time.monotonic() < deadline:
        time.sleep(0.05)
    os.environ["GUESS_LATE_VAR"] = "late"
