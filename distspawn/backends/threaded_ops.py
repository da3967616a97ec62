"""What each collective of the threaded backend does to the ranks' tensors.

Pure data movement, with no threads or waiting: the rendezvous in
``threaded_pg`` gathers one :class:`Call` per rank of a group and, once all
have arrived and agree, hands their payloads (ordered by group rank) to the
call's ``execute``. A payload shape that cannot work raises
:class:`Incompatible` with a message about the ranks' tensors.

Tensor writes go through ``.detach()``: c10d's signatures do not declare that
collectives mutate their outputs, so autograd must not see the copy.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch.distributed import ReduceOp

__all__ = ["Call", "Incompatible", "op_name", "reduce_tensors", "tensor_summary"]


class Incompatible(ValueError):
    """The ranks' tensors cannot take part in one collective together."""


@dataclass
class Call:
    """One rank's side of a collective.

    ``params`` must be equal on every rank (root, reduce op, split sizes
    where they matter); so must the tensors' dtypes and shapes when
    ``strict_tensors`` is set. ``tensors`` is what the call describes itself
    with; its text is only built for messages.
    """

    kind: str
    params: tuple[tuple[str, Any], ...]
    tensors: Any
    payload: Any
    execute: Callable[[list[Any]], None]
    strict_tensors: bool = True

    def match_key(self) -> tuple:
        shapes = tensor_signature(self.tensors) if self.strict_tensors else None
        return (self.kind, self.params, shapes)

    def describe(self) -> str:
        parts = [f"{name}={value}" for name, value in self.params]
        summary = tensor_summary(self.tensors)
        if summary and summary != "[]":
            parts.append(summary)
        return f"{self.kind}({', '.join(parts)})"


# -- describing tensors and ops ---------------------------------------------

def _one_tensor(t: torch.Tensor) -> str:
    dtype = str(t.dtype).replace("torch.", "")
    device = "" if t.device.type == "cpu" else f"@{t.device}"
    return f"{dtype}[{', '.join(map(str, t.shape))}]{device}"


