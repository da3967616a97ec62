"""What the conformance tests share: the groups they run on and per-rank values."""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass
from functools import wraps
from typing import Any, Callable

import torch
import torch.distributed as dist

from ..cases.dist_backend import DistTestCases

# Where a collective runs: the default group, a new group of every rank, and a
# group of every rank but rank 0 (so rank 0 checks that a non-member's call
# does nothing and returns None).
GROUP_KINDS = ("world", "full", "subgroup")


@dataclass
class Placement:
    members: list[int]  # global ranks in the group, in group-rank order
    group: Any
    rank: int  # this process's global rank

    @property
    def member(self) -> bool:
        return self.rank in self.members

    @property
    def group_rank(self) -> int:
        return self.members.index(self.rank)

    @property
    def size(self) -> int:
        return len(self.members)


def place(kind: str) -> Placement:
    """Make (collectively: every rank calls this) the group ``kind`` names."""
    world, rank = dist.get_world_size(), dist.get_rank()
    if kind == "world":
        return Placement(list(range(world)), dist.group.WORLD, rank)
    if kind == "full":
        return Placement(list(range(world)), dist.new_group(list(range(world))), rank)
    if kind == "subgroup":
        members = list(range(1, world))
        return Placement(members, dist.new_group(members), rank)
    raise ValueError(f"unknown group kind {kind!r}; expected one of {GROUP_KINDS}")


def backend() -> str:
    return os.environ.get("BACKEND", "")


def supports(feature: str) -> bool:
    return backend() in DistTestCases.backend_feature.get(feature, set())


def lacks_collective(name: str) -> bool:
    return backend() in DistTestCases.skip_collective.get(name, set())


def value_of(rank: int) -> float:
    """What rank ``rank`` contributes (never 0, so products stay informative)."""
    return float(rank + 1)


def finish(work: Any, async_op: bool, placement: Placement) -> None:
    """Wait for an async op; a non-member must get None back instead of a Work."""
    if not placement.member:
        if work is not None:
            raise AssertionError(f"a non-member of the group got {work!r} back, expected None")
        return
    if async_op:
        if work is None:
            raise AssertionError("async_op=True returned None on a member of the group")
        work.wait()


def generated(namespace: dict, name: str, *decorators: Callable) -> Callable:
    """Add the decorated function to ``namespace`` as test ``name``."""

    def add(func: Callable) -> Callable:
        func.__name__ = func.__qualname__ = name
        for decorator in reversed(decorators):
            func = decorator(func)
        namespace[name] = func
        return func

    return add


def on_placement(kind: str) -> Callable:
    """Give a test body the Placement of ``kind`` (made on every rank) as an argument."""

    def decorator(body: Callable) -> Callable:
        @wraps(body)
        def test(self: Any) -> None:
            body(self, place(kind))

        return test

    return decorator


def full(value: float, dtype: torch.dtype = torch.float32, size: int = 3) -> torch.Tensor:
    return torch.full((size,), value, dtype=dtype)


# How backends say they lack an op or a dtype (gloo: "Backend gloo does not
# support alltoall" before it had one; "Invalid scalar type" for complex
# tensors on torch 2.8).
_LACKS = re.compile(r"does not support|not supported|unsupported|invalid scalar type", re.I)


@contextlib.contextmanager
def skip_if_backend_lacks(test: Any, op: str, dtype: torch.dtype | None = None):
    """Run the block; where the backend says it lacks ``op`` (for ``dtype``), every
    rank skips the test, naming the backend, the op and the torch release.

    A backend refuses such a call before any data moves; the ranks then agree
    on the default group (a rank outside the op's group learns it there too),
    so that all skip alike. Anything else raised, or a wrong result, still
    fails.
    """
    refused = ""
    try:
        yield
    except (RuntimeError, NotImplementedError, ValueError, TypeError) as error:
        if not _LACKS.search(str(error)):
            raise
        refused = str(error).strip().splitlines()[0][:200]
    anyone = torch.tensor([1 if refused else 0])
    dist.all_reduce(anyone, op=dist.ReduceOp.MAX)
    if anyone.item():
        what = op if dtype is None else f"{op} on {str(dtype).split('.')[-1]}"
        test.skipTest(f"BACKEND={backend()} on torch {torch.__version__} cannot do {what}"
                      + (f": {refused}" if refused else " (another rank was refused)"))
