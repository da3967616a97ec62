"""Helpers for tests that share tensors between processes.

``leak_checker`` fails a test that leaves shared-memory files behind for the
processes it watched; ``fs_sharing`` runs a block under the ``file_system``
sharing strategy. Both keep the names and behaviour of upstream's
``test_multiprocessing.py`` helpers, so suites built on them port unchanged.
"""

from __future__ import annotations

import contextlib
import gc
import os
import time
import unittest
from collections.abc import Iterator
from typing import Any

import torch
import torch.multiprocessing as mp

from .fixtures.device_probe import cuda_available

SHM_DIR = "/dev/shm"
HAS_SHM_FILES = os.path.isdir(SHM_DIR)
# How long file_system-strategy files may take to disappear after their last user.
MAX_WAITING_TIME_IN_SECONDS = 30
_POLL_INTERVAL_S = 0.05

__all__ = ["HAS_SHM_FILES", "MAX_WAITING_TIME_IN_SECONDS", "fs_sharing", "leak_checker"]


@contextlib.contextmanager
def fs_sharing() -> Iterator[None]:
    """Share tensors through files (``file_system``) inside the block, then restore."""
    previous = mp.get_sharing_strategy()
    mp.set_sharing_strategy("file_system")
    try:
        yield
    finally:
        mp.set_sharing_strategy(previous)


class leak_checker:  # noqa: N801 - upstream's name
    """Fail ``test_case`` if the watched processes leave ``/dev/shm/torch_<pid>*`` files.

    The current process is watched from the start; add each child with
    :meth:`check_pid`. The check runs when the block exits without an
    exception. Under the ``file_system`` strategy files are removed
    asynchronously, so it waits up to ``MAX_WAITING_TIME_IN_SECONDS`` for them.
    """

    def __init__(self, test_case: unittest.TestCase) -> None:
        self.checked_pids: list[int] = [os.getpid()]
        self.test_case = test_case

    def __enter__(self) -> leak_checker:
        self.next_fds = self._get_next_fds(10)
        return self

    def __exit__(self, exc_type: Any, *args: Any) -> bool:
        if cuda_available():
            torch.cuda.ipc_collect()
        if exc_type is None:
            leaked = self.has_shm_files()
            self.test_case.assertFalse(
                leaked, f"shared-memory files left behind in {SHM_DIR}: {self.shm_files()}")
        return False

    def check_pid(self, pid: int | None) -> None:
        """Also watch ``pid``'s files. (None, a process not started yet, is ignored:
        upstream's own tests pass ``p.pid`` before ``p.start()``.)"""
        if pid is not None:
            self.checked_pids.append(pid)

    def _get_next_fds(self, n: int = 1) -> list[int]:
        # The numbers the next n opened files would get (a growing list means leaked fds).
        fds = [os.dup(0) for _ in range(n)]
        for fd in fds:
            os.close(fd)
        return fds

    def has_shm_files(self, wait: bool = True) -> bool:
        """Whether watched processes have shm files now (waiting for file_system ones)."""
        if not HAS_SHM_FILES:
            return False
        found = self._has_shm_files()
        if not found or not wait or mp.get_sharing_strategy() != "file_system":
            return found
        deadline = time.monotonic() + MAX_WAITING_TIME_IN_SECONDS
        # Polled: the files go when another process drops its last reference,
        # and there is no notification for that.
        while found and time.monotonic() < deadline:
            time.sleep(_POLL_INTERVAL_S)
            found = self._has_shm_files()
        return found

    def _has_shm_files(self) -> bool:
        return bool(self.shm_files())

    def shm_files(self) -> list[str]:
        """Names of the watched processes' files in ``/dev/shm``."""
        if not HAS_SHM_FILES:
            return []
        gc.collect()  # drop tensors nothing refers to any more, and their files
        prefixes = tuple(f"torch_{pid}_" for pid in self.checked_pids)
        return sorted(name for name in os.listdir(SHM_DIR) if name.startswith(prefixes))
