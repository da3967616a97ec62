"""distspawn around the test: the pytest plugin, world-size variants, the ``python -m distspawn`` matrix runner."""
