"""Run under pytest: a module that reads, at import, a variable its test class
sets later gets imported with the value the test set, as on upstream's harness.

The class sets it once (setUpClass): the rank server, which imported the
module during collection, imports it anew with it, and its ranks find it
loaded. With WARM_MODE_PER_TEST=1 each test sets its own value (setUp): the
module is left to the ranks once a second value comes."""

import os

from distspawn import MultiProcessTestCase

MODE_AT_IMPORT = os.environ.get("WARM_MODE")
IMPORTED_IN = os.getpid()
PER_TEST = os.environ.get("WARM_MODE_PER_TEST") == "1"


class WarmEnvModule(MultiProcessTestCase):
    world_size = 2

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        os.environ["WARM_MODE"] = "set by setUpClass"

    @classmethod
    def tearDownClass(cls):
        os.environ.pop("WARM_MODE", None)
        super().tearDownClass()

    def setUp(self):
        super().setUp()
        if PER_TEST:
            os.environ["WARM_MODE"] = self._testMethodName
        self._spawn_processes()

    def _check(self):
        expected = self._testMethodName if PER_TEST else "set by setUpClass"
        assert MODE_AT_IMPORT == expected, MODE_AT_IMPORT
        if not PER_TEST:
            assert IMPORTED_IN != os.getpid(), "the rank imported the module itself"

    def test_module_saw_the_tests_environment(self):
        self._check()

    def test_module_saw_it_in_a_second_test_too(self):
        self._check()
