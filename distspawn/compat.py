"""The shape of upstream's ``common_distributed`` module, for one-line migrations::

    import distspawn.compat as common_distributed
    from distspawn.compat import MultiProcessTestCase, TEST_SKIPS

Every name upstream exports that distspawn implements is importable here.
"""

from . import *  # noqa: F401,F403 - the point of this module is re-export
from . import __all__ as _public
from .environment import IS_LINUX  # noqa: F401

__all__ = list(_public)
