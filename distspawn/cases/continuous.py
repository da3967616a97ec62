"""MultiProcContinuousTest: rank processes reused across the tests of a class.

The parent starts ``world_size`` workers once per concrete class (lazily, at
the first test) and sends each test's id to all of them; every worker runs it
on the process group it set up once (``_init_pg``) and reports back with the
test id and its rank. Unlike upstream's, a failing, crashing or hanging test
fails alone: the pool is ended and a fresh one serves the next test (no
"poison pill" skipping the rest of the class), and the verdict follows the
same rules as for fresh processes.

``run_rank()`` is the other way to run such a class: each process (started by
``torchrun`` or ``mp.spawn``) calls it to become one rank and runs the tests
itself, with the process group set up in ``setUpClass``.
"""

from __future__ import annotations

import atexit
import inspect
import logging
import os
import shutil
import tempfile
import time
import unittest
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import Any, Callable

import torch
import torch.distributed as c10d
import torch.multiprocessing as mp

from ..engine import launch, leftovers, stall
from ..engine.reused_worker import Task, worker_loop
from ..fixtures.device_probe import (accelerator_type, backend_for_device,
                                     build_accelerator_type, devices_by_rank)
from .dist_backend import backend_is_available
from ..fixtures.environment import DEFAULT_WORLD_SIZE, IS_SANDCASTLE, get_timeout
from ..engine.capacity import check_rank_capacity, validate_world_size
from .empty_world import declared_world_size, ranks_to_start
from ..engine.rank_threads import rank_environment
from .multiprocess import start_failure_hint
from ..engine.ending import end_processes, wait_for_exits
from ..engine.supervisor import RankProcess, RankSupervisor, log_size
from .testcase import RankDispatchingTestCase, rerun_command, run_tests, set_rng_seed
from ..engine.worker import RankFiles
from .class_ref import class_ref
from .reused_run import run_reused_test
from ..engine.protocol import RankReport
from .sized_variants import variants_of
from ..engine.verdict import (
    RankFailure,
    RankOutcome,
    ReturnCodePolicy,
    SkipRule,
    VerdictKind,
    decide_verdict,
    is_decisive,
    worker_words,
)

__all__ = ["C10dTorchCommsTestBase", "MultiProcContinuousTest", "MultiProcContinousTest"]

logger = logging.getLogger(__name__)

# After one rank failed, how long the others get to report before the pool ends.
PEER_REPORT_GRACE_S = 0.5


@dataclass
class _Worker:
    rank: int
    process: Any
    conn: Connection
    files: RankFiles


@dataclass
class _Pool:
    workers: list[_Worker]
    rdvz_file: str
    work_dir: str  # the workers' logs, stack and crash files; gone with the pool


# Classes whose pool is running: a run stopped between two tests (Ctrl-C,
# SIGTERM) skips tearDownClass, so the pools are ended at exit instead.
_classes_with_pools: set = set()


@atexit.register
def _end_pools_left_running() -> None:
    for cls in list(_classes_with_pools):
        cls._end_pool(stop_gently=False)


