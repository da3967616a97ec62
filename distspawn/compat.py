"""The shape of upstream's ``common_distributed`` module, for one-line migrations::

    from distspawn.compat import *            # instead of ...common_distributed import *
    import distspawn.compat as common_distributed

Every name upstream's module defines is importable here, including its private
helpers that test files use (``_dynamo_dist_per_rank_init``, ...).
"""

import logging

from . import *  # noqa: F401,F403 - the point of this module is re-export
from . import __all__ as _public
from .fixtures import helpers as _helpers
from .fixtures import tempdirs as _tempdirs
from .cases.distributed_base import _dynamo_dist_per_rank_init  # noqa: F401
from .fixtures.environment import DEVICE_FLAGS, IS_LINUX, device_flag  # noqa: F401
from .fixtures.helpers import core_dumps_disabled  # noqa: F401
from .fixtures.skips import _maybe_handle_skip_if_lt_x_gpu  # noqa: F401
from .fixtures.skips import _rocm_version as _rocm_version_tuple  # noqa: F401
# Upstream's module imports these from its threaded group (files reach them through it).
from .multi_threaded_pg import ProcessLocalGroup, _install_threaded_pg, _uninstall_threaded_pg  # noqa: F401

logger = logging.getLogger("distspawn")

_EXTRA = ["IS_LINUX", "logger", "tmp_dir", "_dynamo_dist_per_rank_init",
          "_maybe_handle_skip_if_lt_x_gpu", "core_dumps_disabled", "_rocm_version_tuple",
          "EFA_PROBE_RESULT", "ProcessLocalGroup", "_install_threaded_pg",
          "_uninstall_threaded_pg", *DEVICE_FLAGS]
__all__ = list(_public) + _EXTRA


def __getattr__(name: str):
    # These change as tests run; read them live rather than copy them at import.
    if name == "tmp_dir":
        return _tempdirs.tmp_dir
    # has_efa() fills this in when it first probes (2.8's files read it).
    if name == "EFA_PROBE_RESULT":
        return _helpers.EFA_PROBE_RESULT
    # Upstream's module imports common_utils' device flags (so files import them from it).
    return device_flag(__name__, name)
