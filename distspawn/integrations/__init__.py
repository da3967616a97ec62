"""distspawn around the test: the pytest plugin, world-size variants, the ``python -m distspawn`` matrix runner."""

from .. import _stand_in_if_requested

# DISTSPAWN_STAND_IN=1: upstream's modules take distspawn's names before this
# subpackage loads (the first of them to load does it; see the package's __init__).
_stand_in_if_requested()
