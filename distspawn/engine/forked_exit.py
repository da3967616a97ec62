"""The at-exit clean-ups a forked rank would otherwise skip.

multiprocessing ends a ``fork`` or ``forkserver`` child through ``os._exit``,
so the clean-ups Python runs at a normal exit never run there. Among them are
``weakref.finalize`` callbacks marked for exit, which is how
``tempfile.TemporaryDirectory`` removes its folder: a temporary folder made
in a forked rank and left to the exit (torch 2.8 makes one as
``torch.distributed.nn`` is imported, which torch.compile does) would outlive
the test, where a spawned rank (upstream's) removes it.

A forked rank notes the callbacks it inherited when it starts (they belong to
its parent, whose folders they remove) and, before it leaves, runs those it
made itself. The registry is private to ``weakref`` (listed in
``distspawn.private_apis``); without it nothing is run, as before.
"""

from __future__ import annotations

import atexit
import weakref
from typing import Any

_inherited: set[Any] | None = None
# Where at-exit callbacks only undo what lives in the process itself, and so
# ends with it: torch.library removes each operator it defined from torch's
# dispatcher (hundreds once torch is imported: about 50 ms at an exit).
IN_PROCESS_ONLY = ("torch.library",)


def _registry() -> dict | None:
    registry = getattr(weakref.finalize, "_registry", None)  # private: listed
    return registry if isinstance(registry, dict) else None


def note_inherited() -> None:
    """The rank starts: every at-exit callback alive now is its parent's."""
    global _inherited
    registry = _registry()
    _inherited = None if registry is None else set(registry)


def inherited() -> set[Any]:
    """The at-exit callbacks noted as the parent's (none where none were noted)."""
    return set(_inherited or ())


def run_own() -> None:
    """The rank is about to leave through ``os._exit``: run the at-exit
    callbacks it made, as a normal exit would (newest first, like Python).
    Does nothing in a rank that did not :func:`note_inherited` (not forked)."""
    if _inherited is not None:
        run_exit_finalizers(_inherited)


def run_exit_finalizers(skip: set[Any] = frozenset()) -> None:
    """Run the at-exit callbacks alive now, but those in ``skip``, newest first,
    as a normal exit would; for a process about to leave through ``os._exit``."""
    registry = _registry()
    if registry is None:
        return
    own = [f for f in list(registry) if f not in skip and f.atexit and not _in_process_only(f)]
    for finalizer in reversed(own):
        try:
            finalizer()
        except Exception:  # noqa: BLE001 - one failing clean-up must not stop the rest
            pass


def skip_in_process_cleanups_at_exit() -> None:
    """At this process's normal exit, leave out the callbacks that only undo
    in-process state (:data:`IN_PROCESS_ONLY`). For the rank server: what
    reads the test process's output waits for the server to end too."""
    atexit.register(_leave_in_process_cleanups)


def _leave_in_process_cleanups() -> None:
    # Registered after weakref's own at-exit step (torch's import made the
    # first callback), so it runs before it.
    registry = _registry()
    for finalizer in list(registry or ()):
        if finalizer.atexit and _in_process_only(finalizer):
            finalizer.atexit = False


def _in_process_only(finalizer: Any) -> bool:
    alive = finalizer.peek()
    return alive is not None and getattr(alive[1], "__module__", None) in IN_PROCESS_ONLY
