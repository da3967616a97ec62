"""One test class, several world sizes.

The pytest plugin turns ``@pytest.mark.world_size(2, 4)`` (or a class's
``world_sizes = (2, 4)``) into one test item per size. Each item runs on a
*sized variant* of the class (``cases.sized_variants``).

Sizes above what this machine can give are skipped with a reason, never run
oversubscribed by accident: ``DISTSPAWN_MAX_WORLD_SIZE`` sets the cap; by
default it is twice the usable CPUs (at least 4) for CPU ranks and the device
count for one-device-per-rank tests.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..engine.capacity import positive_int_from_env
from ..engine.rank_threads import usable_cpus

MAX_WORLD_SIZE_VAR = "DISTSPAWN_MAX_WORLD_SIZE"

def parse_world_sizes(values: Iterable[Any], where: str) -> list[int]:
    """Check a list of requested world sizes; a clear error names ``where``."""
    values = list(values)
    if not values:
        raise ValueError(f"{where}: give at least one world size, e.g. world_size(2, 4)")
    sizes = []
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(
                f"{where}: world sizes must be integers >= 1, got {value!r} in {values!r}")
        if value not in sizes:
            sizes.append(value)
    return sizes


def _device_count() -> int:
    from ..fixtures.device_probe import accelerator_device_count

    return accelerator_device_count()


def machine_max_world_size(per_device: bool = False) -> tuple[int, str]:
    """The largest world size this machine gives, and where that figure comes from."""
    configured = positive_int_from_env(MAX_WORLD_SIZE_VAR)
    if configured is not None:
        return configured, f"{MAX_WORLD_SIZE_VAR}={configured}"
    if per_device:
        count = _device_count()
        return count, f"{count} accelerator device(s), one per rank"
    cpus = usable_cpus()
    cap = max(4, 2 * cpus)
    return cap, f"{cpus} usable CPU(s): at most {cap} ranks; set {MAX_WORLD_SIZE_VAR} to change"
