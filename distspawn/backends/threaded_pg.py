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
import inspect
import sys
import threading
from typing import Any, Callable

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
    active_session,
    set_active_session,
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
    if not missing:
        try:
            _per_thread_world_class()
        except WorldShapeChanged as exc:
            missing.append(f"torch.distributed.distributed_c10d._World as built with no "
                           f"arguments ({exc.__cause__!r})")
    return missing


# -- per-thread c10d state -------------------------------------------------------
#
# c10d keeps its state in one ``_World`` (``distributed_c10d._world``): fields
# its ``__init__`` sets (the default group, coalescing state, flight-recorder
# hooks in newer releases, ...) and properties over module globals
# (``pg_map`` is the global ``_pg_map``, ...). Each rank thread needs its own of
# all of it. The split is read from torch's own class, not listed by hand (a
# list goes stale with each release, and a field torch adds then exists in no
# rank thread):
# - every field a new ``_World()`` sets is kept per thread, each thread
#   starting from a new world's values;
# - every property whose value two new worlds share (a module global) is
#   replaced by a per-thread one, starting from an empty value of its type.

class WorldShapeChanged(RuntimeError):
    """torch's ``_World`` no longer has the shape the per-thread world is built from."""


def _empty_like(value: Any) -> Callable[[], Any]:
    if value is None:
        return lambda: None
    kind = type(value)
    return kind  # dict(), list(), set(), int() -> 0, ...


def _shared_properties(base: type) -> dict[str, Callable[[], Any]]:
    """The properties of ``base`` backed by state every instance shares, with a
    maker of each one's starting value."""
    first, second = base(), base()
    shared = {}
    for name in dir(base):
        prop = inspect.getattr_static(base, name, None)
        if not isinstance(prop, property) or prop.fget is None:
            continue
        try:
            value = getattr(first, name)
        except Exception:  # noqa: BLE001 - a property that needs more state: derived
            continue
        if prop.fset is not None:
            probe = object()
            setattr(first, name, probe)
            try:
                is_shared = getattr(second, name) is probe
            finally:
                setattr(first, name, value)
        else:
            is_shared = value is getattr(second, name) and isinstance(
                value, (dict, list, set))
        if is_shared:
            shared[name] = _empty_like(value)
    return shared


@functools.lru_cache(maxsize=None)
def _per_thread_world_class():
    """A ``_World`` whose state is separate in every thread (built on first use)."""
    base = dist.distributed_c10d._World
    try:
        fields = set(vars(base()))
        shared = _shared_properties(base)
    except Exception as exc:  # noqa: BLE001 - reported by name, never inside a rank
        raise WorldShapeChanged(
            "torch.distributed.distributed_c10d._World no longer builds as the threaded "
            f"backend expects ({type(exc).__name__}: {exc}); threaded tests cannot run "
            f"on torch {torch.__version__}") from exc

    class ThreadState(threading.local):
        def __init__(self) -> None:
            # A new world's fields, for this thread (runs once in each thread).
            self.__dict__.update(vars(base()))
            for name, make in shared.items():
                self.__dict__[name] = make()

    def state_property(name: str) -> property:
        def get(self):
            return self._distspawn_state.__dict__[name]

        def set_(self, value):
            self._distspawn_state.__dict__[name] = value

        return property(get, set_)

    def __init__(self):  # noqa: N807
        object.__setattr__(self, "_distspawn_state", ThreadState())

    def __getattr__(self, name):  # noqa: N807 - a field set after __init__ only
        state = object.__getattribute__(self, "_distspawn_state").__dict__
        try:
            return state[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name, value):  # noqa: N807
        if isinstance(inspect.getattr_static(type(self), name, None), property):
            object.__setattr__(self, name, value)  # its setter sets a field, below
        else:
            self._distspawn_state.__dict__[name] = value

    # A property each, so that reading one takes no detour (rank threads read
    # them on every collective).
    namespace = {name: state_property(name) for name in fields | set(shared)}
    namespace.update(__init__=__init__, __getattr__=__getattr__, __setattr__=__setattr__)
    namespace["_get_world"] = lambda self: self  # upstream's accessor for the state
    namespace["__doc__"] = "c10d's world state, kept separately for each rank thread."
    namespace["per_thread_fields"] = frozenset(fields)
    namespace["per_thread_properties"] = frozenset(shared)
    return type("PerThreadWorld", (base,), namespace)


# -- sessions ------------------------------------------------------------------------

_session_lock = threading.Lock()
_saved_world: Any = None
_autograd_threads: Any = None
_saved_excepthook: Any = None


def _create_threaded_pg(options, _backend_options=None) -> ThreadedProcessGroup:
    session = active_session()
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


@functools.lru_cache(maxsize=None)
def _settle_the_cuda_device_guard() -> None:
    """Install torch's no-op CUDA device guard now, where a compile would later.

    torch.compile's fake tensors install it on first use in a CUDA build with no
    device. Done by one rank thread while another runs tensor ops, that swap
    crashed torch 2.10 (SIGSEGV); done once here, before any rank thread starts,
    it leaves the compile nothing to swap.

    The no-op guard reports one device. autograd's engine counts devices once,
    at the process's first backward, and where it finds one it starts a device
    thread and refuses every later fork-based child that runs autograd. So a
    throwaway backward runs first: the engine counts the real devices (none),
    and a test after this one can still fork after autograd, as it can on
    upstream's harness when nothing compiled.
    """
    ensure = getattr(torch._C, "_ensureCUDADeviceGuardSet", None)  # private: listed
    if ensure is not None and torch.backends.cuda.is_built() and torch.cuda.device_count() == 0:
        torch.ones(1, requires_grad=True).sum().backward()
        ensure()


def install(session: ThreadedSession) -> None:
    """Give every thread its own c10d world and make ``session`` the active one."""
    global _saved_world, _autograd_threads, _saved_excepthook
    missing = missing_threaded_hooks()
    if missing:
        raise RuntimeError("the threaded backend needs private torch hooks this torch "
                           f"({torch.__version__}) lacks: {', '.join(missing)}")
    _settle_the_cuda_device_guard()
    with _session_lock:
        if active_session() is not None:
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
        set_active_session(session)


def uninstall(session: ThreadedSession) -> None:
    """Undo :func:`install`; later ops of stray rank threads raise PeerFailed."""
    global _saved_world, _autograd_threads, _saved_excepthook
    session.stop("the test ended")
    with _session_lock:
        if active_session() is not session:
            return
        dist.distributed_c10d._world = _saved_world
        torch._C._distributed_c10d._set_thread_isolation_mode(False)
        if _autograd_threads is not None:
            _autograd_threads.__exit__(None, None, None)
        sys.excepthook = _saved_excepthook
        set_active_session(None)
        _saved_world = _autograd_threads = _saved_excepthook = None


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