def tensor_summary(value: Any) -> str:
    """``float32[4]``, ``[float32[2], int64[3]]``: tensors, nested lists of them."""
    if isinstance(value, torch.Tensor):
        return _one_tensor(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(tensor_summary(v) for v in value) + "]"
    return repr(value)


def tensor_signature(value: Any) -> Any:
    """What must match between ranks: dtype, shape and device type of each tensor."""
    if isinstance(value, torch.Tensor):
        return (value.dtype, tuple(value.shape), value.device.type)
    if isinstance(value, (list, tuple)):
        return tuple(tensor_signature(v) for v in value)
    return value


def _red_op_type(op: Any) -> Any:
    return getattr(op, "op", op)  # a ReduceOp object wraps its RedOpType


def op_name(op: Any) -> str:
    kind = _red_op_type(op)
    return getattr(kind, "name", str(kind))


def _stack(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    device = tensors[0].device
    return torch.stack([t.to(device) for t in tensors])


def _average(tensors):
    stacked = _stack(tensors)
    if not (stacked.is_floating_point() or stacked.is_complex()):
        raise Incompatible(f"ReduceOp.AVG needs floating point or complex tensors, "
                           f"got {stacked.dtype}")
    return stacked.mean(0)


def _bitwise(fn):
    def combine(tensors):
        if tensors[0].is_floating_point() or tensors[0].is_complex():
            raise Incompatible(f"bitwise reduce ops need integer or bool tensors, "
                               f"got {tensors[0].dtype}")
        device = tensors[0].device
        return functools.reduce(fn, [t.to(device) for t in tensors])
    return combine


_REDUCERS: dict[Any, Callable[[Sequence[torch.Tensor]], torch.Tensor]] = {
    ReduceOp.SUM: lambda ts: _stack(ts).sum(0),
    ReduceOp.AVG: _average,
    ReduceOp.PRODUCT: lambda ts: _stack(ts).prod(0),
    ReduceOp.MIN: lambda ts: _stack(ts).amin(0),
    ReduceOp.MAX: lambda ts: _stack(ts).amax(0),
    ReduceOp.BAND: _bitwise(torch.bitwise_and),
    ReduceOp.BOR: _bitwise(torch.bitwise_or),
    ReduceOp.BXOR: _bitwise(torch.bitwise_xor),
}

SUPPORTED_OPS = ", ".join(op.name for op in _REDUCERS)


def reduce_op_name(op: Any) -> str:
    """The op's name; for an op we cannot apply, a clear error on the calling rank."""
    kind = _red_op_type(op)
    if kind not in _REDUCERS:
        raise NotImplementedError(
            f"the threaded backend does not support ReduceOp.{op_name(op)}; "
            f"supported: {SUPPORTED_OPS}")
    return kind.name


def reduce_tensors(tensors: Sequence[torch.Tensor], op: Any) -> torch.Tensor:
    """Combine one tensor per rank with ``op`` (a ReduceOp or its RedOpType)."""
    return _REDUCERS[_red_op_type(op)](tensors)


# -- the collectives ---------------------------------------------------------

def _write(dst: torch.Tensor, src: torch.Tensor) -> None:
    dst.detach().copy_(src.to(dst.device))


def _check_list(name: str, items: Sequence, expected: int, rank: int) -> None:
    if len(items) != expected:
        raise Incompatible(f"rank {rank}: {name} has {len(items)} tensors, "
                           f"expected {expected} (one per rank of the group)")


def _check_numel(dst: torch.Tensor, src: torch.Tensor, where: str) -> None:
    if dst.numel() != src.numel() or dst.dtype != src.dtype:
        raise Incompatible(f"{where}: {_one_tensor(src)} does not fit {_one_tensor(dst)}")


def all_reduce(op: Any) -> Callable[[list], None]:
    def run(data: list[list[torch.Tensor]]) -> None:
        for index in range(len(data[0])):
            result = reduce_tensors([tensors[index] for tensors in data], op)
            for tensors in data:
                _write(tensors[index], result)
    return run


def broadcast(root: int) -> Callable[[list], None]:
    def run(data: list[list[torch.Tensor]]) -> None:
        for rank, tensors in enumerate(data):
            if rank != root:
                for dst, src in zip(tensors, data[root]):
                    _write(dst, src)
    return run


def reduce(root: int, op: Any) -> Callable[[list], None]:
    def run(data: list[list[torch.Tensor]]) -> None:
        for index, dst in enumerate(data[root]):
            _write(dst, reduce_tensors([tensors[index] for tensors in data], op))
    return run


def all_gather() -> Callable[[list], None]:
    """Payload: (outputs: list per input of one tensor per rank, inputs)."""
    def run(data) -> None:
        world = len(data)
        for dst_rank, (outputs, _) in enumerate(data):
            for index, per_rank in enumerate(outputs):
                _check_list("an all_gather output list", per_rank, world, dst_rank)
                for src_rank in range(world):
                    src = data[src_rank][1][index]
                    _check_numel(per_rank[src_rank], src,
                                 f"all_gather from rank {src_rank} into rank {dst_rank}")
                    _write(per_rank[src_rank], src.reshape(per_rank[src_rank].shape))
    return run


def all_gather_coalesced() -> Callable[[list], None]:
    """Payload: (outputs[src_rank][k], inputs[k])."""
    def run(data) -> None:
        world = len(data)
        for dst_rank, (outputs, _) in enumerate(data):
            _check_list("all_gather_coalesced's output", outputs, world, dst_rank)
            for src_rank in range(world):
                for dst, src in zip(outputs[src_rank], data[src_rank][1]):
                    _check_numel(dst, src, f"all_gather_coalesced from rank {src_rank} "
                                           f"into rank {dst_rank}")
                    _write(dst, src.reshape(dst.shape))
    return run


def _flat_view(t: torch.Tensor, what: str) -> torch.Tensor:
    if not t.is_contiguous():
        raise Incompatible(f"{what} must be contiguous, got strides {tuple(t.stride())}")
    return t.view(-1)


def all_gather_into_tensor() -> Callable[[list], None]:
    """Payload: list of (output, input) pairs."""
    def run(data) -> None:
        world = len(data)
        for pair in range(len(data[0])):
            for dst_rank, pairs in enumerate(data):
                out = _flat_view(pairs[pair][0], f"rank {dst_rank}'s all_gather output")
                for src_rank in range(world):
                    src = data[src_rank][pair][1].reshape(-1)
                    if out.numel() != world * src.numel():
                        raise Incompatible(
                            f"rank {dst_rank}'s output {_one_tensor(pairs[pair][0])} does not "
                            f"hold {world} x rank {src_rank}'s input "
                            f"{_one_tensor(data[src_rank][pair][1])}")
                    n = src.numel()
                    _write(out[src_rank * n:(src_rank + 1) * n], src)
    return run


def gather(root: int) -> Callable[[list], None]:
    """Payload: (outputs, inputs); only the root's outputs hold tensors."""
    def run(data) -> None:
        world = len(data)
        outputs = data[root][0]
        if len(outputs) != 1:
            raise Incompatible(f"gather's root (rank {root}) gave {len(outputs)} output "
                               "lists, expected 1")
        _check_list("gather's output list", outputs[0], world, root)
        for src_rank, (_, inputs) in enumerate(data):
            _check_numel(outputs[0][src_rank], inputs[0], f"gather from rank {src_rank}")
            _write(outputs[0][src_rank], inputs[0].reshape(outputs[0][src_rank].shape))
    return run


def scatter(root: int) -> Callable[[list], None]:
    """Payload: (outputs, inputs); only the root's inputs hold tensors."""
    def run(data) -> None:
        world = len(data)
        inputs = data[root][1]
        if len(inputs) != 1:
            raise Incompatible(f"scatter's root (rank {root}) gave {len(inputs)} input "
                               "lists, expected 1")
        _check_list("scatter's input list", inputs[0], world, root)
        for dst_rank, (outputs, _) in enumerate(data):
            _check_numel(outputs[0], inputs[0][dst_rank], f"scatter to rank {dst_rank}")
            _write(outputs[0], inputs[0][dst_rank].reshape(outputs[0].shape))
    return run


def reduce_scatter(op: Any) -> Callable[[list], None]:
    """Payload: (outputs: [tensor], inputs: [[one tensor per rank]])."""
    def run(data) -> None:
        world = len(data)
        for src_rank, (_, inputs) in enumerate(data):
            _check_list("reduce_scatter's input list", inputs[0], world, src_rank)
        for dst_rank, (outputs, _) in enumerate(data):
            parts = [data[src][1][0][dst_rank] for src in range(world)]
            for src_rank, part in enumerate(parts):
                _check_numel(outputs[0], part, f"reduce_scatter from rank {src_rank} "
                                               f"to rank {dst_rank}")
            _write(outputs[0], reduce_tensors(parts, op).reshape(outputs[0].shape))
    return run


def reduce_scatter_tensor(op: Any) -> Callable[[list], None]:
    """Payload: list of (output, input) pairs; each input holds world x output."""
    def run(data) -> None:
        world = len(data)
        for pair in range(len(data[0])):
            for dst_rank, pairs in enumerate(data):
                out = pairs[pair][0]
                n = out.numel()
                parts = []
                for src_rank in range(world):
                    src = data[src_rank][pair][1].reshape(-1)
                    if src.numel() != world * n:
                        raise Incompatible(
                            f"rank {src_rank}'s input {_one_tensor(data[src_rank][pair][1])} "
                            f"is not {world} x rank {dst_rank}'s output {_one_tensor(out)}")
                    parts.append(src[dst_rank * n:(dst_rank + 1) * n])
                _write(out, reduce_tensors(parts, op).reshape(out.shape))
    return run


def all_to_all() -> Callable[[list], None]:
    """Payload: (outputs: one per rank, inputs: one per rank)."""
    def run(data) -> None:
        world = len(data)
        for rank, (outputs, inputs) in enumerate(data):
            _check_list("all_to_all's output list", outputs, world, rank)
            _check_list("all_to_all's input list", inputs, world, rank)
        for dst_rank, (outputs, _) in enumerate(data):
            for src_rank in range(world):
                src = data[src_rank][1][dst_rank]
                _check_numel(outputs[src_rank], src,
                             f"all_to_all from rank {src_rank} to rank {dst_rank}")
                _write(outputs[src_rank], src.reshape(outputs[src_rank].shape))
    return run


def _row_splits(t: torch.Tensor, splits: Sequence[int] | None, world: int,
                what: str) -> list[int]:
    rows = t.shape[0] if t.dim() > 0 else t.numel()
    if splits is None or len(splits) == 0:
        if rows % world:
            raise Incompatible(f"{what} has {rows} rows, not divisible by {world} ranks "
                               "(give split sizes)")
        return [rows // world] * world
    splits = [int(s) for s in splits]
    if len(splits) != world or sum(splits) != rows:
        raise Incompatible(f"{what}: split sizes {splits} do not cover its {rows} rows "
                           f"in {world} parts")
    return splits


def all_to_all_single() -> Callable[[list], None]:
    """Payload: (output, input, output_split_sizes, input_split_sizes)."""
    def run(data) -> None:
        world = len(data)
        out_splits, in_splits = [], []
        for rank, (output, inp, o_split, i_split) in enumerate(data):
            out_splits.append(_row_splits(output, o_split, world, f"rank {rank}'s output"))
            in_splits.append(_row_splits(inp, i_split, world, f"rank {rank}'s input"))
        for dst_rank, (output, *_rest) in enumerate(data):
            if not output.is_contiguous():
                raise Incompatible(f"rank {dst_rank}'s all_to_all_single output must be "
                                   "contiguous")
            out_rows = output.view(output.shape[0], -1) if output.dim() else output
            start = 0
            for src_rank in range(world):
                count = out_splits[dst_rank][src_rank]
                sent = in_splits[src_rank][dst_rank]
                if count != sent:
                    raise Incompatible(
                        f"all_to_all_single: rank {src_rank} sends {sent} rows to rank "
                        f"{dst_rank}, which expects {count}")
                inp = data[src_rank][1]
                in_rows = inp.reshape(inp.shape[0], -1) if inp.dim() else inp
                src_start = sum(in_splits[src_rank][:dst_rank])
                _write(out_rows[start:start + count], in_rows[src_start:src_start + sent])
                start += count
    return run


def nothing() -> Callable[[list], None]:
    return lambda data: None
