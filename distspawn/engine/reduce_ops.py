"""Rank side: how each call that combines values combined them, kept as it is made.

Neither torch's flight recorder nor gloo compares the reduce op ranks pass:
an ``all_reduce`` with ``SUM`` on some ranks and ``MAX`` on others completes,
every rank holding a different result, and nothing waits for the stall judge
to see. So a rank keeps, for each call of torch.distributed's own functions
that take a reduce op, the group, the call's number on that group (the
recorder's number) and the op; the rank's report of its test carries them,
and the parent compares the ranks' records (``engine.stall``).

The functions are wrapped in place, in ``torch.distributed`` and in
``torch.distributed.distributed_c10d``, in the rank only, as it starts. A
reference taken earlier (``from torch.distributed import all_reduce`` in a
module the rank server preloaded) keeps the plain function: such calls go
unrecorded, on every rank alike, and since records are matched by group and
number a call missing from them is never mistaken for another. torch.compile
rewrites each wrapper as it rewrites the function (see :func:`install`), and
where it traces one, the wrapper only calls through.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections import deque
from typing import Any, Callable

# torch.distributed's functions that take a reduce op (``op``) and a group.
FUNCTIONS = ("all_reduce", "reduce", "reduce_scatter", "reduce_scatter_tensor",
             "all_reduce_coalesced")
# A rank keeps its first and its last calls (a training loop makes thousands).
KEEP_FIRST = 256
KEEP_LAST = 256

# (group name, group description, number, function, reduce op)
Record = tuple[str, str, int, str, str]
_first: list[Record] = []
_last: deque[Record] = deque(maxlen=KEEP_LAST)
_installed = False


def install() -> None:
    """Wrap the functions in this process (idempotent).

    Does nothing where torch.compile could tell the wrapper from the function:
    dynamo rewrites ``dist.all_reduce`` and friends into traceable collectives
    by looking each function up in a table, and a wrapper missing from it
    would be traced in a way the function is not (a ``ReduceOp`` it cannot
    turn into a string). Each wrapper goes into that table beside its function.
    """
    global _installed
    if _installed:
        return
    _installed = True
    try:
        import torch.compiler
        import torch.distributed as dist
        import torch.distributed._functional_collectives as funcol  # private: listed
        rewrites = funcol.traceable_collective_remaps  # private: listed
        is_compiling = torch.compiler.is_compiling
        c10d = dist.distributed_c10d
    except (ImportError, AttributeError):
        return  # nothing recorded: reduce ops are compared only where calls wait
    if not isinstance(rewrites, dict):
        return
    for name in FUNCTIONS:
        original = getattr(c10d, name, None)
        wrapped = _recording(original, is_compiling) if callable(original) else None
        if wrapped is None:
            continue
        if original in rewrites:
            rewrites[wrapped] = rewrites[original]
        setattr(c10d, name, wrapped)
        if getattr(dist, name, None) is original:
            setattr(dist, name, wrapped)


def _recording(original: Callable[..., Any],
               is_compiling: Callable[[], bool]) -> Callable[..., Any] | None:
    try:
        parameters = inspect.signature(original).parameters
        names = list(parameters)
        op_at, group_at = names.index("op"), names.index("group")
        default_op = parameters["op"].default
    except (TypeError, ValueError):
        return None  # not the shape this release had when written: leave it alone
    function = original.__name__

    @functools.wraps(original)
    def call(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        if not is_compiling():
            op = kwargs["op"] if "op" in kwargs else (
                args[op_at] if len(args) > op_at else default_op)
            group = kwargs["group"] if "group" in kwargs else (
                args[group_at] if len(args) > group_at else None)
            _record(function, group, op)
        return result

    return call


def _record(function: str, group: Any, op: Any) -> None:
    try:
        dist = sys.modules["torch.distributed"]
        if group is None:
            group = dist.group.WORLD
        name = dist.distributed_c10d._world.pg_names.get(group)  # private: listed
        if name is None:
            return  # not a member of the group: the call did nothing
        # Read after the call: the number the recorder gave it.
        number = int(group._get_sequence_number_for_group())  # private: listed
    except Exception:  # noqa: BLE001 - a record that cannot be made is left out
        return
    entry = (str(name), str(getattr(group, "group_desc", "")), number, function, op_name(op))
    if len(_first) < KEEP_FIRST:
        _first.append(entry)
    else:
        _last.append(entry)


def op_name(op: Any) -> str:
    """``SUM``, ``MAX``, ...: a ReduceOp, its RedOpType, or whatever was passed."""
    kind = getattr(op, "op", op)  # a ReduceOp instance holds its RedOpType
    name = getattr(kind, "name", None)
    return str(name if name is not None else kind).rsplit(".", 1)[-1]


def take() -> tuple[Record, ...]:
    """This rank's calls since the last take (the report of its test carries
    them; a reused worker's next test starts with none)."""
    taken = (*_first, *_last)
    _first.clear()
    _last.clear()
    return taken
