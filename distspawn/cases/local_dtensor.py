"""DTensor bases that run every rank in one process, under torch's LocalTensorMode.

``LocalDTensorTestBase`` (the process base's shape) and
``LocalDTensorOpTestBase`` (the thread base's) start no ranks: the test body
runs once, in the test process, on the ``fake`` backend, and inside
``self._get_local_tensor_mode()`` each tensor holds one value per rank, so a
single run checks what ``world_size`` ranks would compute. ``self.rank`` is a
symbolic integer standing for every rank at once. ``create_local_tensor_test_class``
turns an existing DTensor test class into one that runs this way.

LocalTensorMode is private torch API (``torch.distributed._local_tensor``);
where this torch lacks it, these tests skip and say so.
"""

from __future__ import annotations

import contextlib
import functools
import types
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from ..backends.fake_backend import FakeStore, register_fake_backend
from .dtensor import NUM_DEVICES, DTensorContinuousTestBase, DTensorOpTestBase, DTensorTestBase
from .empty_world import declared_attribute

__all__ = ["LocalDTensorContinuousTestBase", "LocalDTensorOpTestBase", "LocalDTensorTestBase",
           "create_local_tensor_test_class",
           "make_wrapped", "map_local_for_rank", "map_local_tensor_for_rank",
           "reduce_local_int"]


def _local_tensor() -> Any:
    try:
        from torch.distributed import _local_tensor  # private: listed in distspawn.private_apis
    except ImportError:
        return None
    return _local_tensor


def _require_local_tensor(test: Any) -> Any:
    module = _local_tensor()
    if module is None:
        test.skipTest("this torch has no torch.distributed._local_tensor (LocalTensorMode)")
    return module


