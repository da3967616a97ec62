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
from typing import Any

_kept: list[Any] = []


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
    _kept.clear()
