"""TestDistBackend: run a backend conformance suite chosen by environment variables.

A suite class (such as ``DistributedTest._DistTestBase``) is combined with
:class:`TestDistBackend`, and the run is configured the way upstream's
``test_distributed_spawn.py`` is: ``BACKEND``, ``WORLD_SIZE`` and ``TEMP_DIR``.
:func:`read_dist_env` checks all three at once and says what is wrong.
"""

from __future__ import annotations

import os
import sys
import unittest
from dataclasses import dataclass
from datetime import timedelta
from functools import wraps
from typing import Any, Callable

import torch
import torch.distributed as dist

from ..fixtures.barrier import Barrier, sync_on_files, upstream_barrier_class
from ..fixtures.device_probe import cuda_available, device_of_backend
from ..fixtures.environment import FILE_SCHEMA, IS_SANDCASTLE
from .multiprocess import MultiProcessTestCase
from ..fixtures.skips import (
    TEST_SKIPS,
    TestSkip,
    gpu_count_skip,
    skip_but_pass_in_sandcastle,
    skip_rank,
)
from ..fixtures.tempdirs import cleanup_temp_dir, initialize_temp_directories

# Address ranks rendezvous on; MASTER_PORT is left for each init method to choose.
MASTER_ADDR = "127.0.0.1"

# Process-group timeout per test (seconds), upstream's values.
default_pg_timeout = 60
CUSTOM_PG_TIMEOUT = {
    "test_ddp_uneven_inputs": 300,  # slow
    "test_ddp_model_diff_across_ranks": 5,  # expects a quick watchdog abort
    "test_ddp_has_finalized": 5,  # expects a quick watchdog abort
}

# Backends whose ranks each need a device of their own, and the device family.


@dataclass
class DistTestCases:
    """Which backend supports what: tests consult these sets to skip.

    Third-party backends add their name to ``backend_feature["plugin"]`` (and to
    the feature sets they support) so the suite treats them as available.
    """

    # Collectives a backend does not implement.
    skip_collective = {
        "allgather_coalesced": {"nccl", "mpi", "ucc", "xccl"},
        "reduce": set(),
        "sendrecv anysource": {"nccl", "ucc", "xccl"},
        "cpu barrier": {"nccl", "ucc", "xccl"},
    }
    # Features a backend does implement.
    backend_feature = {
        "gpu": {"nccl", "gloo", "ucc"},
        "cuda": {"nccl", "gloo", "ucc"},
        "ddp": {"nccl", "gloo", "ucc"},
        "subgroup": {"nccl", "gloo", "ucc"},
        "plugin": set(),
        "hpu": {"hccl"},
        "xpu": {"xccl"},
        # Beyond upstream's table, for distspawn's conformance suite:
        "avg": {"nccl", "gloo", "ucc", "xccl"},  # ReduceOp.AVG
        "bitwise": {"gloo", "mpi"},  # ReduceOp.BAND / BOR / BXOR on integers
        "complex": {"nccl", "gloo", "xccl"},
        "premul_sum": {"nccl"},
        "monitored_barrier": {"gloo"},
    }


# -- the environment contract -------------------------------------------------

BUILTIN_BACKENDS = ("gloo", "nccl", "ucc", "mpi")


class DistEnvError(RuntimeError):
    """BACKEND / WORLD_SIZE / TEMP_DIR are missing or invalid."""


@dataclass(frozen=True)
class DistEnv:
    """The validated run configuration."""

    backend: str
    world_size: int
    temp_dir: str
    init_method: str


def known_backends() -> list[str]:
    """Built-in backends, those registered with ``Backend.register_backend``, and plugins."""
    names = list(BUILTIN_BACKENDS)
    for name in list(dist.Backend.backend_list) + sorted(DistTestCases.backend_feature["plugin"]):
        if name not in names and name != "undefined":
            names.append(name)
    return names


