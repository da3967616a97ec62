"""Upstream's ``torch.testing._internal.distributed.fake_pg``: ``FakeStore`` and the
``fake`` backend, registered on import (where this torch has not already).

    from distspawn.fake_pg import FakeStore
    dist.init_process_group("fake", store=FakeStore(), rank=3, world_size=8)

The fake group answers every collective without communicating (the data is
wrong by design): one process can trace, shard or compile as any rank of any
world size.
"""

from __future__ import annotations

from .backends.fake_backend import (  # noqa: F401 - _create_fake_pg: upstream's name
    FakeStore,
    _create_fake_pg,
    register_fake_backend,
)

__all__ = ["FakeStore"]

register_fake_backend()
