"""A world size of 0: a world with no rank to run the test on.

A class that sizes its world from the machine, such as torchtitan's FSDP tests
(``min(torch.cuda.device_count(), 4)``), gets 0 on a machine without GPUs.
Upstream's harness then starts no rank and passes the test without running
it (it only logs that no subprocess was spawned), on rank processes, rank
threads and reused ranks alike. distspawn skips such a test, saying why: a
pass would claim a check that never ran. The stand-in mode, which promises
upstream's verdicts for files run unchanged, passes it, with one warning per
class.
"""

from __future__ import annotations

import inspect
import unittest
import warnings
from typing import Any

from ..engine.capacity import validate_world_size, world_size_number

_warned: set[str] = set()


class EmptyWorldWarning(UserWarning):
    """A test passed without running: its world size is 0 (the stand-in mode)."""


def ranks_to_start(value: Any, owner: str, upstream_verdicts: bool) -> int:
    """How many ranks to start for ``owner`` (a class's ``world_size``) = ``value``.

    0 only where ``upstream_verdicts`` asks for upstream's pass; a world size
    of 0 otherwise skips the test. Anything else that is not an integer >= 1
    gets validate_world_size's error.
    """
    number = world_size_number(value)
    if number is not None and number < 1:
        if upstream_verdicts:
            if owner not in _warned:
                _warned.add(owner)
                warnings.warn(
                    f"{owner} is {value!r}: no rank was started and the test passed "
                    "without running, as on upstream's harness (with distspawn's "
                    "imports it is skipped)", EmptyWorldWarning, stacklevel=3)
            return 0
        if number == 0:
            raise unittest.SkipTest(
                f"{owner} is 0: there is no rank to run the test on (upstream's harness "
                "passes such a test without running it)")
    return validate_world_size(value, owner)


def warn_passed_unrun(test: object, ranks: str, starter: str) -> None:
    """Say that ``test`` passed without running its body, its ``ranks`` never
    started (its setUp never called ``starter``): the stand-in mode's pass,
    as upstream's harness gives; with distspawn's imports such a test fails."""
    warnings.warn(
        f"{test} passed without running its body: no {ranks} were started (its setUp "
        f"never called self.{starter}()). Upstream's harness passes such a test, so the "
        "stand-in mode does too; with distspawn's imports it fails.",
        UserWarning, stacklevel=3)


def declared_attribute(cls: type, name: str, default: Any = None) -> Any:
    """``cls.<name>`` as a test of the class reads it, asked without one (a
    property is asked on a bare instance)."""
    declared = inspect.getattr_static(cls, name, default)
    if isinstance(declared, property):
        return declared.fget(object.__new__(cls))
    return getattr(cls, name, default)


def declared_world_size(cls: type) -> Any:
    """``cls.world_size`` as a test of the class reads it (see declared_attribute)."""
    return declared_attribute(cls, "world_size")


def world_has_no_ranks(cls: type) -> bool:
    """Whether ``cls``'s world size, read before any test runs, is below 1.

    Whatever cannot be read here counts as ranks that start: the test itself
    will say what is wrong.
    """
    try:
        declared = declared_world_size(cls)
        resolve = getattr(cls, "_resolve_world_size", None)
        if declared == -2 and resolve is not None:
            # Reused ranks' "unset": one rank per device, as the class counts them.
            number = resolve()
        else:
            number = world_size_number(declared)
    except unittest.SkipTest:
        return True  # no device of the class's type: its tests skip
    except Exception:  # noqa: BLE001 - a device query, a missing attribute, ...
        return False
    return number is not None and number < 1
