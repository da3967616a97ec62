"""How ranks run: start them, watch them, judge them. Imports nothing of unittest or pytest; the test case classes in ``distspawn.cases`` are glue over it."""

from .. import _stand_in_if_requested

# DISTSPAWN_STAND_IN=1: upstream's modules take distspawn's names before this
# subpackage loads (the first of them to load does it; see the package's __init__).
_stand_in_if_requested()