class MultiProcContinuousTest(RankDispatchingTestCase):
    """Runs every test of the class on ``world_size`` long-lived rank processes.

    Upstream's API: ``world_size`` (class attribute or property; unset means
    one rank per device of ``device_type()``, and 4 ranks on the CPU, where
    upstream's gives 1), ``backend_str()``, ``opts()``,
    ``device_type()``, ``timeout``, ``rank``, ``rdvz_file``, ``_init_pg`` and
    ``run_rank()``. Beyond upstream:

    * ``start_method`` (as on MultiProcessTestCase: forkserver by default);
    * ``fresh_process_group_per_test = True`` gives each test its own group;
    * after each test a worker reports what the test left behind (threads,
      a replaced or leftover process group, CUDA memory) as a failure of it;
    * ``lenient_skips``: when True, use upstream's rule for ranks that disagree
      about skipping (the lowest rank that did not pass decides, so one rank's
      skip skips the test); by default that is a failure.
    """

    MAIN_PROCESS_RANK = -1
    world_size: int = -2  # unset: one rank per device
    rank: int = -2  # unset: set in each worker (or by run_rank)
    rdvz_file: str | None = None
    timeout: timedelta = timedelta(seconds=120)
    start_method: str | None = None
    fresh_process_group_per_test: bool = False
    lenient_skips: bool = False
    # Upstream's harness takes the first rank, in rank order, that did not pass.
    _UPSTREAM_SKIP_RULE = SkipRule.ANY_RANK
    stall_window: float | None = None  # as MultiProcessTestCase's
    # The stand-in mode sets it: device_type() then follows upstream's rule
    # (the build's accelerator, device or not), so files run unchanged keep
    # upstream's verdicts on a CUDA build without a GPU.
    upstream_verdicts: bool = False
    _in_rank_mode: bool = False  # run_rank(): this process is one rank

    # -- upstream's customisation points ----------------------------------------

    @classmethod
    def backend_str(cls) -> str | None:
        """The process group backend; None lets torch pick one per device."""
        return None

    @classmethod
    def device_type(cls) -> str:
        """An accelerator type the ranks can use here, else "cpu" (with
        ``upstream_verdicts``: the build's accelerator, device or not)."""
        if cls.upstream_verdicts:
            return build_accelerator_type() or "cpu"
        return accelerator_type() or "cpu"

    @classmethod
    def opts(cls, high_priority_stream: bool = False) -> Any:
        """Process group options for ``init_process_group`` (None: the defaults)."""
        return None

    @classmethod
    def _init_pg(cls, rank: int, world_size: int, rdvz_file: str | None) -> None:
        os.environ["LOCAL_RANK"] = str(rank)
        store = c10d.FileStore(rdvz_file, world_size) if rdvz_file else None
        c10d.init_process_group(backend=cls.backend_str(), world_size=world_size, rank=rank,
                                store=store, pg_options=cls.opts(), timeout=cls.timeout)
        cls.pg = c10d.group.WORLD

    @classmethod
    def _destroy_pg(cls) -> None:
        """Destroy this rank's group and drop ``cls.pg``, so that it is freed now.

        A group still referenced when the interpreter shuts down keeps gloo's
        threads running into finalisation, where one that frees a finished
        collective's tensors needs the GIL and aborts the process ("terminate
        called without an active exception"). Seen with torch 2.14 under torchrun.
        """
        if c10d.is_initialized():
            c10d.destroy_process_group()
        if "pg" in cls.__dict__:
            cls.pg = None

    @classmethod
    def _run_test_given_id(cls, test_id: str, **kwargs: Any) -> None:
        """Run one test in this process as ``cls.rank`` (upstream's worker entry)."""
        test_name = test_id.rsplit(".", 1)[-1]
        test = cls(test_name)
        test.rank, test.world_size = cls.rank, cls.world_size
        set_rng_seed()
        getattr(test, test_name)(**kwargs)

    @classmethod
    def _run_reused_test(cls, rank: int, world_size: int, test_id: str) -> RankReport:
        """Run one test on this reused rank; how it ended (the engine's worker asks)."""
        return run_reused_test(cls, rank, world_size, test_id)

    # -- torchrun / mp.spawn: this process is one rank -----------------------------

    @classmethod
    def run_rank(cls, rank: int, world_size: int, rdvz_file: str | None = None) -> None:
        """Entry point of one rank process: run this module's tests as ``rank``.

        Under ``torchrun`` leave ``rdvz_file`` out (the group comes from the
        environment); with ``mp.spawn`` pass a file path every rank shares.
        """
        validate_world_size(world_size, "run_rank(world_size=...)")
        if not 0 <= int(rank) < int(world_size):
            raise ValueError(f"run_rank(rank={rank!r}): rank must be in 0..{world_size - 1}")
        cls.rank, cls.world_size, cls.rdvz_file = int(rank), int(world_size), rdvz_file
        MultiProcContinuousTest._in_rank_mode = True
        run_tests()

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        if cls._in_rank_mode and not c10d.is_initialized():
            cls._init_pg(cls.rank, cls.world_size, cls.rdvz_file)

    @classmethod
    def tearDownClass(cls) -> None:
        if cls._in_rank_mode:
            if c10d.is_initialized():
                # All ranks leave together: a rank tearing gloo down while its
                # peer still uses the connection can abort the peer at exit.
                try:
                    c10d.barrier()
                finally:
                    cls._destroy_pg()
        else:
            cls._end_pool()
            for variant in variants_of(cls):  # pools of sizes the pytest plugin asked for
                variant._end_pool()
        super().tearDownClass()

    # -- dispatch ------------------------------------------------------------------

    _MAIN_DESCRIPTION = "the dispatcher"

    def _is_main(self, rank: int) -> bool:
        return rank == self.MAIN_PROCESS_RANK

    def setUp(self) -> None:
        super().setUp()
        self.rank = type(self).rank if self._in_rank_mode else self.MAIN_PROCESS_RANK

    @classmethod
    def _resolve_world_size(cls) -> int:
        value = declared_world_size(cls)
        if value == -2:
            device_type = cls._class_device_type()
            if device_type == "cpu" and not cls.upstream_verdicts:
                # Upstream's one rank per device makes a CPU world of one
                # rank (torch.cpu.device_count() is 1), where no collective is
                # exercised and a 2-D mesh cannot be built. The stand-in mode
                # keeps that, and upstream's verdicts with it.
                return DEFAULT_WORLD_SIZE
            value = torch.get_device_module(device_type).device_count()
            if value == 0:
                raise unittest.SkipTest(f"no {device_type} devices for {cls.__name__}'s ranks")
        return ranks_to_start(value, f"{cls.__name__}.world_size", cls.upstream_verdicts)

    @classmethod
    def _class_device_type(cls) -> str:
        # Upstream's classmethod, a mixin's property (DTensorTestMixin's reads
        # class-level values only, so the class can stand in for an instance)
        # or a plain string (instantiate_device_type_tests sets one).
        declared = inspect.getattr_static(cls, "device_type", None)
        if isinstance(declared, property):
            return declared.fget(cls)
        value = cls.device_type
        return value() if callable(value) else value

    @classmethod
    def _pool(cls) -> _Pool | None:
        return cls.__dict__.get("_live_pool")

    @classmethod
    def _start_pool(cls) -> _Pool | None:
        """The class's reused workers, started; None for a world of no ranks
        (the stand-in mode: upstream passes its tests without running them)."""
        world_size = cls._resolve_world_size()
        if world_size == 0:
            return None
        backend = cls.backend_str()
        if backend is not None and not backend_is_available(backend):
            raise unittest.SkipTest(f"backend {backend!r} is not available in this torch")
        method = launch.resolve_start_method(cls.start_method, f"{cls.__name__}.start_method")
        check_rank_capacity(world_size, method, f"{cls.__name__}.world_size")
        stall.window_for(cls)  # a bad setting fails here, before any worker starts
        process_class = launch.process_class(method, cls.__module__)
        handle, rdvz_file = tempfile.mkstemp(prefix="distspawn-rdvz-")
        os.close(handle)
        pool = _Pool([], rdvz_file, tempfile.mkdtemp(prefix="distspawn-pool-"))
        leftovers.remove_if_killed(rdvz_file)
        leftovers.remove_if_killed(pool.work_dir)
        # Registered before any start, so that a failed start still cleans up.
        cls._live_pool = pool
        _classes_with_pools.add(cls)
        environ = rank_environment(world_size)
        for rank in range(world_size):
            parent_end, child_end = mp.Pipe()
            files = RankFiles.in_dir(pool.work_dir, rank)
            process = process_class(
                target=worker_loop, name=f"{cls.__name__} rank {rank}", daemon=True,
                args=(class_ref(cls), rank, world_size, rdvz_file, child_end, os.getpid(),
                      environ, files))
            try:
                process.start()
            except Exception as exc:
                parent_end.close()
                child_end.close()
                cls._end_pool(stop_gently=False)
                raise RuntimeError(
                    f"could not start rank {rank} of {cls.__qualname__}'s reused workers: "
                    f"{exc}{start_failure_hint(exc)}") from exc
            child_end.close()
            pool.workers.append(_Worker(rank, process, parent_end, files))
        if not isinstance(inspect.getattr_static(cls, "world_size", None), property):
            cls.world_size = world_size  # as upstream: the dispatcher knows it too
        return pool

    @classmethod
    def _end_pool(cls, stop_gently: bool = True) -> None:
        pool = cls._pool()
        if pool is None:
            return
        cls._live_pool = None
        _classes_with_pools.discard(cls)
        if stop_gently:
            for worker in pool.workers:
                try:
                    worker.conn.send(None)
                except (OSError, BrokenPipeError):
                    pass
            # Every worker gets the whole grace to finish its exit clean-ups.
            wait_for_exits([w.process for w in pool.workers], 10)
        end_processes([w.process for w in pool.workers])
        for worker in pool.workers:
            worker.conn.close()
        try:
            os.remove(pool.rdvz_file)
        except OSError:
            pass
        shutil.rmtree(pool.work_dir, ignore_errors=True)

    def _join_ranks(self, fn: Callable) -> None:
        cls = type(self)
        pool = cls._pool() or cls._start_pool()
        if pool is None:
            return  # a world of no ranks, passed in the stand-in mode
        test_id = self.id()
        fresh_file = None
        if cls.fresh_process_group_per_test:
            handle, fresh_file = tempfile.mkstemp(prefix="distspawn-rdvz-")
            os.close(handle)
            leftovers.remove_if_killed(fresh_file)
        started = time.monotonic()
        try:
            outcomes = self._run_on_pool(pool, Task(test_id, fresh_file))
        except BaseException:
            # Ctrl-C or SIGTERM mid-test: the pool and its files go now, not at exit.
            cls._end_pool(stop_gently=False)
            raise
        finally:
            if fresh_file is not None:
                try:
                    os.remove(fresh_file)
                except OSError:
                    pass
        policy = ReturnCodePolicy(skip_rule=cls._skip_rule(), skips_pass=IS_SANDCASTLE)
        verdict = decide_verdict(outcomes, policy, worker_words)
        if verdict.kind is VerdictKind.FAIL or any(o.exit_code is None for o in outcomes):
            # Whatever state the failure left in the workers, the next test starts clean.
            cls._end_pool(stop_gently=False)
        if verdict.kind is VerdictKind.SKIP:
            raise unittest.SkipTest(verdict.message)
        if verdict.kind is VerdictKind.PASS:
            return
        elapsed = time.monotonic() - started
        raise RankFailure(
            f"{test_id} failed after {elapsed:.1f}s on reused workers (a fresh pool serves "
            "the next test)", verdict, f"Re-run just this test:\n  {rerun_command(self)}")

    def _run_on_pool(self, pool: _Pool, task: Task) -> list[RankOutcome]:
        """Send ``task`` to every worker; the supervisor watches them as it does
        fresh ranks, counting a rank done once it reported for this test id."""
        ranks = []
        for worker in pool.workers:
            ranks.append(RankProcess(worker.rank, worker.process, None, worker.conn,
                                     worker.files, log_start=log_size(worker.files.log_path)))
            try:
                worker.conn.send(task)
            except (OSError, BrokenPipeError):
                pass  # it died: its sentinel says how
        policy = ReturnCodePolicy(skip_rule=type(self)._skip_rule())
        supervisor = RankSupervisor(ranks, get_timeout(task.test_id),
                                    lambda outcome: is_decisive(outcome, policy),
                                    test_id=task.test_id,
                                    stall_window_s=stall.window_for(type(self)))
        return supervisor.watch()


