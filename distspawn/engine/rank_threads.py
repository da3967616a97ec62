"""How many CPU threads torch may use in each rank process.

Every rank starts torch's default pool, one thread per core. With more ranks
than cores, OpenMP's idle threads spin against the other ranks' threads: on a
2-core machine a tiny DDP step at world size 4 takes about 80 ms instead of
10. torchrun sets ``OMP_NUM_THREADS=1`` for several local ranks for the same
reason; distspawn shares the usable CPUs out among the ranks unless the user
chose (``OMP_NUM_THREADS``, or ``DISTSPAWN_RANK_THREADS``).

The count is handed to each rank beside its environment, not in it: a rank's
environment is the test process's, exactly, as a spawned rank's is (a rank
forked from the preloaded server must see what its imports saw there).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

THREADS_VAR = "DISTSPAWN_RANK_THREADS"
ACCEPTED = ("'auto' (the default: the usable CPUs shared out among the ranks, unless "
            "OMP_NUM_THREADS is set), 'torch' (torch's own default in every rank) or a "
            "thread count >= 1")


def usable_cpus() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def threads_per_rank(world_size: int) -> int | None:
    """The thread count for each of ``world_size`` ranks; None leaves torch's default.

    Raises ``ValueError`` naming the variable for a value it does not accept.
    """
    raw = os.environ.get(THREADS_VAR, "").strip() or "auto"
    if raw == "torch":
        return None
    if raw == "auto":
        if os.environ.get("OMP_NUM_THREADS"):
            return None  # the user's choice; torch already follows it
        return max(1, usable_cpus() // max(1, world_size))
    try:
        count = int(raw)
    except ValueError:
        count = 0
    if count < 1:
        raise ValueError(f"{THREADS_VAR}={raw!r} is not accepted; use {ACCEPTED}")
    return count


@dataclass(frozen=True)
class RankEnvironment:
    """What a rank starts with: the test process's variables, and its thread count."""

    variables: dict[str, str]
    threads: int | None  # None: torch's own default (or the user's OMP_NUM_THREADS)


def rank_environment(world_size: int) -> RankEnvironment:
    """The environment each of ``world_size`` ranks starts with, taken now."""
    return RankEnvironment(dict(os.environ), threads_per_rank(world_size))


def apply_thread_count(count: int | None) -> None:
    """In a rank: make torch use ``count`` threads (None: leave torch's count)."""
    if count is None:
        return
    import torch

    if torch.get_num_threads() != count:
        torch.set_num_threads(count)
