"""Accelerator facts, computed only when first asked.

Probing a device at import would initialise its runtime in the parent, and a
process that has initialised CUDA can no longer fork ranks safely. So the
flags here are :class:`LazyFlag` objects: they behave as bools in ``if`` and
``skipIf`` but probe on first use.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as c10d

from .device_probe import has_accelerator
from .environment import TEST_WITH_ROCM
from .skips import skip_but_pass_in_sandcastle_if

ACCELERATOR_DIST_BACKENDS = ["nccl", "xccl", "hccl"]
DDP_RANK_DEVICES = ["cuda", "xpu"]


class LazyFlag:
    """A bool computed by ``probe`` the first time it is truth-tested or compared."""

    def __init__(self, probe: Callable[[], bool], name: str) -> None:
        self._probe = probe
        self._name = name
        self._value: bool | None = None

    def __bool__(self) -> bool:
        if self._value is None:
            self._value = bool(self._probe())
        return self._value

    def __eq__(self, other: object) -> bool:
        return bool(self) == other

    def __hash__(self) -> int:
        return hash(bool(self))

    def __repr__(self) -> str:
        state = "not yet probed" if self._value is None else str(self._value)
        return f"<{self._name}: {state}>"


HAS_ACCELERATOR = LazyFlag(has_accelerator, "HAS_ACCELERATOR")


def evaluate_platform_supports_symm_mem() -> bool:
    """True where symmetric memory can work: CUDA, or ROCm on MI300-class parts."""
    if not torch.cuda.is_available():
        return False
    if not TEST_WITH_ROCM:
        return True
    arch = getattr(torch.cuda.get_device_properties(0), "gcnArchName", "")
    return any(name in arch for name in ("gfx942", "gfx950"))


PLATFORM_SUPPORTS_SYMM_MEM = LazyFlag(
    evaluate_platform_supports_symm_mem, "PLATFORM_SUPPORTS_SYMM_MEM")


def _has_multicast_support() -> bool:
    if not torch.cuda.is_available():
        return False
    try:
        from torch._C._autograd import DeviceType
        from torch._C._distributed_c10d import _SymmetricMemory
    except ImportError:
        return False  # this torch has no symmetric memory: no multicast either
    return bool(_SymmetricMemory.has_multicast_support(DeviceType.CUDA, 0))


def requires_multicast_support() -> Callable:
    """Skip unless the GPU supports multicast (symmetric memory)."""
    return skip_but_pass_in_sandcastle_if(
        not _has_multicast_support(), "multicast support is not available")


# torchcomms is an optional add-on; these say which of its backends are built.
TORCHCOMM_HAS_GLOO = False
TORCHCOMM_HAS_XCCL = False
TORCHCOMM_HAS_NCCL = False
TORCHCOMM_HAS_RCCL = False
TORCHCOMM_HAS_NCCLX = False
TORCHCOMM_HAS_RCCLX = False


def _probe_torchcomms() -> None:
    from torch.distributed import distributed_c10d

    if not getattr(distributed_c10d, "_TORCHCOMM_AVAILABLE", False):
        return
    import torchcomms

    for backend in ("gloo", "xccl", "nccl", "rccl", "rcclx", "ncclx"):
        if torchcomms.is_backend_built(backend):
            globals()[f"TORCHCOMM_HAS_{backend.upper()}"] = True


_probe_torchcomms()


def setup_torchcomms_pg(
    backend: str,
    rank: int,
    world_size: int,
    device: torch.device,
    store_path: str,
    group_name: str,
) -> Any:
    """A ProcessGroup backed by a torchcomms communicator of ``backend``.

    The group is registered under ``group_name`` (which must be unique in the
    process, as must ``store_path``) so name-based lookups find it.
    """
    from torch.distributed import distributed_c10d

    if not getattr(distributed_c10d, "_TORCHCOMM_AVAILABLE", False):
        raise RuntimeError(
            "setup_torchcomms_pg needs torchcomms, which this torch cannot use "
            "(torch.distributed.distributed_c10d._TORCHCOMM_AVAILABLE is False)"
        )
    import torchcomms
    from torch.distributed.distributed_c10d import _BackendWrapper, _register_pg_in_world

    os.environ.update(TORCHCOMM_RANK=str(rank), TORCHCOMM_SIZE=str(world_size))
    shared = c10d.FileStore(store_path, world_size)

    def scoped(suffix: str) -> Any:
        return c10d.PrefixStore(f"{group_name}_{suffix}/", shared)

    options = {"name": f"{group_name}_comm", "store": scoped("tc"),
               "hints": {"persistent_store": "true"}}
    comm = torchcomms.new_comm(backend, device, **options)
    group = c10d.ProcessGroup(scoped("pg"), comm.get_rank(), comm.get_size())
    as_nccl = c10d.ProcessGroup.BackendType.NCCL
    group._register_backend(comm.get_device(), as_nccl, _BackendWrapper(comm))
    # Registering a backend does not make it the default one, and some setters need that.
    group._set_default_backend(as_nccl)
    group._set_group_name(group_name)
    identity = {r: r for r in range(world_size)}
    _register_pg_in_world(group, backend_name=backend, store=shared, group_name=group_name,
                          backend_config=backend, rank_mapping=identity)
    return group