# Upstream's older, misspelled name.
MultiProcContinousTest = MultiProcContinuousTest


class C10dTorchCommsTestBase(MultiProcContinuousTest):
    """Reused workers whose process groups run on torchcomms (upstream's base class)."""

    world_size: int = DEFAULT_WORLD_SIZE

    @staticmethod
    def backend(device: str) -> str:
        return backend_for_device(device)

    @classmethod
    def backend_str(cls) -> str:
        return cls.backend(cls._class_device_type())

    def _skip_if_backend_unavailable(self, device: str) -> None:
        from ..fixtures import accelerators

        name = self.backend(device)
        flag = getattr(accelerators, f"TORCHCOMM_HAS_{name.upper()}", None)
        if flag is not None and not flag:
            self.skipTest(f"torchcomms {name} backend is not available")

    def rank_to_device(self, device: Any) -> dict[int, list[int]]:
        """Rank -> [device index], wrapping round the visible devices."""
        return devices_by_rank(device, self.world_size)

    @classmethod
    def _init_pg(cls, rank: int, world_size: int, rdvz_file: str | None) -> None:
        from ..fixtures.stores import find_free_port

        torch.distributed.config.use_torchcomms = True
        os.environ.update({
            "MASTER_ADDR": "localhost", "MASTER_PORT": str(find_free_port()),
            "TORCHCOMM_RANK": str(rank), "TORCHCOMM_SIZE": str(world_size),
            "TORCHCOMM_STORE_PATH": rdvz_file or "",
        })
        super()._init_pg(rank, world_size, rdvz_file)
        backend = cls.backend_str()
        device_type = accelerator_type()
        if ("nccl" in backend or "xccl" in backend) and device_type is not None:
            device = torch.device(f"{device_type}:{rank}")
            torch.set_default_device(device)
            torch.get_device_module(device_type).set_device(device)
