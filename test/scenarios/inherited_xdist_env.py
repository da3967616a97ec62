"""Run with PYTEST_XDIST_WORKER set, as a process an xdist worker started inherits it."""

import os
import tempfile


def test_tmpdir_is_the_runs_own():
    # An xdist worker gets a private TMPDIR (distspawn-gw7-...); this run is not one.
    assert os.environ["PYTEST_XDIST_WORKER"] == "gw7"
    assert "distspawn-gw7-" not in tempfile.gettempdir(), tempfile.gettempdir()
