"""Rank processes forked ahead of time, waiting to learn their test and rank.

Every test still runs on processes that ran no other test. What need not wait
for the test is the fork: the forkserver makes one process at a time (about
25 ms each for a process holding torch), so a test at world size 4 spent
0.1 s starting its ranks. Once a test's ranks are running, as many spares are
forked from a background thread; the next test hands each spare its
assignment (the arguments a rank process would have been started with) on
the rank's control pipe, and forks only what the spares do not cover.

Spares are only ever made by the forkserver (a clean server, never the test
process) and end when their pipe closes: at exit, or when the test process
dies (the same parent-death signal as ranks).
"""

from __future__ import annotations

import atexit
import os
import threading
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import torch.multiprocessing as mp

MAX_SPARES = 16
SPARES_VAR = "DISTSPAWN_SPARE_RANKS"


def enabled() -> bool:
    """Whether tests take spares (``DISTSPAWN_SPARE_RANKS``: 1, the default, or 0).

    Raises ``ValueError`` naming the variable for any other value.
    """
    raw = os.environ.get(SPARES_VAR, "").strip() or "1"
    if raw not in ("0", "1"):
        raise ValueError(f"{SPARES_VAR}={raw!r} is not accepted; use 1 (fork each test's "
                         "rank processes ahead, while the previous test runs; the default) "
                         "or 0 (fork them when the test starts)")
    return raw == "1"


@dataclass
class Spare:
    """A started process waiting on ``control`` for its assignment."""

    process: Any
    control: Connection  # the parent's ends of the rank's two pipes
    results: Connection

    def close(self) -> None:
        self.control.close()
        self.results.close()


class SparePool:
    """The spares of this test process (one pool, one start method: forkserver)."""

    def __init__(self) -> None:
        self._spares: list[Spare] = []
        self._lock = threading.Lock()
        self._filling: threading.Thread | None = None
        self._closed = False

    def take(self, count: int) -> list[Spare]:
        """Up to ``count`` live spares, oldest first; the rest of the ranks start fresh."""
        taken: list[Spare] = []
        with self._lock:
            while self._spares and len(taken) < count:
                spare = self._spares.pop(0)
                if spare.process.is_alive():
                    taken.append(spare)
                else:
                    spare.close()
                    spare.process.join(0)
        return taken

    def refill(self, process_class: type, target: Any, count: int) -> None:
        """Fork spares in the background until ``count`` wait (at most MAX_SPARES)."""
        count = min(count, MAX_SPARES)
        with self._lock:
            if self._closed or (self._filling is not None and self._filling.is_alive()):
                return
            missing = count - len(self._spares)
            if missing <= 0:
                return
            self._filling = threading.Thread(
                target=self._fill, args=(process_class, target, missing),
                name="distspawn-spares", daemon=True)
            self._filling.start()

    def _fill(self, process_class: type, target: Any, missing: int) -> None:
        for _ in range(missing):
            control_parent, control_child = mp.Pipe()
            results_parent, results_child = mp.Pipe()
            process = process_class(target=target, name="spare rank",
                                    args=(control_child, results_child, os.getpid()))
            try:
                process.start()
            except Exception:  # noqa: BLE001 - tests start their ranks themselves then
                for conn in (control_parent, control_child, results_parent, results_child):
                    conn.close()
                return
            control_child.close()
            results_child.close()
            spare = Spare(process, control_parent, results_parent)
            with self._lock:
                if self._closed:
                    spare.close()
                    return
                self._spares.append(spare)

    def close(self) -> None:
        """End every waiting spare (its pipe closes; it exits)."""
        with self._lock:
            self._closed = True
            spares, self._spares = self._spares, []
            filling = self._filling
        if filling is not None:
            filling.join(timeout=10)
            with self._lock:
                spares += self._spares
                self._spares = []
        for spare in spares:
            spare.close()
        for spare in spares:
            spare.process.join(timeout=5)
            if spare.process.is_alive():
                spare.process.kill()
                spare.process.join()


POOL = SparePool()
# Before multiprocessing's own exit handler, which would wait for them.
atexit.register(POOL.close)
