"""Inside a reused rank process: run test after test on one process group.

The parent sends a :class:`Task` per test over the rank's pipe; the worker
runs it and answers with a :class:`~distspawn.protocol.RankReport` whose
``test_name`` is the test id, so a result can never be taken for another
test's. After each test the worker looks for what the test left behind
(:func:`leftovers`) and reports it as a failure of that test.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
import unittest
from dataclasses import dataclass
from multiprocessing.connection import Connection

import torch
import torch.distributed as c10d

from .protocol import RankReport, ReportStatus
from .skips import SKIP_MESSAGE_BY_EXIT_CODE
from .testcase import set_rng_seed
from .worker import (
    ClassRef,
    RankFiles,
    enable_native_crash_dump,
    exit_code_of,
    format_user_exception,
    prepare_rank_process,
    resolve_class,
)

# How long threads a test started get to finish before they count as leaked.
THREAD_GRACE_S = 1.0


@dataclass(frozen=True)
class Task:
    """Run ``test_id``; ``rdvz_file`` is set when the test gets a fresh process group."""

    test_id: str
    rdvz_file: str | None = None


def _skip_reason_of_exit(exc: SystemExit) -> str | None:
    return SKIP_MESSAGE_BY_EXIT_CODE.get(exit_code_of(exc))


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
                                  or c10d.distributed_c10d._get_default_group() is not pg_before):
        found.append("the class's default process group was destroyed or replaced")
    if pg_before is None and c10d.is_available() and c10d.is_initialized():
        found.append("a default process group was left initialised")
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        now = torch.cuda.memory_allocated()
        if now > cuda_before:
            found.append(f"{now - cuda_before} bytes of CUDA memory still allocated")
    return found


def _run_one(cls: type, rank: int, world_size: int, test_id: str) -> RankReport:
    test_name = test_id.rsplit(".", 1)[-1]
    threads_before = set(threading.enumerate())
    pg_before = c10d.distributed_c10d._get_default_group() \
        if c10d.is_available() and c10d.is_initialized() else None
    cuda_before = torch.cuda.memory_allocated() \
        if torch.cuda.is_available() and torch.cuda.is_initialized() else 0
    try:
        test = cls(test_name)
        test.rank, test.world_size = rank, world_size
        set_rng_seed()  # every rank starts each test from the same seed
        getattr(test, test_name)()
    except unittest.SkipTest as skip:
        return RankReport(rank, test_id, ReportStatus.SKIPPED, reason=str(skip))
    except SystemExit as exc:
        reason = _skip_reason_of_exit(exc)
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


def worker_loop(cls: ClassRef | type, rank: int, world_size: int, rdvz_file: str,
                conn: Connection, parent_pid: int, environ: dict[str, str],
                files: RankFiles) -> None:
    """Target of each reused rank process: set up once, then serve tasks.

    Set up as a fresh rank is (``prepare_rank_process``): its output goes to
    its own log, from which the parent takes each test's part for reports.
    """
    prepare_rank_process(files, parent_pid, environ)
    enable_native_crash_dump()
    cls = resolve_class(cls)
    cls.rank, cls.world_size, cls.rdvz_file = rank, world_size, rdvz_file
    init_skip = None
    try:
        cls._init_pg(rank, world_size, rdvz_file)
    except SystemExit as exc:
        init_skip = _skip_reason_of_exit(exc)
        if init_skip is None:
            raise
    except BaseException:  # noqa: BLE001 - reported on every test it would have run
        init_error = traceback.format_exc()
    else:
        init_error = None
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            break  # the parent went away
        if task is None:
            break
        if init_skip is not None:
            report = RankReport(rank, task.test_id, ReportStatus.SKIPPED, reason=init_skip)
        elif init_error is not None:
            report = RankReport(rank, task.test_id, ReportStatus.FAILED, traceback=(
                "setting up the process group for this worker failed:\n" + init_error))
        else:
            if task.rdvz_file is not None:
                _fresh_group(cls, rank, world_size, task.rdvz_file)
            report = _run_one(cls, rank, world_size, task.test_id)
        sys.stdout.flush()
        sys.stderr.flush()
        conn.send(report)
    if init_error is None and init_skip is None and c10d.is_initialized():
        c10d.destroy_process_group()


def _fresh_group(cls: type, rank: int, world_size: int, rdvz_file: str) -> None:
    if c10d.is_initialized():
        c10d.destroy_process_group()
    cls.rdvz_file = rdvz_file
    cls._init_pg(rank, world_size, rdvz_file)
