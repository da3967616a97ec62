"""A barrier between rank processes through files under ``TEMP_DIR``.

It works before, after and without a process group, which is why the
conformance suite uses it around every test. The on-disk layout is upstream's
(``TEMP_DIR/barrier/<pid>`` holding the last barrier number that process
reached, guarded by ``TEMP_DIR/lockfile``), so processes using either
implementation synchronise with each other.
"""

from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager
from typing import Iterator

import torch.distributed as dist

if sys.platform == "win32":
    import msvcrt
else:
    import fcntl

# How often a waiting process looks at the barrier directory again. Files give
# no wake-up event, so this bounds the latency a barrier adds.
POLL_INTERVAL_S = 0.01


def _temp_dir() -> str:
    path = os.environ.get("TEMP_DIR")
    if not path:
        raise RuntimeError(
            "Barrier needs TEMP_DIR: set it to a directory that holds a 'barrier' "
            "subdirectory (initialize_temp_directories() sets both up)"
        )
    return path


def barrier_dir() -> str:
    """The directory where each process records the barrier it has reached."""
    return os.path.join(_temp_dir(), "barrier")


@contextmanager
def _lock() -> Iterator[None]:
    """Hold the exclusive lock on ``TEMP_DIR/lockfile`` (shared with upstream)."""
    with open(os.path.join(_temp_dir(), "lockfile"), "w") as handle:
        if sys.platform == "win32":
            msvcrt.locking(handle.fileno(), msvcrt.LK_RLCK, 1)
        else:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            if sys.platform == "win32":
                msvcrt.locking(handle.fileno(), msvcrt.LK_UNLCK, 1)
            else:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _reached(directory: str, barrier_id: int) -> list[str]:
    """Names (pids) of the processes that have reached ``barrier_id``."""
    arrived = []
    for name in os.listdir(directory):
        try:
            with open(os.path.join(directory, name)) as handle:
                if int(handle.read()) >= barrier_id:
                    arrived.append(name)
        except (OSError, ValueError):
            continue  # removed or being replaced: not counted this round
    return arrived


class Barrier:
    """Class-level barrier: ``Barrier.init()`` once per test, then ``Barrier.sync()``."""

    barrier_id = 0

    @classmethod
    def init(cls) -> None:
        """Start counting from zero and forget every earlier arrival."""
        cls.barrier_id = 0
        directory = barrier_dir()
        for name in os.listdir(directory):
            os.unlink(os.path.join(directory, name))

    @classmethod
    def sync(cls, wait_for: int | None = None, timeout: float = 10) -> None:
        """Wait until ``wait_for`` processes (default: the world size) reach this barrier.

        Raises ``RuntimeError`` after ``timeout`` seconds, saying how many arrived.
        """
        if wait_for is None:
            wait_for = dist.get_world_size()
        cls.barrier_id += 1
        directory = barrier_dir()
        with _lock():
            with open(os.path.join(directory, str(os.getpid())), "w") as handle:
                handle.write(str(cls.barrier_id))
        deadline = time.monotonic() + timeout
        while True:
            with _lock():
                arrived = _reached(directory, cls.barrier_id)
            if len(arrived) >= wait_for:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"barrier timeout: {len(arrived)} of {wait_for} processes reached "
                    f"barrier {cls.barrier_id} within {timeout} s (arrived pids: "
                    f"{', '.join(sorted(arrived)) or 'none'}; directory {directory})"
                )
            time.sleep(POLL_INTERVAL_S)
