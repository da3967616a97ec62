"""FSDP test bases: upstream's ``common_fsdp`` classes on distspawn's engine.

Upstream's ``FSDPTest`` needs one accelerator per rank and skips everywhere
else ("Need at least 1 CUDA device"), even for tests that need no GPU. Here,
on a machine without an accelerator, FSDP tests run on CPU with gloo at
``DEVICE_COUNT = 2`` ranks; only a test that really needs devices (it says so
with ``skip_if_lt_x_gpu``, or uses a backend that needs them) skips.
"""

from __future__ import annotations

import contextlib
import os
import sys
import unittest
import warnings
from functools import wraps
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist

from ..engine import releases
from ..engine.exit_codes import DEVICE_COUNT_KEY, TEST_SKIPS
from ..fixtures.accelerators import ACCELERATOR_DIST_BACKENDS
from ..fixtures.device_probe import accelerator_device_count
from ..fixtures.environment import FILE_SCHEMA, restore_environ
from ..fixtures.fsdp_device import (
    DEVICE_COUNT,
    DEVICE_TYPE,
    DISTRIBUTED_BACKEND,
    accelerator_missing_in,
    get_devtype,
)
from ..fixtures.helpers import reset_dynamo, run_subtests
from ..fixtures.skips import gpu_count_skip
from .continuous import MultiProcContinuousTest
from .fsdp_parity import FSDPParityMixin
from .multiprocess import MultiProcessTestCase
from .testcase import set_rng_seed
from .threaded import MultiThreadedTestCase

__all__ = [
    "DEVICE_COUNT", "DEVICE_TYPE", "DISTRIBUTED_BACKEND", "FSDPTest", "FSDPTestContinuous",
    "FSDPTestMixin", "FSDPTestMultiThread", "compiled_fsdp_test", "get_devtype", "patch_all_gather", "patch_all_reduce",
    "patch_foreach_all_gather", "patch_foreach_reduce", "patch_post_backward",
    "patch_reduce_scatter", "patch_register_post_backward_hook_backward", "patch_reshard",
    "patch_unshard",
]


class FSDPTestMixin(FSDPParityMixin):
    """Helpers shared by the FSDP bases (the FSDP1 parity checks among them)."""

    def run_subtests(self, *args: Any, **kwargs: Any) -> None:
        return run_subtests(self, *args, **kwargs)

    def join_or_run(self, fn: Callable) -> Callable:
        if DEVICE_TYPE == "cpu":
            fn = _skip_if_it_needs_an_accelerator(fn, self)
        return super().join_or_run(fn)


def _skip_if_it_needs_an_accelerator(fn: Callable, test: Any) -> Callable:
    """On the CPU fallback, a test that turns out to need an accelerator (FSDP1
    without ``device_id``, CPU offload's pinned memory, a ``torch.cuda`` call)
    skips, as it would on upstream's harness, saying what it reached for."""

    @wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (RuntimeError, AssertionError, ValueError) as error:
            need = accelerator_missing_in(error)
            if need is None:
                raise
            prefix = gpu_count_skip(test.world_size).message
            raise unittest.SkipTest(
                f"{prefix} (the test needs an accelerator, and this machine has none: "
                f"{need})") from None

    return run


