"""For test_warm_ranks: the environment (GUESS_SET_AFTER_COLLECTION=1) or
sys.path (GUESS_INSERT_AFTER_COLLECTION=<folder>) changes after the rank
server was sent its guess of the test modules; or the environment changes as
ranks_b's tests begin (GUESS_SET_FOR_RANKS_B=1), after the server was told
that module's tests come next."""

import os
import sys
import time

# Where ranks_a imports guess_shadowed from, unless a folder inserted later
# holds one too.
sys.path.append(os.path.join(os.path.dirname(os.path.dirname(__file__)), "guess_lib"))


def pytest_collection_modifyitems(config, items):
    folder = os.environ.get("GUESS_INSERT_AFTER_COLLECTION")
    if os.environ.get("GUESS_SET_AFTER_COLLECTION") != "1" and not folder:
        return
    # Waits for the guess to have gone, so that it has neither change.
    plugin = sys.modules["distspawn.early.plugin"]
    deadline = time.monotonic() + 120
    while not plugin._guess_state["sent"] and time.monotonic() < deadline:
        time.sleep(0.05)
    if folder:  # after the test folder pytest put first (it would put it back)
        sys.path.insert(1, folder)
    else:
        os.environ["GUESS_LATE_VAR"] = "late"


def pytest_runtest_setup(item):
    if os.environ.get("GUESS_SET_FOR_RANKS_B") == "1" and item.module.__name__.endswith("ranks_b"):
        os.environ["GUESS_LATE_VAR"] = "late"