def read_dist_env(allowed_backends: Any = None, min_world_size: int = 2,
                  program: str | None = None) -> DistEnv:
    """Read and check BACKEND, WORLD_SIZE and TEMP_DIR; one error lists every problem."""
    allowed = list(allowed_backends) if allowed_backends is not None else known_backends()
    problems = []
    backend = os.environ.get("BACKEND")
    if not backend:
        problems.append(f"BACKEND is not set; expected one of: {', '.join(allowed)}")
    elif backend not in allowed:
        problems.append(f"BACKEND={backend!r} is not a known backend; expected one of: "
                        f"{', '.join(allowed)}")
    raw_size = os.environ.get("WORLD_SIZE")
    world_size = 0
    if not raw_size:
        problems.append(f"WORLD_SIZE is not set; expected an integer >= {min_world_size}")
    else:
        try:
            world_size = int(raw_size)
        except ValueError:
            problems.append(f"WORLD_SIZE={raw_size!r} is not an integer; expected an "
                            f"integer >= {min_world_size}")
        else:
            if world_size < min_world_size:
                problems.append(f"WORLD_SIZE={raw_size!r} is too small; expected an "
                                f"integer >= {min_world_size}")
    temp_dir = os.environ.get("TEMP_DIR")
    if not temp_dir:
        problems.append("TEMP_DIR is not set; expected an existing directory")
    elif not os.path.isdir(temp_dir):
        problems.append(f"TEMP_DIR={temp_dir!r} is not an existing directory")
    if problems:
        program = program or os.path.basename(sys.argv[0] or "test_file.py")
        example = (f"BACKEND={allowed[0] if allowed else 'gloo'} WORLD_SIZE={max(2, min_world_size)} "
                   f"TEMP_DIR=$(mktemp -d) python {program}")
        raise DistEnvError(
            "the distributed backend suite is configured by environment variables, and "
            "these are missing or invalid:\n  " + "\n  ".join(problems)
            + f"\nFor example:\n  {example}")
    return DistEnv(backend, world_size, temp_dir, os.environ.get("INIT_METHOD", "env://"))


_AVAILABILITY_PROBES = {
    "gloo": dist.is_gloo_available,
    "nccl": dist.is_nccl_available,
    "mpi": dist.is_mpi_available,
    "ucc": dist.is_ucc_available,
}


def backend_is_available(backend: str) -> bool:
    """Whether this torch can create a process group with ``backend``."""
    if backend in _AVAILABILITY_PROBES:
        return _AVAILABILITY_PROBES[backend]()
    return backend in DistTestCases.backend_feature["plugin"] or (
        backend in dist.Backend.backend_list and backend != "undefined")


def _env_dependent_skip(env_key: str, reason_for: Callable[[], str | None]) -> Callable:
    """A skip decorator decided now if ``env_key`` is set, else when the test runs."""
    if env_key in os.environ:
        reason = reason_for()
        return skip_but_pass_in_sandcastle(reason) if reason else (lambda func: func)

    def decorator(func):
        @wraps(func)
        def wrapper(*args, **kwargs):
            reason = reason_for()
            if reason is None:
                return func(*args, **kwargs)
            if IS_SANDCASTLE:
                print(f"Skipping {func.__name__} on sandcastle: {reason}", file=sys.stderr)
                return None
            raise unittest.SkipTest(reason)

        return wrapper

    return decorator


def require_backend_is_available(backends: Any) -> Callable:
    """Skip unless BACKEND is one of ``backends`` and usable in this torch."""

    def reason() -> str | None:
        backend = os.environ.get("BACKEND")
        if backend not in backends:
            return f"Test requires backend {backend} to be one of {backends}"
        if not backend_is_available(backend):
            return f"Test requires backend {backend} to be available"
        return None

    return _env_dependent_skip("BACKEND", reason)


def require_backend_feature(feature: str) -> Callable:
    """Skip unless BACKEND is listed in ``DistTestCases.backend_feature[feature]``."""
    if feature not in DistTestCases.backend_feature:
        raise ValueError(f"unknown backend feature {feature!r}; expected one of: "
                         f"{', '.join(sorted(DistTestCases.backend_feature))}")

    def reason() -> str | None:
        backend = os.environ.get("BACKEND")
        if backend in DistTestCases.backend_feature[feature]:
            return None
        return (f"Test requires a backend with {feature} support; BACKEND={backend} is not "
                f"in DistTestCases.backend_feature[{feature!r}]")

    return _env_dependent_skip("BACKEND", reason)


def _world_size_reason(check: Callable[[int], bool], what: str) -> Callable[[], str | None]:
    def reason() -> str | None:
        raw = os.environ.get("WORLD_SIZE")
        try:
            size = int(raw)
        except (TypeError, ValueError):
            return f"Test requires {what}, and WORLD_SIZE={raw!r} is not an integer"
        return None if check(size) else f"Test requires {what}"

    return reason


