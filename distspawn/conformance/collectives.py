"""Collectives: every one, on the world, a new full group and a group rank 0 is not in.

Tests are generated per (collective, group kind[, op][, async]) so that each
combination passes, fails or skips on its own, with its own name.
"""

from __future__ import annotations

import math
import torch
import torch.distributed as dist

from ..cases.dist_backend import require_backend_feature
from .common import (
    GROUP_KINDS,
    Placement,
    backend,
    finish,
    full,
    generated,
    lacks_collective,
    on_placement,
    skip_if_backend_lacks,
    supports,
    value_of,
)

_R = dist.ReduceOp

# op name -> (ReduceOp, the expected result from the members' values, feature needed)
_FLOAT_OPS = {
    "sum": (_R.SUM, sum, None),
    "product": (_R.PRODUCT, math.prod, None),
    "min": (_R.MIN, min, None),
    "max": (_R.MAX, max, None),
    "avg": (_R.AVG, lambda values: sum(values) / len(values), "avg"),
}
# Bitwise ops need integers: rank r contributes 1 << r (or ~ for BAND).
_BITWISE_OPS = {
    "band": (_R.BAND, lambda bits: _fold(bits, lambda a, b: a & b)),
    "bor": (_R.BOR, lambda bits: _fold(bits, lambda a, b: a | b)),
    "bxor": (_R.BXOR, lambda bits: _fold(bits, lambda a, b: a ^ b)),
}


def _fold(values, combine):
    result = values[0]
    for value in values[1:]:
        result = combine(result, value)
    return result


def _bits(rank: int) -> int:
    return (1 << rank) | 64  # a shared bit, so BAND has something to keep


def _gates(kind: str, feature: str | None = None) -> list:
    gates = [require_backend_feature("subgroup")] if kind == "subgroup" else []
    if feature is not None:
        gates.append(require_backend_feature(feature))
    return gates


