"""Ranks see a registering project exactly as if they imported it themselves.

REGISTERING_IMPORTS=upstream imports upstream's harness (run it plainly, or
with --distspawn-stand-in); otherwise distspawn's.
"""

import multiprocessing
import os

import torch

import registering_project

if os.environ.get("REGISTERING_IMPORTS") == "upstream":
    from torch.testing._internal.common_distributed import MultiProcessTestCase
else:
    from distspawn import MultiProcessTestCase

# As autoparallel's tests do: a module that checks, at import, whether it runs
# in the test process or in a rank (a spawned rank imports it afresh).
IMPORTED_AS_THE_TEST_PROCESS = multiprocessing.current_process().name == "MainProcess"


class Registered(MultiProcessTestCase):
    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def test_the_op_works(self):
        assert not IMPORTED_AS_THE_TEST_PROCESS
        assert torch.ops.registering_project.double(torch.ones(2)).tolist() == [2.0, 2.0]


class RegisteredWithFlavour(MultiProcessTestCase):
    @property
    def world_size(self):
        return 2

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        os.environ["REGISTERING_FLAVOUR"] = "set by setUpClass"

    @classmethod
    def tearDownClass(cls):
        os.environ.pop("REGISTERING_FLAVOUR", None)
        super().tearDownClass()

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def test_the_project_saw_the_environment_this_rank_has(self):
        # A rank that imported the project itself saw the variable its class
        # set; and whatever the project read, this rank's environment agrees.
        assert registering_project.FLAVOUR_AT_IMPORT == "set by setUpClass"
        assert registering_project.DRIFT_AT_IMPORT == os.environ.get("REGISTERING_DRIFT")
        assert torch.ops.registering_project.double(torch.ones(1)).item() == 2.0
