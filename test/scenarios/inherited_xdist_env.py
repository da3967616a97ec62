"""Run with PYTEST_XDIST_WORKER set, as a process an xdist worker started inherits it."""

import os
import tempfile


def test_tmpdir_is_the_runs_own():
    # An xdist worker gets a private TMPDIR (distspawn-<worker>-...); this run is
    # not one. The name is one no real worker has: the run that starts this file
    # may itself be a worker (gw0, gw1, ...), whose TMPDIR this run inherits.
    assert os.environ["PYTEST_XDIST_WORKER"] == "gw-inherited"
    assert "distspawn-gw-inherited-" not in tempfile.gettempdir(), tempfile.gettempdir()