class FSDPTest(FSDPTestMixin, MultiProcessTestCase):
    """Each test on ``DEVICE_COUNT`` rank processes with the default group
    initialised (``DISTRIBUTED_BACKEND``), torch seeded and dynamo reset."""

    def setUp(self) -> None:
        super().setUp()
        # NCCL's desync-debug cleanup thread makes tests flaky; ranks inherit this.
        self.addCleanup(restore_environ,
                        {"TORCH_NCCL_DESYNC_DEBUG": os.environ.get("TORCH_NCCL_DESYNC_DEBUG")})
        os.environ["TORCH_NCCL_DESYNC_DEBUG"] = "0"
        self._spawn_processes()

    @property
    def world_size(self) -> int:
        return DEVICE_COUNT

    @property
    def process_group(self) -> dist.ProcessGroup:
        return dist.group.WORLD

    @property
    def destroy_pg_upon_exit(self) -> bool:
        return False  # _run destroys it, after the closing barrier

    @property
    def init_method(self) -> str:
        return f"{FILE_SCHEMA}{self.file_name}"

    @classmethod
    def _run(cls, rank: int, test_name: str, file_name: str, pipe: Any, **kwargs: Any) -> None:
        self = cls(test_name)
        self.rank = rank
        self.file_name = file_name
        needs_devices = any(name in DISTRIBUTED_BACKEND for name in ACCELERATOR_DIST_BACKENDS)
        if needs_devices and accelerator_device_count() < self.world_size:
            sys.exit(TEST_SKIPS[f"{DEVICE_COUNT_KEY}-{self.world_size}"].exit_code)
        if kwargs.get("fake_pg", False):
            from ..backends.fake_backend import FakeStore, register_fake_backend

            register_fake_backend()
            dist.init_process_group("fake", world_size=self.world_size, rank=rank,
                                    store=FakeStore())
        else:
            dist.init_process_group(init_method=self.init_method, backend=DISTRIBUTED_BACKEND,
                                    world_size=int(self.world_size), rank=rank)
        device_ids = None
        if DEVICE_TYPE != "cpu":
            device_ids = [rank % accelerator_device_count()]
            torch.accelerator.set_device_index(device_ids[0])
        # Every rank is up before any test body (a fast skip must not race a slow start).
        dist.barrier(device_ids=device_ids)
        reset_dynamo()
        set_rng_seed()
        self.run_test(test_name, pipe)
        reset_dynamo()
        dist.barrier(device_ids=device_ids)
        dist.destroy_process_group()


class FSDPTestContinuous(FSDPTestMixin, MultiProcContinuousTest):
    """The class's tests on one set of reused rank processes (``DEVICE_COUNT``
    of them, sharing one group): much faster than :class:`FSDPTest` for tests
    that leave no state behind. On CPU, gloo."""

    world_size: int = DEVICE_COUNT

    @classmethod
    def backend_str(cls) -> str:
        return DISTRIBUTED_BACKEND

    @classmethod
    def device_type(cls) -> str:
        return DEVICE_TYPE

    @classmethod
    def _init_pg(cls, rank: int, world_size: int, rdvz_file: str | None) -> None:
        os.environ["TORCH_NCCL_DESYNC_DEBUG"] = "0"  # see FSDPTest.setUp
        if DEVICE_TYPE != "cpu":
            if accelerator_device_count() < world_size:
                sys.exit(TEST_SKIPS[f"{DEVICE_COUNT_KEY}-{world_size}"].exit_code)
            torch.accelerator.set_device_index(rank % accelerator_device_count())
        super()._init_pg(rank, world_size, rdvz_file)

    def setUp(self) -> None:
        super().setUp()
        if self.rank != self.MAIN_PROCESS_RANK:  # run_rank(): ranks start each test together
            dist.barrier()
        reset_dynamo()
        set_rng_seed()

    def tearDown(self) -> None:
        if self.rank != self.MAIN_PROCESS_RANK:  # ... and finish it together
            dist.barrier()
        super().tearDown()
        reset_dynamo()

    @property
    def process_group(self) -> dist.ProcessGroup:
        """The class's group, shared by its tests on these ranks."""
        group = getattr(type(self), "pg", None)
        return group if group is not None else dist.group.WORLD


def compiled_fsdp_test(compile_compute_on_module: type | None = None) -> Callable:
    """Run the test twice: with ``fully_shard`` as it is, then with the compute of
    every module it shards compiled (only modules of ``compile_compute_on_module``
    when given). The test must use ``fully_shard`` as a global of its module
    (``from torch.distributed.fsdp import fully_shard``): that name is what
    changes. Without Triton the compiled run is left out, with a warning.
    """
    def decorator(func: Callable) -> Callable:
        @wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> None:
            from torch.distributed.fsdp import fully_shard as eager_fully_shard

            def fully_shard_and_compile(module: Any, *more: Any, **options: Any) -> Any:
                sharded = eager_fully_shard(module, *more, **options)
                if compile_compute_on_module is None or isinstance(
                        module, compile_compute_on_module):
                    module.compile()
                return sharded

            name = eager_fully_shard.__name__
            for compiled in (False, True):
                if compiled and not _inductor_has_triton():
                    warnings.warn("Inductor on GPU needs Triton and recent GPU arch",
                                  stacklevel=2)
                    continue
                with _fully_shard_in(func, name,
                                     fully_shard_and_compile if compiled else eager_fully_shard,
                                     single_compile_thread=compiled):
                    func(*args, **kwargs)

        return wrapper

    return decorator


