"""DTensor test bases: upstream's ``common_dtensor`` classes on distspawn's engine.

``DTensorTestBase`` runs each test on ``world_size`` rank processes (4 by
default), on the accelerator when there are enough devices and on CPU with
gloo otherwise; ``@with_comms`` gives the test a process group for its
duration. ``DTensorOpTestBase`` runs ranks as threads. Downstream suites
override ``init_pg`` / ``destroy_pg`` / ``backend`` / ``device_type``, so those
keep upstream's signatures and meaning.
"""

from __future__ import annotations

import sys
import threading
from functools import partial, wraps
from typing import Any, Callable, TypeVar

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.utils._pytree import tree_flatten, tree_unflatten

from ..engine.exit_codes import DEVICE_COUNT_KEY, TEST_SKIPS
from ..fixtures.accelerators import ACCELERATOR_DIST_BACKENDS
from ..fixtures.device_probe import accelerator_device_count, accelerator_type
from ..fixtures.dtensor_converter import DTensorConverter
from ..fixtures.helpers import run_subtests
from ..fixtures.skips import skip_if_lt_x_gpu
from .continuous import MultiProcContinuousTest
from .multiprocess import MultiProcessTestCase
from .threaded import MultiThreadedTestCase

__all__ = [
    "DEVICE_COUNT", "DEVICE_TYPE", "NUM_DEVICES", "PG_BACKEND", "DTensorContinuousTestBase",
    "DTensorTestMixin", "DTensorTestBase", "DTensorOpTestBase", "with_comms",
    "skip_unless_torch_gpu",
]

T = TypeVar("T")

# Upstream's module constants: the accelerator when one exists (its default
# backend), else CPU with gloo; tests use 4 ranks, fewer when fewer GPUs exist.
DEVICE_TYPE: str = accelerator_type() or "cpu"
DEVICE_COUNT: int = accelerator_device_count()
PG_BACKEND: str = (dist.Backend.default_device_backend_map.get(DEVICE_TYPE, "gloo")
                   if DEVICE_TYPE != "cpu" else "gloo")
NUM_DEVICES: int = 4
if torch.version.hip is not None:
    NUM_DEVICES = min(4, max(2, DEVICE_COUNT))
elif DEVICE_TYPE != "cpu" and DEVICE_COUNT > 1:
    NUM_DEVICES = min(NUM_DEVICES, DEVICE_COUNT)

# The backends init_pg accepts (upstream's list; anything else is a test bug).
_KNOWN_BACKENDS = ("nccl", "gloo", "mpi", "cpu:gloo,cuda:ncclx", "cuda:ncclx", "hccl",
                   "xccl", "fake", "cpu:gloo,xpu:xccl")


def skip_unless_torch_gpu(method: T) -> T:
    """Skip the test unless torch sees ``NUM_DEVICES`` GPUs (needs no WORLD_SIZE)."""
    return skip_if_lt_x_gpu(NUM_DEVICES)(method)


class DTensorTestMixin:
    """Helpers shared by the DTensor bases: the device, the mesh, op checks."""

    @property
    def is_local_tensor_enabled(self) -> bool:
        return False

    @property
    def device_type(self) -> str:
        """The accelerator when there is one per rank, else ``"cpu"``."""
        if DEVICE_TYPE == "cpu" or DEVICE_COUNT < self.world_size:
            return "cpu"
        return DEVICE_TYPE

    def build_device_mesh(self) -> DeviceMesh:
        """A 1-D mesh over every rank."""
        return init_device_mesh(self.device_type, (self.world_size,))

    def init_manual_seed_for_rank(self) -> None:
        torch.manual_seed(self.rank)

    def _test_op_on_dtensor(self, op_call: Callable, *args: Any, **kwargs: Any) -> None:
        """``op_call`` on DTensors gives, in full, what it gives on their full tensors."""
        from torch.distributed.tensor import DTensor

        def full(value: Any) -> Any:
            return value.full_tensor() if isinstance(value, DTensor) else value

        leaves, spec = tree_flatten(args)
        full_args = tree_unflatten(
            [full(v).detach().clone() if isinstance(v, DTensor) else v for v in leaves], spec)
        expected, _ = tree_flatten(op_call(*full_args, **{k: full(v) for k, v in kwargs.items()}))
        actual, _ = tree_flatten(op_call(*args, **kwargs))
        self.assertEqual(expected, [full(v) for v in actual])

    def _test_op(self, mesh: DeviceMesh, op_call: Callable, *args: Any, **kwargs: Any) -> None:
        """``op_call`` gives the same result for every sharding of its tensor arguments."""
        expected = op_call(*args, **kwargs)
        converter = DTensorConverter(mesh, args, kwargs)
        for d_args, d_kwargs in converter:
            self.assertEqual(converter.successful(), True)
            self.assertEqual(op_call(*d_args, **d_kwargs).full_tensor(), expected)

    def run_subtests(self, *args: Any, **kwargs: Any) -> None:
        return run_subtests(self, *args, **kwargs)


