"""The ``threaded`` backend: a process group whose ranks are threads of one process.

Registered with ``torch.distributed.Backend.register_backend`` under the name
``threaded``; each rank thread calls ``init_process_group("threaded", rank=...,
world_size=..., store=...)`` inside a :class:`ThreadedSession` (which
:class:`~distspawn.MultiThreadedTestCase`, ``spawn_threads_and_init_comms`` and
:func:`threaded_world` set up).

The backend is three modules, one job each: :mod:`.rendezvous` (where the
ranks' calls meet, bounded by deadline, peer failure and deadlock detection),
:mod:`.process_group` (the torch ``ProcessGroup`` adapter) and this one, which
installs the per-thread c10d world and the active session, and is the name
everything else imports.
"""

from __future__ import annotations

import functools
import sys
import threading
from typing import Any

import torch
import torch.distributed as dist

from .process_group import ThreadedProcessGroup
from .rendezvous import (
    BACKEND_NAME,
    CollectiveDeadlockError,
    CollectiveMismatchError,
    CollectiveTimeoutError,
    DeadlineReached,
    PeerFailed,
    ThreadedBackendError,
    ThreadedSession,
    ThreadedWork,
    _GroupInfo,
)


__all__ = [
    "CollectiveDeadlockError",
    "CollectiveMismatchError",
    "CollectiveTimeoutError",
    "DeadlineReached",
    "PeerFailed",
    "ThreadedBackendError",
    "ThreadedProcessGroup",
    "ThreadedSession",
    "ThreadedWork",
    "active_session",
    "missing_threaded_hooks",
    "register_threaded_backend",
    "threaded_world",
]




# -- the private hooks we depend on ---------------------------------------------

def missing_threaded_hooks() -> list[str]:
    """Private torch hooks the threaded world needs that this torch lacks."""
    missing = []
    c10d = dist.distributed_c10d if dist.is_available() else None
    if c10d is None:
        return ["torch.distributed (this torch was built without distributed support)"]
    for name in ("_World", "_world"):
        if not hasattr(c10d, name):
            missing.append(f"torch.distributed.distributed_c10d.{name}")
    if not hasattr(torch._C._distributed_c10d, "_set_thread_isolation_mode"):
        missing.append("torch._C._distributed_c10d._set_thread_isolation_mode")
    return missing


# -- per-thread c10d state -------------------------------------------------------

_WORLD_FIELDS: dict[str, Any] = {
    "default_pg": lambda: None,
    "pg_map": dict,
    "pg_names": dict,
    "pg_group_ranks": dict,
    "pg_backend_config": dict,
    "group_count": lambda: 0,
    "tags_to_pg": dict,
    "pg_to_tag": dict,
    "pg_coalesce_state": dict,
    "comms": list,
}


@functools.lru_cache(maxsize=None)
def _per_thread_world_class():
    """A ``_World`` whose state is separate in every thread (built on first use)."""
    base = dist.distributed_c10d._World

    def field_property(name, make):
        def get(self):
            state = self._local.__dict__
            if name not in state:
                state[name] = make()
            return state[name]

        def set_(self, value):
            self._local.__dict__[name] = value

        return property(get, set_)

    namespace = {name: field_property(name, make) for name, make in _WORLD_FIELDS.items()}

    def __init__(self):  # noqa: N807
        self._local = threading.local()

    namespace["__init__"] = __init__
    namespace["_get_world"] = lambda self: self  # upstream's accessor for the state
    namespace["__doc__"] = "c10d's world state, kept separately for each rank thread."
    return type("PerThreadWorld", (base,), namespace)


# -- sessions ------------------------------------------------------------------------

_session_lock = threading.Lock()
_active: ThreadedSession | None = None
_saved_world: Any = None
_autograd_threads: Any = None
_saved_excepthook: Any = None


def active_session() -> ThreadedSession | None:
    """The threaded session now installed in this process, if any."""
    return _active


def _create_threaded_pg(options, _backend_options=None) -> ThreadedProcessGroup:
    session = _active
    if session is None:
        raise RuntimeError(
            "the 'threaded' backend runs its ranks as threads of one process and needs a "
            "per-thread world: use MultiThreadedTestCase, @spawn_threads_and_init_comms, "
            "or init each rank thread inside `with distspawn.threaded_world(world_size):`")
    ranks = tuple(options.global_ranks_in_group or range(options.group_size))
    group = _GroupInfo(str(options.group_id), ranks)
    return ThreadedProcessGroup(session, group, options.group_rank)


def register_threaded_backend() -> None:
    """Register (or re-register over another) the ``threaded`` backend with c10d."""
    plugin = getattr(dist.Backend, "_plugins", {}).get(BACKEND_NAME.upper())
    if plugin is not None and plugin.creator_fn is _create_threaded_pg:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create_threaded_pg, extended_api=True,
                                  devices=["cpu", "cuda"])


def install(session: ThreadedSession) -> None:
    """Give every thread its own c10d world and make ``session`` the active one."""
    global _active, _saved_world, _autograd_threads, _saved_excepthook
    missing = missing_threaded_hooks()
    if missing:
        raise RuntimeError("the threaded backend needs private torch hooks this torch "
                           f"({torch.__version__}) lacks: {', '.join(missing)}")
    with _session_lock:
        if _active is not None:
            raise RuntimeError("a threaded world is already running in this process; "
                               "threaded tests cannot nest or run concurrently")
        register_threaded_backend()
        c10d = dist.distributed_c10d
        _saved_world = c10d._world
        c10d._world = _per_thread_world_class()()
        torch._C._distributed_c10d._set_thread_isolation_mode(True)
        # Autograd's device threads would not see the rank thread's world.
        _autograd_threads = torch.autograd.set_multithreading_enabled(False)
        # Each init_process_group wraps sys.excepthook and nothing unwraps it:
        # thousands of threaded inits would nest it past the recursion limit.
        _saved_excepthook = sys.excepthook
        _active = session


def uninstall(session: ThreadedSession) -> None:
    """Undo :func:`install`; later ops of stray rank threads raise PeerFailed."""
    global _active, _saved_world, _autograd_threads, _saved_excepthook
    session.stop("the test ended")
    with _session_lock:
        if _active is not session:
            return
        dist.distributed_c10d._world = _saved_world
        torch._C._distributed_c10d._set_thread_isolation_mode(False)
        if _autograd_threads is not None:
            _autograd_threads.__exit__(None, None, None)
        sys.excepthook = _saved_excepthook
        _active = _saved_world = _autograd_threads = _saved_excepthook = None


class threaded_world:  # noqa: N801 - used as a context manager, like torch's
    """Context manager: a threaded world for ``world_size`` rank threads.

    Inside it, each rank thread may call ``init_process_group("threaded",
    rank=r, world_size=world_size, store=store)`` with one shared store; every
    wait ends by ``timeout`` seconds.
    """

    def __init__(self, world_size: int, timeout: float | None = None) -> None:
        self.session = ThreadedSession(world_size, timeout)

    def __enter__(self) -> ThreadedSession:
        install(self.session)
        return self.session

    def __exit__(self, *exc_info) -> None:
        uninstall(self.session)
