"""How many ranks this machine can run at once, asked before any rank starts.

A world size beyond what the process, file-descriptor and memory limits allow
would otherwise start ranks until something breaks part-way (``Too many open
files``, the OOM killer, ``fork: Resource temporarily unavailable``). Each
limit is read from the machine; ``DISTSPAWN_MAX_RANKS`` replaces the computed
cap (a larger one on a machine you know, a smaller one to be safe).
"""

from __future__ import annotations

import os
import resource
from typing import Any

MAX_RANKS_VAR = "DISTSPAWN_MAX_RANKS"

# What one rank costs the test process in descriptors (its two pipe ends and
# sentinel, the start-up channel while it starts), with room to spare.
FDS_PER_RANK = 8
# Memory a rank adds on its own, measured on CPU with gloo: a forked rank
# shares torch's pages with its server (about 10 MB private, 50 MB PSS); a
# spawned one has its own interpreter (about 150 MB private).
_MIB = 1024 * 1024
MEMORY_PER_RANK = {"fork": 64 * _MIB, "forkserver": 64 * _MIB, "spawn": 160 * _MIB}


def _soft_limit(which: int) -> int | None:
    soft, _hard = resource.getrlimit(which)
    return None if soft == resource.RLIM_INFINITY else soft


def _open_fds() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0


def _available_memory() -> int | None:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def positive_int_from_env(name: str) -> int | None:
    """The integer >= 1 in environment variable ``name``; None when it is unset or empty."""
    configured = os.environ.get(name)
    if not configured:
        return None
    try:
        value = int(configured)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{name}={configured!r} is not valid; expected an integer >= 1")
    return value


def rank_capacity(start_method: str | None) -> tuple[int, str]:
    """The most ranks that can run at once here, and the limits behind it.

    ``start_method`` is "spawn", "fork" or "forkserver" for rank processes,
    None for rank threads (which cost no descriptors or interpreter).
    """
    configured = positive_int_from_env(MAX_RANKS_VAR)
    if configured is not None:
        return configured, f"{MAX_RANKS_VAR}={configured}"
    caps: list[tuple[int, str]] = []
    tasks = _soft_limit(resource.RLIMIT_NPROC)
    if tasks is not None:
        # Counted per user, threads included: leave half for everything else.
        caps.append((tasks // 2, f"processes: ulimit -u is {tasks}"))
    if start_method is not None:
        files = _soft_limit(resource.RLIMIT_NOFILE)
        if files is not None:
            spare = max(0, files - _open_fds())
            caps.append((spare // FDS_PER_RANK,
                         f"file descriptors: ulimit -n is {files}, {FDS_PER_RANK} a rank"))
        memory = _available_memory()
        per_rank = MEMORY_PER_RANK.get(start_method)
        if memory is not None and per_rank:
            caps.append((memory // per_rank,
                         f"memory: {memory / 1024**3:.1f} GiB available, about "
                         f"{per_rank // _MIB} MiB a {start_method} rank"))
    if not caps:
        return 1 << 30, "no limit found"
    cap, why = min(caps)
    return max(cap, 1), why


def check_rank_capacity(world_size: int, start_method: str | None, owner: str) -> None:
    """Raise ValueError, before any rank starts, if ``world_size`` is beyond capacity."""
    cap, why = rank_capacity(start_method)
    if world_size > cap:
        kind = "threads" if start_method is None else f"{start_method} processes"
        raise ValueError(
            f"{owner} = {world_size} is more ranks than this machine can run at once as "
            f"{kind}: at most {cap} ({why}). Use a smaller world size, or set "
            f"{MAX_RANKS_VAR} to the number this machine can take.")


def world_size_number(value: Any) -> int | None:
    """``value`` as an int (an int or a string holding one; not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        return None
    try:
        return int(value)
    except ValueError:
        return None


def validate_world_size(value: Any, owner: str) -> int:
    """``value`` as an int >= 1 (an int or a string holding one), else a clear error."""
    number = world_size_number(value)
    if number is None:
        of_type = "" if isinstance(value, str) else f" of type {type(value).__name__}"
        raise ValueError(
            f"{owner} must be an integer >= 1 (or a string holding one), got {value!r}{of_type}")
    if number < 1:
        raise ValueError(f"{owner} must be an integer >= 1, got {value!r}")
    return number