class _AllRanksInThisProcess:
    """What both local bases share: no rank processes or threads, one fake group."""

    @property
    def is_local_tensor_enabled(self) -> bool:
        return True

    def _handle_test_skip(self, msg: str) -> None:
        # A skip decorator that would make a rank exit skips the whole test here.
        self.skipTest(msg)

    def _get_local_tensor_mode(self) -> Any:
        return _require_local_tensor(self).LocalTensorMode(frozenset(range(self.world_size)))

    @property
    def rank(self) -> Any:
        module = _require_local_tensor(self)
        return torch.SymInt(module.LocalIntNode({r: r for r in range(self.world_size)}))

    @rank.setter
    def rank(self, value: Any) -> None:
        pass  # every rank at once: the harness has no single rank to give

    def join_or_run(self, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def run_here(self: Any) -> None:
            fn()

        return types.MethodType(run_here, self)

    def build_device_mesh(self) -> DeviceMesh:
        module = _require_local_tensor(self)
        with module.maybe_disable_local_tensor_mode():
            return super().build_device_mesh()  # type: ignore[misc]

    def _spawn_processes(self) -> None:
        pass

    def _spawn_threads(self) -> None:
        pass

    def run_test(self, test_name: str, parent_pipe: Any = None) -> None:
        getattr(self, test_name)()

    def init_manual_seed_for_rank(self) -> None:
        torch.manual_seed(0)  # one generator serves every rank

    def setUp(self) -> None:
        super().setUp()  # type: ignore[misc]
        _require_local_tensor(self)
        # Profiler ranges are per process; with every rank in one, turn them off.
        toggle = getattr(torch.autograd, "_enable_record_function", None)  # private: listed
        if toggle is not None:
            toggle(False)
            self.addCleanup(toggle, True)
        self.addCleanup(_forget_dtensor_rng_tracker)


def runs_every_rank_here(cls: Any) -> bool:
    """Whether ``cls``'s tests run every rank in the test process (LocalTensorMode),
    so that none starts a rank process.

    True of the local bases, distspawn's and upstream's (the stand-in mode
    keeps upstream's, built on distspawn's classes), and of their subclasses,
    such as the classes ``create_local_tensor_test_class`` makes: each says so
    by its ``is_local_tensor_enabled``, read here as a test would. Anything that
    cannot be read counts as ranks that start.
    """
    if not isinstance(cls, type):
        return False
    try:
        return declared_attribute(cls, "is_local_tensor_enabled", False) is True
    except Exception:  # noqa: BLE001 - a property that needs a set-up test
        return False


def _start_fake_group(world_size: int) -> None:
    register_fake_backend()
    dist.init_process_group("fake", rank=0, world_size=world_size, store=FakeStore())


class _FakeGroupPerTest:
    """``@with_comms`` brings a ``fake`` group, this process being rank 0."""

    def init_pg(self, eager_init: bool, backend: str | None = None) -> None:
        _start_fake_group(self.world_size)
        self._pg = dist.group.WORLD

    def destroy_pg(self, device_id: int | None = None) -> None:
        dist.destroy_process_group(self._pg)
        self._pg = None


def _forget_dtensor_rng_tracker() -> None:
    # The tracker remembers the mesh it was seeded for; the next test's differs.
    with contextlib.suppress(ImportError, AttributeError):
        from torch.distributed.tensor import _random  # private: listed in distspawn.private_apis

        _random._rng_tracker = None


class LocalDTensorTestBase(_AllRanksInThisProcess, _FakeGroupPerTest, DTensorTestBase):
    """:class:`~distspawn.dtensor.DTensorTestBase`'s tests with every rank in the
    test process (LocalTensorMode); ``@with_comms`` brings a ``fake`` group."""


class LocalDTensorOpTestBase(_AllRanksInThisProcess, _FakeGroupPerTest, DTensorOpTestBase):
    """:class:`~distspawn.dtensor.DTensorOpTestBase`'s tests with every rank in the
    test process (LocalTensorMode) instead of one thread per rank."""


class LocalDTensorContinuousTestBase(_AllRanksInThisProcess, DTensorContinuousTestBase):
    """:class:`~distspawn.dtensor.DTensorContinuousTestBase`'s tests with every
    rank in the test process (LocalTensorMode): one ``fake`` group serves the
    whole class (``world_size`` unset: ``NUM_DEVICES``)."""

    def setUp(self) -> None:
        super().setUp()
        cls = type(self)
        if cls.world_size == -2:
            cls.world_size = NUM_DEVICES
        if not dist.is_initialized():
            _start_fake_group(cls.world_size)
            cls._local_fake_group = True

    @classmethod
    def tearDownClass(cls) -> None:
        if cls.__dict__.get("_local_fake_group") and dist.is_initialized():
            dist.destroy_process_group()
            cls._local_fake_group = False
        super().tearDownClass()


def make_wrapped(fn: Callable, ctxs: list) -> Callable:
    """``fn(self)`` inside each of ``ctxs`` (a context manager, or a callable
    taking the test and giving one), with dynamo reset first."""
    @functools.wraps(fn)
    def wrapped(self: Any) -> Any:
        from ..fixtures.helpers import reset_dynamo

        reset_dynamo()
        with contextlib.ExitStack() as stack:
            for ctx in ctxs:
                stack.enter_context(ctx(self) if callable(ctx) else ctx)
            return fn(self)

    return wrapped


def create_local_tensor_test_class(orig_cls: type, skipped_tests: list[str] | None = None,
                                   base_class: type = LocalDTensorTestBase) -> type:
    """A copy of ``orig_cls`` (named ``<name>WithLocalTensor``) whose tests run
    on ``base_class`` inside LocalTensorMode; tests named in ``skipped_tests`` skip."""
    skipped = set(skipped_tests or ())
    namespace = dict(orig_cls.__dict__)
    for name, value in list(namespace.items()):
        if not callable(value):
            continue
        if name in skipped:
            namespace[name] = lambda self: self.skipTest("Skipped test")
        elif name.startswith("test_"):
            namespace[name] = make_wrapped(value, [lambda test: test._get_local_tensor_mode()])
    namespace.pop("__dict__", None)
    namespace.pop("__weakref__", None)
    return type(f"{orig_cls.__name__}WithLocalTensor", (base_class, *orig_cls.__bases__),
                namespace)


def map_local_tensor_for_rank(tensor: Any, rank: Any, func: Callable) -> Any:
    """``func(tensor, rank)`` for each rank's value when they are local tensors."""
    return _per_rank(func)(tensor, rank)


def map_local_for_rank(rank: Any, func: Callable) -> Any:
    """``func(rank)`` for each rank's value of a local ``rank``."""
    return _per_rank(func)(rank)


def _per_rank(func: Callable) -> Callable:
    module = _local_tensor()
    if module is None:
        return func
    return module.maybe_run_for_local_tensor(func)


def reduce_local_int(val: Any, func: Callable) -> Any:
    """``func`` over the per-rank values of a local integer (e.g. ``max``)."""
    return func(val.node._local_ints)
