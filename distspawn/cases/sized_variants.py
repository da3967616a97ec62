"""Sized variants: one test class run at several world sizes.

A sized variant is a subclass whose only change is ``world_size``, so every
tier (processes, threads, reused workers) sees the size through the attribute
it already reads, in the test process and in every rank. A rank finds the
variant again from (module, qualified name, size), see ``cases.class_ref``.
The pytest plugin makes them (``integrations.world_sizes``).
"""

from __future__ import annotations

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
