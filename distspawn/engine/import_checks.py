"""In the rank server: whether importing a test module left the process fit to fork ranks.

A rank forked from a process inherits what runs in it. A thread, a process, a
socket or an initialised CUDA context that an import started would be copied
into every rank half-alive (a thread is not, a lock it held stays held), where
a rank importing the module itself would have its own. So an import that
starts any of them is refused (``engine.warm_modules``), and ranks import that
module themselves.
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
from typing import Any


def _process_state() -> dict[str, Any]:
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    try:
        sockets = sum(1 for fd in os.listdir("/proc/self/fd")
                      if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"))
        native_threads = len(os.listdir("/proc/self/task"))
    except OSError:  # not Linux: the Python-level checks still hold
        sockets = native_threads = 0
    return {
        "threads": {t.ident: t.name for t in threading.enumerate()},
        "native_threads": native_threads,
        "sockets": sockets,
        "cuda": bool(cuda is not None and cuda.is_initialized()),
        "children": set(_child_pids()),
    }


def _child_pids() -> list[int]:
    try:
        with open(f"/proc/self/task/{os.getpid()}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def import_and_check(name: str) -> str | None:
    """Import ``name``; why the process that imported it may not serve ranks
    (None: it may)."""
    before = _process_state()
    importlib.import_module(name)
    after = _process_state()
    new_threads = [n for i, n in after["threads"].items() if i not in before["threads"]]
    if new_threads:
        return f"importing it started thread(s) {', '.join(sorted(new_threads))}"
    if after["native_threads"] > before["native_threads"]:
        return (f"importing it started {after['native_threads'] - before['native_threads']} "
                "native thread(s)")
    if after["cuda"] and not before["cuda"]:
        return "importing it initialised CUDA"
    if after["sockets"] > before["sockets"]:
        return "importing it opened a socket"
    if after["children"] - before["children"]:
        return "importing it started a process"
    return None
