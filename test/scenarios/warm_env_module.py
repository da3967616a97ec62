"""Run under pytest: a module that reads, at import, a variable its test class
sets later gets imported with the value the test set, as on upstream's harness."""

import os

from distspawn import MultiProcessTestCase

MODE_AT_IMPORT = os.environ.get("WARM_MODE")


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
        self._spawn_processes()

    def test_module_saw_the_tests_environment(self):
        assert MODE_AT_IMPORT == "set by setUpClass", MODE_AT_IMPORT
