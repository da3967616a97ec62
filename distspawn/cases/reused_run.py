"""One test on a reused rank: how it ended, and what it left behind.

Called in the rank process by the engine's reused worker loop (through
``MultiProcContinuousTest._run_reused_test``); the unittest knowledge (skips,
exits, failures) lives here, not in the engine.
"""

from __future__ import annotations

import threading
import time
import unittest

import torch
import torch.distributed as c10d

from ..engine.exit_codes import skip_message_for
from ..engine.protocol import RankReport, ReportStatus
from ..engine.worker import exit_code_of, format_user_exception
from .testcase import set_rng_seed

# How long threads a test started get to finish before they count as leaked.
THREAD_GRACE_S = 1.0


def leftovers(threads_before: set[threading.Thread], pg_before, cuda_before: int) -> list[str]:
    """What the test left behind on this reused process, in words."""
    found = []
    deadline = time.monotonic() + THREAD_GRACE_S
    for thread in set(threading.enumerate()) - threads_before:
        thread.join(max(0.0, deadline - time.monotonic()))
    extra = sorted(t.name for t in set(threading.enumerate()) - threads_before if t.is_alive())
    if extra:
        found.append(f"{len(extra)} thread(s) still running: {', '.join(extra)}")
    if pg_before is not None and (not c10d.is_initialized()
                                  or c10d.group.WORLD is not pg_before):
        found.append("the class's default process group was destroyed or replaced")
    if pg_before is None and c10d.is_available() and c10d.is_initialized():
        found.append("a default process group was left initialised")
    if torch.cuda.is_initialized():
        now = torch.cuda.memory_allocated()
        if now > cuda_before:
            found.append(f"{now - cuda_before} bytes of CUDA memory still allocated")
    return found


def run_reused_test(cls: type, rank: int, world_size: int, test_id: str) -> RankReport:
    test_name = test_id.rsplit(".", 1)[-1]
    threads_before = set(threading.enumerate())
    pg_before = c10d.group.WORLD \
        if c10d.is_available() and c10d.is_initialized() else None
    cuda_before = torch.cuda.memory_allocated() \
        if torch.cuda.is_initialized() else 0
    try:
        test = cls(test_name)
        test.rank, test.world_size = rank, world_size
        set_rng_seed()  # every rank starts each test from the same seed
        getattr(test, test_name)()
    except unittest.SkipTest as skip:
        return RankReport(rank, test_id, ReportStatus.SKIPPED, reason=str(skip))
    except SystemExit as exc:
        reason = skip_message_for(exit_code_of(exc))
        if reason is not None:
            return RankReport(rank, test_id, ReportStatus.SKIPPED, reason=reason)
        return RankReport(rank, test_id, ReportStatus.EXITED, exit_code=exit_code_of(exc))
    except BaseException:  # noqa: BLE001 - every way a test ends is a result
        return RankReport(rank, test_id, ReportStatus.FAILED,
                          traceback=format_user_exception())
    left = leftovers(threads_before, pg_before, cuda_before)
    if left:
        return RankReport(rank, test_id, ReportStatus.FAILED, traceback=(
            "the test passed but left this reused worker dirty:\n  " + "\n  ".join(left)))
    return RankReport(rank, test_id, ReportStatus.PASSED)
