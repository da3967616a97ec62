"""Pretend this pytest moved the private unittest items distspawn extends."""

import distspawn.integrations.pytest_plugin

distspawn.integrations.pytest_plugin._PRIVATE_PYTEST_PROBLEM = (
    "ImportError: cannot import name 'UnitTestCase' from '_pytest.unittest' (simulated)")
