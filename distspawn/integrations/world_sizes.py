"""One test class, several world sizes.

The pytest plugin turns ``@pytest.mark.world_size(2, 4)`` (or a class's
``world_sizes = (2, 4)``) into one test item per size. Each item runs on a
*sized variant* of the class: a subclass whose only change is ``world_size``,
so every tier (processes, threads, reused workers) sees the size through the
attribute it already reads, in the test process and in every rank. A rank
finds the variant again from (module, qualified name, size), see
``cases.class_ref``.

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

_VARIANT_OF = "_distspawn_variant_of"  # set on a sized variant: the class it sizes
_VARIANTS = "_distspawn_variants"  # set on a sized class: {size: variant}


def sized_class(cls: type, world_size: int) -> type:
    """The variant of ``cls`` that runs on ``world_size`` ranks (made once, then reused)."""
    base = base_class(cls)
    variants = base.__dict__.get(_VARIANTS)
    if variants is None:
        variants = {}
        setattr(base, _VARIANTS, variants)
    variant = variants.get(world_size)
    if variant is None:
        # Same module and qualified name: test ids, rerun hints and upstream's
        # id-based lookups (timeouts, slow-test lists) stay those of the class.
        variant = type(base.__name__, (base,), {
            "world_size": world_size,
            _VARIANT_OF: base,
            "__module__": base.__module__,
            "__qualname__": base.__qualname__,
            "__doc__": base.__doc__,
        })
        variants[world_size] = variant
    return variant


def base_class(cls: type) -> type:
    """The class a sized variant was made from (``cls`` itself otherwise)."""
    return cls.__dict__.get(_VARIANT_OF, cls)


def variant_size(cls: type) -> int | None:
    """The world size a sized variant fixes, or None for an ordinary class."""
    return cls.__dict__["world_size"] if _VARIANT_OF in cls.__dict__ else None


def variants_of(cls: type) -> list[type]:
    """Every sized variant made from ``cls`` so far."""
    return list(cls.__dict__.get(_VARIANTS, {}).values())


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
