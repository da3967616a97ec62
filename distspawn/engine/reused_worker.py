"""Inside a reused rank process: run test after test on one process group.

The parent sends a :class:`Task` per test over the rank's pipe; the worker has
the test class run it (``cls._run_reused_test``, which knows how a test ends)
and answers with its :class:`~distspawn.engine.protocol.RankReport`, whose
``test_name`` is the test id, so a result can never be taken for another
test's. The process is set up as a fresh rank is (its own log, stack dumps,
crash stack, death with the parent).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import torch

from . import forked_exit, leftovers, reduce_ops
from .exit_codes import skip_message_for
from .group_keeper import free_groups_before_shutdown, release_kept_groups
from .protocol import RankReport, ReportStatus
from .rank_threads import RankEnvironment
from .worker import (
    RankFiles,
    enable_native_crash_dump,
    exit_code_of,
    forked_process,
    interrupted_since,
    prepare_rank_process,
    resolve_class,
)


@dataclass(frozen=True)
class Task:
    """Run ``test_id``; ``rdvz_file`` is set when the test gets a fresh process group."""

    test_id: str
    rdvz_file: str | None = None


def worker_loop(cls: Any, rank: int, world_size: int, rdvz_file: str,
                conn: Connection, parent_pid: int, environ: RankEnvironment,
                files: RankFiles) -> None:
    """Target of each reused rank process: set up once, then serve tasks.

    Set up as a fresh rank is (``prepare_rank_process``): its output goes to
    its own log, from which the parent takes each test's part for reports.
    """
    prepare_rank_process(files, parent_pid, environ, own_log_thread=True)
    enable_native_crash_dump()
    cls = resolve_class(cls)
    leftovers.watch_torchs_exit_folders()  # its imports' folders, if it is killed
    cls.rank, cls.world_size, cls.rdvz_file = rank, world_size, rdvz_file
    init_skip = None
    try:
        _let_nccl_put_ranks_on_one_device(cls, world_size)
        cls._init_pg(rank, world_size, rdvz_file)
    except SystemExit as exc:
        init_skip = skip_message_for(exit_code_of(exc))
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
        started = time.monotonic()
        if init_skip is not None:
            report = RankReport(rank, task.test_id, ReportStatus.SKIPPED, reason=init_skip)
        elif init_error is not None:
            report = RankReport(rank, task.test_id, ReportStatus.FAILED, traceback=(
                "setting up the process group for this worker failed:\n" + init_error))
        else:
            if task.rdvz_file is not None:
                _fresh_group(cls, rank, world_size, task.rdvz_file)
            report = cls._run_reused_test(rank, world_size, task.test_id)
        sys.stdout.flush()
        sys.stderr.flush()
        conn.send(dataclasses.replace(report, reduce_ops=reduce_ops.take()))
        release_kept_groups()  # groups the test destroyed; none is in use now
        if report.status is not ReportStatus.PASSED and interrupted_since(started):
            break  # the test process is stopping (end_processes): leave now, not after its grace
    if init_error is None and init_skip is None:
        cls._destroy_pg()
    if forked_process():
        release_kept_groups()  # multiprocessing ends it with os._exit: no shutdown
        forked_exit.run_own()
    else:
        free_groups_before_shutdown()


# nccl refuses two ranks on one GPU unless this is set. A reused world larger
# than the GPU count can only run that way (a class whose _init_pg picks the
# devices itself, wrapping round), and upstream's workers (torch 2.15 on) set
# it in that case before _init_pg, so the same class runs on either harness.
NCCL_SHARED_DEVICE_ENV = "NCCL_MULTI_RANK_GPU_ENABLE"
NCCL_BACKEND_NAMES = ("nccl", "nccl2", "nccl-lazy")


def _let_nccl_put_ranks_on_one_device(cls: Any, world_size: int) -> None:
    # A class may come without backend_str (a project's own reused base); the
    # device count is asked only for nccl, so a CPU run never probes CUDA here.
    backend = cls.backend_str() if hasattr(cls, "backend_str") else None
    if backend in NCCL_BACKEND_NAMES and world_size > torch.accelerator.device_count():
        os.environ[NCCL_SHARED_DEVICE_ENV] = "1"


def _fresh_group(cls: type, rank: int, world_size: int, rdvz_file: str) -> None:
    cls._destroy_pg()
    cls.rdvz_file = rdvz_file
    cls._init_pg(rank, world_size, rdvz_file)
