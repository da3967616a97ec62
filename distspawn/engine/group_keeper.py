"""Keeps a rank's destroyed process groups alive until its test is over.

torch frees a process group on whichever thread drops its last reference. When
that reference belongs to a DDP model's reducer, the group's destructor runs
with the GIL held (the reducer's binding does not release it) and joins gloo's
worker threads; a worker that is just then freeing a finished collective needs
the GIL to drop the Python context that backward stashed in it: both wait
forever. It takes a model that outlives ``destroy_process_group()`` (the usual
order in a test: destroy at the end, locals freed after) and a collective
finishing at that moment, so it shows up as a rare hang, more often the faster
ranks start. (pytorch/pytorch#56297 describes the class of bug.)

Holding a reference to every group ``destroy_process_group`` removes, and
letting go of them only after the test body has returned, moves the last
reference to a Python object, whose release lets go of the GIL first.
"""

from __future__ import annotations

import functools
import weakref
from typing import Any, Callable

_kept: list[Any] = []
_released: list[Callable[[], Any]] = []  # weak references to the groups let go of


def _groups_being_destroyed(c10d: Any, group: Any) -> list[Any]:
    if group is not None:
        return [group]
    world = getattr(c10d, "_world", None)  # private: listed in distspawn.private_apis
    pg_map = getattr(world, "pg_map", None)
    return list(pg_map) if pg_map is not None else []


def keep_destroyed_groups() -> None:
    """In this rank process, make ``destroy_process_group`` keep what it removes."""
    import torch.distributed as dist

    if not dist.is_available():
        return
    c10d = dist.distributed_c10d
    destroy = c10d.destroy_process_group
    if getattr(destroy, "_distspawn_keeps_groups", False):
        return

    @functools.wraps(destroy)
    def destroy_process_group(group: Any = None) -> None:
        try:
            _kept.extend(_groups_being_destroyed(c10d, group))
        except Exception:  # noqa: BLE001 - keeping them is an optimisation of safety only
            pass
        return destroy(group)

    destroy_process_group._distspawn_keeps_groups = True  # type: ignore[attr-defined]
    c10d.destroy_process_group = destroy_process_group
    dist.destroy_process_group = destroy_process_group


def release_kept_groups() -> None:
    """Drop the kept groups (after the test body, when no collective is in flight)."""
    _released[:] = [alive for alive in _released if alive() is not None]
    for group in _kept:
        try:
            _released.append(weakref.ref(group))
        except TypeError:  # a group type without weak references: assume it may live on
            _released.append(lambda: True)
    _kept.clear()


def free_groups_before_shutdown() -> None:
    """In a rank that will shut its interpreter down (a spawned one): free every
    group no longer in use now, while the interpreter is whole.

    Groups can outlive ``destroy_process_group`` in garbage that only a full
    collection frees (after DDP, functions whose defaults captured the default
    group). Left to the collection at interpreter shutdown, the group's
    destructor waits for gloo's worker thread, which, freeing a finished
    collective, asks for the GIL, is ended by the shutdown instead while it
    holds the group's lock, and aborts: the rank hangs at exit (seen about
    once in a hundred spawned DDP tests).
    """
    import gc

    release_kept_groups()
    if any(alive() is not None for alive in _released):
        gc.collect()  # (a full collection costs a rank ~0.1 s: only when one lives on)
    _released.clear()
