"""A plain pytest file: the distspawn plugin must not import torch for it.

Its text names distspawn and MultiProcessTestCase, here and nowhere else, so
the plugin's guess starts the rank server early; once collection shows no
distspawn test, that server must have ended before any test runs.
"""

import os
import sys

from child_processes import forkservers_of


def test_torch_not_imported():
    assert "torch" not in sys.modules, "the distspawn pytest plugin imported torch"


def test_the_server_started_on_a_guess_has_ended():
    assert forkservers_of(os.getpid()) == []
