"""The names of upstream's ``distributed/multi_threaded_pg.py``, over distspawn's backend.

For test code that reaches into upstream's threaded module directly::

    from distspawn.multi_threaded_pg import (
        ProcessLocalGroup, ThreadLocalWorld, _install_threaded_pg, _uninstall_threaded_pg)

Prefer :class:`~distspawn.MultiThreadedTestCase`, ``spawn_threads_and_init_comms``
or :func:`~distspawn.threaded_world`, which also bound every wait by a deadline.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from .backends import threaded_pg
from .backends.threaded_pg import ThreadedProcessGroup, ThreadedSession

__all__ = ["ProcessLocalGroup", "ThreadLocalWorld", "_install_threaded_pg",
           "_uninstall_threaded_pg"]


# Upstream's name for the group class; exception_handle / reset are on it too.
ProcessLocalGroup = ThreadedProcessGroup


def __getattr__(name: str) -> Any:
    if name == "ThreadLocalWorld":
        return threaded_pg._per_thread_world_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _install_threaded_pg() -> Any:
    """Give each thread its own c10d world (no deadline: that needs a test harness)."""
    threaded_pg.install(ThreadedSession(None, None))
    return dist.distributed_c10d._world


def _uninstall_threaded_pg() -> None:
    session = threaded_pg.active_session()
    if session is not None:
        threaded_pg.uninstall(session)