def require_world_size(world_size: int) -> Callable:
    """Skip when WORLD_SIZE is below ``world_size``."""
    return _env_dependent_skip("WORLD_SIZE", _world_size_reason(
        lambda size: size >= world_size, f"world size of {world_size:d}"))


def require_exact_world_size(world_size: int) -> Callable:
    """Skip unless WORLD_SIZE equals ``world_size``."""
    return _env_dependent_skip("WORLD_SIZE", _world_size_reason(
        lambda size: size == world_size, f"an exact world size of {world_size:d}"))


# -- the test case --------------------------------------------------------------

def _device_count(family: str) -> int:
    module = getattr(torch, family, None)
    if module is None or not module.is_available():
        return 0
    return module.device_count()


def _unavailable_backend_error(error: RuntimeError) -> bool:
    text = str(error)
    return any(marker in text for marker in ("recompile", "built in", "not available", "not built"))


def _unavailable_message(detail: str) -> str:
    backend = os.environ.get("BACKEND")
    return f"{TEST_SKIPS['backend_unavailable'].message} BACKEND={backend}: {detail}"


class TestDistBackend(MultiProcessTestCase):
    """Runs each test on WORLD_SIZE ranks with a BACKEND process group already set up.

    Combine it with a suite: ``class T(TestDistBackend, Suite._DistTestBase)``,
    and start the ranks in ``setUp`` after ``super().setUp()``. Each rank
    initialises the group from a per-test ``file://`` store, meets the others at
    a barrier, runs the test, meets them again and destroys the group.
    """

    @classmethod
    def setUpClass(cls) -> None:
        read_dist_env()  # a misconfigured run fails here, with the reason, before any rank starts
        os.environ["MASTER_ADDR"] = MASTER_ADDR
        super().setUpClass()

    def setUp(self) -> None:
        backend = os.environ.get("BACKEND", "")
        if backend in _AVAILABILITY_PROBES and not backend_is_available(backend):
            # Known before any rank starts: say so without starting them.
            raise unittest.SkipTest(_unavailable_message(
                f"this torch was built without it (torch.distributed.is_{backend}_available() "
                "is False)"))
        super().setUp()
        initialize_temp_directories()
        self.addCleanup(cleanup_temp_dir)  # also when a later setUp step raises
        Barrier.init()
        # Expected to be taken down by async error handling: exit codes not judged.
        method = getattr(self, "test_ddp_has_finalized", None)
        if method is not None:
            self.skip_return_code_checks = [getattr(method, "__wrapped__", method)]

    def tearDown(self) -> None:
        cleanup_temp_dir()
        super().tearDown()

    @property
    def init_method(self) -> str:
        return f"{FILE_SCHEMA}{self.file_name}"

    @property
    def destroy_pg_upon_exit(self) -> bool:
        return False  # _run destroys the group itself, after the closing barrier

    @property
    def world_size(self) -> int:
        # An int, where upstream returns the raw string.
        return read_dist_env().world_size

    def _sync_ranks(self) -> None:
        barrier = getattr(self, "_barrier", None)
        if barrier is None:
            Barrier.sync()
            return
        upstream = upstream_barrier_class(type(self))
        if upstream is not None:
            sync_on_files(upstream)  # the same barrier, without its 0.1 s polls
        else:
            barrier()

    @classmethod
    def _run(cls, rank: int, test_name: str, file_name: str, pipe, **kwargs) -> None:
        backend = os.environ["BACKEND"]
        family = device_of_backend(backend)
        if backend == "nccl" and not cuda_available():
            skip_rank(TEST_SKIPS["no_cuda"])
        self = cls(test_name)
        self.rank = rank
        self.file_name = file_name
        world_size = self.world_size
        if family is not None and _device_count(family) < world_size:
            skip_rank(gpu_count_skip(world_size))
        pg_timeout = CUSTOM_PG_TIMEOUT.get(test_name, default_pg_timeout)
        try:
            dist.init_process_group(
                init_method=self.init_method,
                backend=backend,
                world_size=world_size,
                rank=rank,
                timeout=timedelta(seconds=pg_timeout),
            )
        except RuntimeError as error:
            if not _unavailable_backend_error(error):
                raise
            skip_rank(TestSkip(TEST_SKIPS["backend_unavailable"].exit_code,
                               _unavailable_message(str(error))))
        # Everyone is initialised before anyone can leave early (e.g. by skipping).
        self._sync_ranks()
        self.run_test(test_name, pipe)
        self._sync_ranks()
        dist.destroy_process_group()
        sys.exit(0)