class CollectiveTests:
    """broadcast, all_reduce (every op), reduce, all_gather (+ into tensor), gather,
    scatter, reduce_scatter (+ tensor), all_to_all, all_to_all_single, coalesced
    forms and dtypes."""

    def _assert_untouched(self, tensor: torch.Tensor, sentinel: float, what: str) -> None:
        self.assertTrue(bool((tensor == sentinel).all()),
                        f"{what} changed a tensor of a rank outside the group: {tensor}")

    # -- all_reduce ------------------------------------------------------------------

    for _kind in GROUP_KINDS:
        for _name, (_op, _expect, _feature) in _FLOAT_OPS.items():
            for _async in (False, True):
                if _async and _kind == "full":
                    continue  # async on the world and subgroup covers the Work paths

                @generated(locals(), f"test_all_reduce_{_name}_{_kind}"
                           + ("_async" if _async else ""), *_gates(_kind, _feature),
                           on_placement(_kind))
                def _test(self, at: Placement, op=_op, expect=_expect, async_op=_async,
                          name=_name, kind=_kind):
                    tensor = full(value_of(at.rank))
                    work = dist.all_reduce(tensor, op=op, group=at.group, async_op=async_op)
                    finish(work, async_op, at)
                    if at.member:
                        values = [value_of(r) for r in at.members]
                        want = expect(values)
                        self.assertEqual(tensor, full(want), (
                            f"all_reduce({name}) on the {kind} group, ranks {at.members} "
                            f"contributing {values}: expected {want}, rank {at.rank} got "
                            f"{tensor.tolist()}"))
                    else:
                        self._assert_untouched(tensor, value_of(at.rank), "all_reduce")

        for _name, (_op, _expect) in _BITWISE_OPS.items():
            @generated(locals(), f"test_all_reduce_{_name}_{_kind}",
                       *_gates(_kind, "bitwise"), on_placement(_kind))
            def _test(self, at: Placement, op=_op, expect=_expect):
                tensor = torch.full((4,), _bits(at.rank), dtype=torch.int64)
                finish(dist.all_reduce(tensor, op=op, group=at.group), False, at)
                if at.member:
                    want = expect([_bits(r) for r in at.members])
                    self.assertEqual(tensor, torch.full((4,), want, dtype=torch.int64))

    # -- broadcast, reduce --------------------------------------------------------------

    for _kind in GROUP_KINDS:
        for _async in (False, True):
            @generated(locals(), f"test_broadcast_{_kind}" + ("_async" if _async else ""),
                       *_gates(_kind), on_placement(_kind))
            def _test(self, at: Placement, async_op=_async):
                for src in at.members:  # every member takes a turn as the source
                    tensor = full(float(src) if at.rank == src else -1.0)
                    work = dist.broadcast(tensor, src, group=at.group, async_op=async_op)
                    finish(work, async_op, at)
                    self.assertEqual(tensor, full(float(src) if at.member else -1.0))

        for _name in ("sum", "product", "min", "max"):
            _op, _expect, _ = _FLOAT_OPS[_name]

            @generated(locals(), f"test_reduce_{_name}_{_kind}", *_gates(_kind),
                       on_placement(_kind))
            def _test(self, at: Placement, op=_op, expect=_expect):
                for dst in at.members:
                    tensor = full(value_of(at.rank))
                    finish(dist.reduce(tensor, dst, op=op, group=at.group), False, at)
                    if at.rank == dst:
                        self.assertEqual(tensor, full(expect([value_of(r) for r in at.members])))
                    elif not at.member:
                        self._assert_untouched(tensor, value_of(at.rank), "reduce")

    # -- gathering and scattering -----------------------------------------------------

    for _kind in GROUP_KINDS:
        for _async in (False, True):
            @generated(locals(), f"test_all_gather_{_kind}" + ("_async" if _async else ""),
                       *_gates(_kind), on_placement(_kind))
            def _test(self, at: Placement, async_op=_async):
                out = [full(-1.0, size=2) for _ in at.members]
                work = dist.all_gather(out, full(value_of(at.rank), size=2), group=at.group,
                                       async_op=async_op)
                finish(work, async_op, at)
                if at.member:
                    self.assertEqual(out, [full(value_of(r), size=2) for r in at.members])

            @generated(locals(), f"test_all_gather_into_tensor_{_kind}"
                       + ("_async" if _async else ""), *_gates(_kind), on_placement(_kind))
            def _test(self, at: Placement, async_op=_async):
                out = torch.full((at.size * 2,), -1.0)  # members' tensors end to end
                work = dist.all_gather_into_tensor(out, full(value_of(at.rank), size=2),
                                                   group=at.group, async_op=async_op)
                finish(work, async_op, at)
                if at.member:
                    want = torch.cat([full(value_of(r), size=2) for r in at.members])
                    self.assertEqual(out, want)

        @generated(locals(), f"test_gather_{_kind}", *_gates(_kind), on_placement(_kind))
        def _test(self, at: Placement):
            dst = at.members[0]
            out = [full(-1.0) for _ in at.members] if at.rank == dst else None
            finish(dist.gather(full(value_of(at.rank)), out, dst=dst, group=at.group),
                   False, at)
            if at.rank == dst:
                self.assertEqual(out, [full(value_of(r)) for r in at.members])

        @generated(locals(), f"test_scatter_{_kind}", *_gates(_kind), on_placement(_kind))
        def _test(self, at: Placement):
            src = at.members[-1]
            pieces = [full(10.0 * i) for i in range(at.size)] if at.rank == src else None
            out = full(-1.0)
            finish(dist.scatter(out, pieces, src=src, group=at.group), False, at)
            if at.member:
                self.assertEqual(out, full(10.0 * at.group_rank))
            else:
                self._assert_untouched(out, -1.0, "scatter")

        @generated(locals(), f"test_reduce_scatter_{_kind}", *_gates(_kind),
                   on_placement(_kind))
        def _test(self, at: Placement):
            pieces = [full(value_of(at.rank) * (j + 1)) for j in range(at.size)]
            out = full(-1.0)
            finish(dist.reduce_scatter(out, pieces, group=at.group), False, at)
            if at.member:
                total = sum(value_of(r) for r in at.members)
                self.assertEqual(out, full(total * (at.group_rank + 1)))

        @generated(locals(), f"test_reduce_scatter_tensor_{_kind}", *_gates(_kind),
                   on_placement(_kind))
        def _test(self, at: Placement):
            stacked = torch.cat([full(value_of(at.rank) * (j + 1)) for j in range(at.size)])
            out = full(-1.0)
            finish(dist.reduce_scatter_tensor(out, stacked, group=at.group), False, at)
            if at.member:
                total = sum(value_of(r) for r in at.members)
                self.assertEqual(out, full(total * (at.group_rank + 1)))

        @generated(locals(), f"test_all_to_all_{_kind}", *_gates(_kind), on_placement(_kind))
        def _test(self, at: Placement):
            me = at.group_rank if at.member else -1
            outgoing = [full(100.0 * me + j, size=2) for j in range(at.size)]
            incoming = [full(-1.0, size=2) for _ in range(at.size)]
            with skip_if_backend_lacks(self, "all_to_all"):
                finish(dist.all_to_all(incoming, outgoing, group=at.group), False, at)
            if at.member:
                self.assertEqual(incoming, [full(100.0 * i + me, size=2)
                                            for i in range(at.size)])

        @generated(locals(), f"test_all_to_all_single_equal_splits_{_kind}", *_gates(_kind),
                   on_placement(_kind))
        def _test(self, at: Placement):
            me = at.group_rank if at.member else -1
            outgoing = torch.cat([full(100.0 * me + j, size=2) for j in range(at.size)])
            incoming = torch.full((2 * at.size,), -1.0)
            with skip_if_backend_lacks(self, "all_to_all_single"):
                finish(dist.all_to_all_single(incoming, outgoing, group=at.group), False, at)
            if at.member:
                self.assertEqual(incoming, torch.cat([full(100.0 * i + me, size=2)
                                                      for i in range(at.size)]))

        @generated(locals(), f"test_all_to_all_single_unequal_splits_{_kind}",
                   *_gates(_kind), on_placement(_kind))
        def _test(self, at: Placement):
            # Group rank g sends g + j + 1 elements, each 10 * g + j, to group rank j.
            g = at.group_rank if at.member else 0
            send_sizes = [g + j + 1 for j in range(at.size)]
            recv_sizes = [i + g + 1 for i in range(at.size)]
            outgoing = torch.cat([full(10.0 * g + j, size=n) for j, n in enumerate(send_sizes)])
            incoming = torch.full((sum(recv_sizes),), -1.0)
            with skip_if_backend_lacks(self, "all_to_all_single with unequal splits"):
                finish(dist.all_to_all_single(incoming, outgoing, recv_sizes, send_sizes,
                                              group=at.group), False, at)
            if at.member:
                want = torch.cat([full(10.0 * i + g, size=n) for i, n in enumerate(recv_sizes)])
                self.assertEqual(incoming, want)

    del _kind, _name, _op, _expect, _async, _test, _feature

    # -- coalesced forms --------------------------------------------------------------------

    def test_all_reduce_coalesced(self):
        world = dist.get_world_size()
        tensors = [full(value_of(dist.get_rank()), size=n) for n in (1, 3, 5)]
        dist.all_reduce_coalesced(tensors)
        total = sum(value_of(r) for r in range(world))
        self.assertEqual(tensors, [full(total, size=n) for n in (1, 3, 5)])

    def test_all_gather_coalesced(self):
        if lacks_collective("allgather_coalesced"):
            self.skipTest(f"{backend()} does not implement allgather_coalesced")
        world, rank = dist.get_world_size(), dist.get_rank()
        mine = [full(value_of(rank), size=1), full(-value_of(rank), size=2)]
        out = [[torch.empty(1), torch.empty(2)] for _ in range(world)]
        dist.all_gather_coalesced(out, mine)
        for r in range(world):
            self.assertEqual(out[r], [full(value_of(r), size=1), full(-value_of(r), size=2)])

    def test_coalescing_manager_all_reduce(self):
        manager = getattr(dist, "_coalescing_manager", None)
        if manager is None:
            self.skipTest("this torch has no torch.distributed._coalescing_manager")
        world = dist.get_world_size()
        tensors = [full(value_of(dist.get_rank()) * k, size=k) for k in (1, 2, 3)]
        with manager(async_ops=True) as coalesced:
            for tensor in tensors:
                dist.all_reduce(tensor)
        coalesced.wait()
        total = sum(value_of(r) for r in range(world))
        self.assertEqual(tensors, [full(total * k, size=k) for k in (1, 2, 3)])

    # -- dtypes ---------------------------------------------------------------------------

    for _dtype in (torch.int8, torch.uint8, torch.int32, torch.int64, torch.float16,
                   torch.bfloat16, torch.float64, torch.complex64, torch.complex128):
        _label = str(_dtype).split(".")[1]
        _need = ["complex"] if _dtype.is_complex else []

        @generated(locals(), f"test_all_reduce_sum_{_label}",
                   *[require_backend_feature(f) for f in _need])
        def _test(self, dtype=_dtype):
            world = dist.get_world_size()
            tensor = torch.full((5,), value_of(dist.get_rank()), dtype=dtype)
            if dtype.is_complex:
                tensor = tensor * (1 + 2j)
            with skip_if_backend_lacks(self, "all_reduce", dtype):
                dist.all_reduce(tensor)
            want = torch.full((5,), sum(value_of(r) for r in range(world)), dtype=dtype)
            if dtype.is_complex:
                want = want * (1 + 2j)
            self.assertEqual(tensor, want)

        @generated(locals(), f"test_broadcast_{_label}",
                   *[require_backend_feature(f) for f in _need])
        def _test(self, dtype=_dtype):
            src = dist.get_world_size() - 1
            tensor = (torch.arange(6, dtype=torch.float64).to(dtype) if dist.get_rank() == src
                      else torch.zeros(6, dtype=dtype))
            with skip_if_backend_lacks(self, "broadcast", dtype):
                dist.broadcast(tensor, src)
            self.assertEqual(tensor, torch.arange(6, dtype=torch.float64).to(dtype))

    del _dtype, _label, _need, _test

    def test_all_reduce_on_a_view_and_an_empty_tensor(self):
        world = dist.get_world_size()
        base = torch.full((4, 4), value_of(dist.get_rank()))
        row = base[1]  # a contiguous view: the result must land in the base tensor
        dist.all_reduce(row)
        self.assertEqual(base[1], torch.full((4,), sum(value_of(r) for r in range(world))))
        self.assertEqual(base[0], torch.full((4,), value_of(dist.get_rank())))
        empty = torch.empty(0)
        dist.all_reduce(empty)
        self.assertEqual(empty.numel(), 0)

    def test_all_reduce_premul_sum(self):
        make = getattr(dist, "_make_nccl_premul_sum", None)
        if make is None or not supports("premul_sum"):
            self.skipTest(f"{backend()} is not in DistTestCases.backend_feature['premul_sum']")
        tensor = full(value_of(dist.get_rank()))
        dist.all_reduce(tensor, op=make(2.0))
        self.assertEqual(tensor, full(2.0 * sum(value_of(r) for r in range(dist.get_world_size()))))