class DTensorTestBase(DTensorTestMixin, MultiProcessTestCase):
    """Each test on ``NUM_DEVICES`` rank processes; ``@with_comms`` brings the group."""

    @property
    def world_size(self) -> int:
        return NUM_DEVICES

    @property
    def backend(self) -> str:
        return dist.get_default_backend_for_device(self.device_type)

    def init_pg(self, eager_init: bool, backend: str | None = None) -> None:
        """Initialise the default group for this rank (``backend``: the device's)."""
        backend = self.backend if backend is None else backend
        needs_devices = any(name in backend for name in ACCELERATOR_DIST_BACKENDS)
        if needs_devices and accelerator_device_count() < self.world_size:
            sys.exit(TEST_SKIPS[f"{DEVICE_COUNT_KEY}-{self.world_size}"].exit_code)
        device_backend = dist.get_default_backend_for_device(self.device_type)
        known = (*_KNOWN_BACKENDS, f"cpu:gloo,{self.device_type}:{device_backend}")
        if backend not in known:
            raise RuntimeError(f"Backend {backend} not supported!")
        device_id = None
        if "nccl" in backend or "xccl" in backend:
            torch.accelerator.set_device_index(self.rank)
            # Eager init binds the communicator to the device now (subgroups can split it).
            device_id = torch.device(f"{self.device_type}:{self.rank}") if eager_init else None
        dist.init_process_group(backend=backend, world_size=self.world_size, rank=self.rank,
                                init_method=f"file://{self.file_name}", device_id=device_id)

    def destroy_pg(self, device_id: int | None = None) -> None:
        """Wait for every rank, then destroy the default group."""
        if self.device_type == "cpu":
            # Without device ids, barrier() would pick an accelerator if one exists.
            dist.barrier()
        else:
            if device_id is None:
                device_id = (torch.cuda.current_device() if self.device_type == "cuda"
                             else self.rank)
            dist.barrier(device_ids=[device_id])
        dist.destroy_process_group()

    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()


class DTensorContinuousTestBase(DTensorTestMixin, MultiProcContinuousTest):
    """The class's tests on one set of reused rank processes, sharing one group.

    Set ``world_size`` on the class. With an accelerator, each rank takes its
    own device and a world larger than the device count skips; on CPU the
    ranks use gloo.
    """

    @classmethod
    def backend_str(cls) -> str:
        return dist.get_default_backend_for_device(DEVICE_TYPE)

    @classmethod
    def _init_pg(cls, rank: int, world_size: int, rdvz_file: str | None) -> None:
        if DEVICE_TYPE != "cpu":
            if world_size > accelerator_device_count():
                sys.exit(TEST_SKIPS[f"{DEVICE_COUNT_KEY}-{world_size}"].exit_code)
            torch.accelerator.set_device_index(rank)  # before the group binds a device
        super()._init_pg(rank, world_size, rdvz_file)


TestFunc = Callable[..., object]


def with_comms(eager_init: TestFunc | bool = False, backend: str | None = None) -> TestFunc:
    """Run the test between ``self.init_pg(eager_init, backend)`` and ``self.destroy_pg()``.

    Usable bare (``@with_comms``) or with arguments
    (``@with_comms(eager_init=True, backend="gloo")``). On a class without
    ``init_pg`` (the threaded base) the test just runs. A test that raises
    destroys the group and re-raises, without waiting for the other ranks.
    """
    def decorate(func: TestFunc, eager_init: bool = False,
                 backend: str | None = None) -> TestFunc:
        @wraps(func)
        def wrapper(self, *args: Any, **kwargs: Any) -> None:
            if not hasattr(self, "init_pg"):
                func(self, *args, **kwargs)
                return
            self.init_pg(eager_init, backend)
            try:
                func(self, *args, **kwargs)
            except Exception:
                dist.destroy_process_group()
                raise
            self.destroy_pg()

        return wrapper

    if callable(eager_init):
        return decorate(eager_init)
    return partial(decorate, eager_init=eager_init, backend=backend)


class DTensorOpTestBase(MultiThreadedTestCase):
    """Each test on ``NUM_DEVICES`` rank threads (the threaded backend)."""

    @property
    def world_size(self) -> int:
        return NUM_DEVICES

    @property
    def device_type(self) -> str:
        return DEVICE_TYPE

    def build_device_mesh(self) -> DeviceMesh:
        return init_device_mesh(self.device_type, (self.world_size,))

    def setUp(self) -> None:
        super().setUp()
        # Sharding propagation keeps one fake mode; rank threads must take turns.
        # (Releases without that lock have no shared fake mode to guard.)
        propagator = _sharding_propagator()
        if hasattr(propagator, "_fake_mode_lock"):
            self.addCleanup(setattr, propagator, "_fake_mode_lock", propagator._fake_mode_lock)
            propagator._fake_mode_lock = threading.Lock()
        self._spawn_threads()


def _sharding_propagator() -> type:
    from torch.distributed.tensor._sharding_prop import ShardingPropagator

    return ShardingPropagator
