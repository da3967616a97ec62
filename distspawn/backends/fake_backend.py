"""The ``fake`` process group backend: one process plays any rank of any world.

torch ships the backend itself (``FakeProcessGroup``, which answers every
collective without communicating) but registers its creator only when its
private test module is imported. This registers the same creator, once, and
only where this torch has not already done so, so that
``init_process_group("fake", store=FakeStore(), rank=r, world_size=n)`` works
after ``import distspawn.fake_pg``, as it does after upstream's import.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

__all__ = ["FakeStore", "fake_backend_unavailable", "register_fake_backend"]

FAKE_DEVICES = ["cpu", "cuda", "hpu", "xpu"]


class FakeStore(dist.Store):
    """A key-value store that stores nothing: the rendezvous a fake group needs.

    A fake process group never talks to its peers, so it never reads the store;
    ``dist.HashStore()`` works as well.
    """


def _fake_process_group_class() -> Any:
    c10d_ext = getattr(torch._C, "_distributed_c10d", None)
    return getattr(c10d_ext, "FakeProcessGroup", None)


def fake_backend_unavailable() -> str | None:
    """Why the fake backend cannot be made with this torch, or None when it can."""
    if not dist.is_available():
        return "torch.distributed is not available in this build"
    if _fake_process_group_class() is None:
        return "this torch has no FakeProcessGroup (torch._C._distributed_c10d)"
    return None


def _create_fake_pg(common_opts: Any, backend_opts: Any) -> Any:
    """Make a fake group for the rank and size ``init_process_group`` was given."""
    group_class = _fake_process_group_class()
    create = getattr(group_class, "_create_internal", None)
    if create is not None:
        return create(common_opts.group_rank, common_opts.group_size, backend_opts)
    # Releases before the factory took options had a plain (rank, size) constructor.
    return group_class(common_opts.group_rank, common_opts.group_size)


def _already_registered() -> bool:
    # A creator registered by torch itself (or by upstream's test module) wins.
    plugins = getattr(dist.Backend, "_plugins", None)
    return isinstance(plugins, dict) and "FAKE" in plugins


def register_fake_backend() -> bool:
    """Register the ``fake`` backend unless this torch already has it; True if it is usable."""
    if fake_backend_unavailable() is not None:
        return False
    if not _already_registered():
        dist.Backend.register_backend("fake", _create_fake_pg, extended_api=True,
                                      devices=FAKE_DEVICES)
    return True
