"""Rank side: the store call the main thread is blocked in, if any.

A rank can hold its peers up outside any collective: waiting in
``store.get(key)`` or ``store.wait([...])`` for a key no one will set while
the others wait for it in a collective. From outside, such a rank looks like
one that is busy, so the stall judge (``engine.stall``) would wait for the
deadline. So each rank wraps the blocking methods of ``torch.distributed.Store``
(every store type inherits them) and notes, while its main thread is inside
one, which method, which keys, since when and until when the store will wait
before raising. The collective log (``engine.collective_log``) writes that
note beside the rank's collectives.

Only calls made from Python are seen; torch's own C++ use of a store (the
rendezvous of a new group) is not, and needs no note: the ranks it waits for
are not in a collective either.
"""

from __future__ import annotations

import functools
import threading
import time
from datetime import timedelta
from typing import Any, Callable

# Store methods that wait for other processes, with the position (after self)
# of the argument that can give their own timeout.
BLOCKING = {"get": None, "wait": 1, "multi_get": None, "queue_pop": None, "barrier": 2}

_current: dict[str, Any] | None = None
_installed = False


def install() -> None:
    """Wrap the blocking methods of ``torch.distributed.Store`` (idempotent)."""
    global _installed
    if _installed:
        return
    _installed = True
    try:
        import torch.distributed as dist
        store_class = dist.Store
    except (ImportError, AttributeError):
        return
    main = threading.main_thread()
    for name, timeout_at in BLOCKING.items():
        original = store_class.__dict__.get(name)
        if callable(original):
            setattr(store_class, name, _noting(original, name, timeout_at, main))


def current() -> dict[str, Any] | None:
    """The main thread's blocking store call: method, keys, since (ns) and
    until (ns; None where the store waits without limit), or None."""
    return _current


def _noting(original: Callable[..., Any], name: str, timeout_at: int | None,
            main: threading.Thread) -> Callable[..., Any]:
    @functools.wraps(original)
    def call(store: Any, *args: Any, **kwargs: Any) -> Any:
        global _current
        if threading.current_thread() is not main or _current is not None:
            return original(store, *args, **kwargs)
        if name == "queue_pop" and not kwargs.get("block", args[1] if len(args) > 1 else True):
            return original(store, *args, **kwargs)
        try:
            _current = _note(store, name, args, kwargs, timeout_at)
        except Exception:  # noqa: BLE001 - diagnosis must never change the store's answer
            return original(store, *args, **kwargs)
        try:
            return original(store, *args, **kwargs)
        finally:
            _current = None

    return call


def _note(store: Any, name: str, args: tuple, kwargs: dict[str, Any],
          timeout_at: int | None) -> dict[str, Any]:
    keys = kwargs.get("keys", kwargs.get("key", args[0] if args else None))
    if isinstance(keys, (str, bytes)) or keys is None:
        keys = [keys]
    timeout = kwargs.get("timeout")
    if timeout is None and timeout_at is not None and len(args) > timeout_at:
        timeout = args[timeout_at]
    if timeout is None:
        try:
            timeout = store.timeout
        except Exception:  # noqa: BLE001 - a store that cannot say is taken to give up at once
            timeout = None
    since = time.time_ns()
    if not isinstance(timeout, timedelta) or timeout < timedelta(0):
        until: int | None = since  # unknown: it may return any moment
    elif timeout == timedelta(0):
        until = None  # c10d's "no timeout": it waits for as long as it takes
    else:
        until = since + int(timeout.total_seconds() * 1e9)
    return {"method": name, "keys": [str(k) for k in list(keys)[:4]], "since_ns": since,
            "until_ns": until}
