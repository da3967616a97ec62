"""A world-size marker with a value that is not a size: a clear collection error."""

import pytest

from distspawn import MultiThreadedTestCase


class BadMarker(MultiThreadedTestCase):
    @pytest.mark.world_size(2, "four")
    def test_never_runs(self):
        pass