@contextlib.contextmanager
def _fully_shard_in(func: Callable, name: str, replacement: Callable,
                    single_compile_thread: bool) -> Iterator[None]:
    # Barriers: rank threads share the module's globals; each must see the
    # same fully_shard for the whole run of the test body.
    had = name in func.__globals__
    original = func.__globals__.get(name)
    config = None
    if single_compile_thread:
        import torch._inductor.config as config  # private: listed in distspawn.private_apis

        saved_threads = config.compile_threads
    dist.barrier()
    func.__globals__[name] = replacement
    if config is not None:
        config.compile_threads = 1
    try:
        yield
    finally:
        dist.barrier()
        if had:
            func.__globals__[name] = original
        else:
            func.__globals__.pop(name, None)
        if config is not None:
            config.compile_threads = saved_threads


def _inductor_has_triton() -> bool:
    try:
        from torch.utils._triton import has_triton  # private: listed in distspawn.private_apis
    except ImportError:
        return False
    return bool(has_triton())


class FSDPTestMultiThread(MultiThreadedTestCase):
    """Each test on ``DEVICE_COUNT`` rank threads (the threaded backend)."""

    @property
    def world_size(self) -> int:
        return DEVICE_COUNT

    def setUp(self) -> None:
        super().setUp()
        self._spawn_threads()

    def run_subtests(self, *args: Any, **kwargs: Any) -> None:
        return run_subtests(self, *args, **kwargs)

    def perThreadSetUp(self) -> None:  # noqa: N802 - upstream's name
        reset_dynamo()

    def perThreadTearDown(self) -> None:  # noqa: N802 - upstream's name
        reset_dynamo()


# -- patching what FSDP calls ---------------------------------------------------


@contextlib.contextmanager
def _patched(owner: Any, name: str, replacement: Callable) -> Iterator[None]:
    # Barriers on both sides: on rank threads, every rank must read the same
    # original and use the replacement for the whole block.
    original = getattr(owner, name)
    dist.barrier()
    setattr(owner, name, replacement)
    try:
        yield
    finally:
        dist.barrier()
        setattr(owner, name, original)


def _param_group_module() -> Any:
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group

    return _fsdp_param_group


def patch_all_gather(new_all_gather_into_tensor: Callable):
    """Within the block, the all-gather FSDP calls (``dist.all_gather_single``;
    ``all_gather_into_tensor`` on torch 2.8) is the given one."""
    return _patched(dist, releases.fsdp_calls("all_gather"), new_all_gather_into_tensor)


def patch_reduce_scatter(new_reduce_scatter_tensor: Callable):
    """Within the block, the reduce-scatter FSDP calls (``dist.reduce_scatter_single``;
    ``reduce_scatter_tensor`` on torch 2.8) is the given one."""
    return _patched(dist, releases.fsdp_calls("reduce_scatter"), new_reduce_scatter_tensor)


def patch_all_reduce(new_all_reduce: Callable):
    """Within the block, ``dist.all_reduce`` is the given one."""
    return _patched(dist, "all_reduce", new_all_reduce)


def patch_foreach_all_gather(new_foreach_all_gather: Callable):
    """Within the block, FSDP2's parameter groups all-gather with the given function."""
    return _patched(_param_group_module(), "foreach_all_gather", new_foreach_all_gather)


def patch_foreach_reduce(new_foreach_reduce: Callable):
    """Within the block, FSDP2's parameter groups reduce with the given function."""
    return _patched(_param_group_module(), "foreach_reduce", new_foreach_reduce)


def patch_unshard(new_unshard: Callable):
    """Within the block, ``FSDPParamGroup.unshard`` is the given method."""
    return _patched(_param_group_module().FSDPParamGroup, "unshard", new_unshard)


def patch_reshard(new_reshard: Callable):
    """Within the block, ``FSDPParamGroup.reshard`` is the given method."""
    return _patched(_param_group_module().FSDPParamGroup, "reshard", new_reshard)


def patch_post_backward(new_post_backward: Callable):
    """Within the block, ``FSDPParamGroup.post_backward`` is the given method."""
    return _patched(_param_group_module().FSDPParamGroup, "post_backward", new_post_backward)


def patch_register_post_backward_hook_backward(new_backward: Callable):
    """Within the block, FSDP2's post-backward autograd function runs ``new_backward``."""
    return _patched(_param_group_module().RegisterPostBackwardFunction, "backward",
                    new_backward)
