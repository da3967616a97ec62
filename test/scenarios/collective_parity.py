"""Every collective and reduce op, once per rank: the results as plain lists.

Usage: python collective_parity.py BACKEND WORLD_SIZE
BACKEND is ``threaded`` (ranks as threads, distspawn's backend) or ``gloo``
(rank processes). Prints ``RESULTS {json}``: rank -> check name -> value.
test_threaded_parity.py runs both and asserts they are identical.
"""

import json
import os
import sys
import tempfile
import threading
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

OPS = ["SUM", "AVG", "PRODUCT", "MIN", "MAX"]
INT_OPS = ["SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"]


def _floats(rank, n=4):
    return torch.arange(n, dtype=torch.float32) * (rank + 1) + rank * 10 + 1


def _ints(rank):
    return torch.tensor([rank + 1, 2 * rank + 3, 7 ^ rank, rank * 5 + 6], dtype=torch.int64)


def _group_checks(results, prefix, group, rank, size, wait_async):
    """The collectives on one group; ``rank`` and ``size`` are the group's."""
    def record(name, value):
        if isinstance(value, torch.Tensor):
            value = value.tolist()
        elif isinstance(value, (list, tuple)):
            value = [v.tolist() if isinstance(v, torch.Tensor) else v for v in value]
        results[f"{prefix}.{name}"] = value

    def run(fn, *args, **kwargs):
        work = fn(*args, group=group, async_op=wait_async, **kwargs)
        if wait_async:
            work.wait()

    for op in OPS:
        t = _floats(rank)
        run(dist.all_reduce, t, op=getattr(dist.ReduceOp, op))
        record(f"all_reduce.{op}", t)
    for op in INT_OPS:
        t = _ints(rank)
        run(dist.all_reduce, t, op=getattr(dist.ReduceOp, op))
        record(f"all_reduce.int.{op}", t)
    c = torch.complex(_floats(rank), -_floats(rank))
    run(dist.all_reduce, c)
    record("all_reduce.complex", torch.view_as_real(c))
    b = torch.tensor([rank == 0, False, True])
    run(dist.all_reduce, b)
    record("all_reduce.bool", b)
    ts = [_floats(rank, 2), _floats(rank, 3)]
    dist.all_reduce_coalesced(ts, group=group)
    record("all_reduce_coalesced", ts)

    for src in range(size):
        t = _floats(rank)
        run(dist.broadcast, t, group_src=src)
        record(f"broadcast.from{src}", t)
        t = _floats(rank)
        run(dist.reduce, t, group_dst=src, op=dist.ReduceOp.MAX)
        record(f"reduce.MAX.to{src}", t if rank == src else "not root")

    outs = [torch.zeros(4) for _ in range(size)]
    run(dist.all_gather, outs, _floats(rank))
    record("all_gather", outs)
    out = torch.zeros(size * 4)
    run(dist.all_gather_into_tensor, out, _floats(rank))
    record("all_gather_into_tensor", out)

    root = size - 1
    gathered = [torch.zeros(3) for _ in range(size)] if rank == root else None
    run(dist.gather, _floats(rank, 3), gather_list=gathered, group_dst=root)
    record("gather", gathered if rank == root else "not root")
    t = torch.zeros(3)
    pieces = [_floats(r, 3) * 7 for r in range(size)] if rank == 0 else None
    run(dist.scatter, t, scatter_list=pieces, group_src=0)
    record("scatter", t)

    for op in ["SUM", "MAX", "AVG"]:
        t = torch.zeros(2)
        run(dist.reduce_scatter, t, [_floats(rank, 2) + 100 * r for r in range(size)],
            op=getattr(dist.ReduceOp, op))
        record(f"reduce_scatter.{op}", t)
        t = torch.zeros(2)
        run(dist.reduce_scatter_tensor, t, _floats(rank, 2 * size),
            op=getattr(dist.ReduceOp, op))
        record(f"reduce_scatter_tensor.{op}", t)

    try:
        _all_to_all_checks(record, run, rank, size)
    except RuntimeError as error:
        # gloo before torch 2.9 has no alltoall; it refuses before moving data.
        if "does not support alltoall" not in str(error):
            raise
        record("all_to_all.lacked", str(error).strip().splitlines()[0])

    run(dist.barrier)
    record("barrier", "ok")

    # Point to point around a ring, sync and async.
    right, left = (rank + 1) % size, (rank - 1) % size
    if size > 1:
        incoming = torch.zeros(3)
        if rank % 2 == 0:
            dist.send(_floats(rank, 3), group_dst=right, group=group)
            dist.recv(incoming, group_src=left, group=group)
        else:
            dist.recv(incoming, group_src=left, group=group)
            dist.send(_floats(rank, 3), group_dst=right, group=group)
        record("send_recv.ring", incoming)
        incoming = torch.zeros(3)
        works = [dist.isend(_floats(rank, 3) * 2, group_dst=right, group=group),
                 dist.irecv(incoming, group_src=left, group=group)]
        for work in works:
            work.wait()
        record("isend_irecv.ring", incoming)
        incoming = torch.zeros(3)
        ops = [dist.P2POp(dist.isend, _floats(rank, 3) * 3, group=group, group_peer=right),
               dist.P2POp(dist.irecv, incoming, group=group, group_peer=left)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        record("batch_isend_irecv.ring", incoming)

    objects = [None] * size
    dist.all_gather_object(objects, {"rank": rank, "sq": rank * rank}, group=group)
    record("all_gather_object", objects)
    objs = [f"from {rank}", rank] if rank == 0 else [None, None]
    dist.broadcast_object_list(objs, group_src=0, group=group)
    record("broadcast_object_list", objs)


def _all_to_all_checks(record, run, rank, size):
    outs = [torch.zeros(2) for _ in range(size)]
    run(dist.all_to_all, outs, [_floats(rank, 2) + 100 * r for r in range(size)])
    record("all_to_all", outs)
    t = torch.zeros(size * 2)
    run(dist.all_to_all_single, t, _floats(rank, size * 2))
    record("all_to_all_single.equal", t)
    # Unequal splits: rank r sends (d + 1) rows to rank d and receives (r + 1) rows from each.
    in_splits = [d + 1 for d in range(size)]
    out_splits = [rank + 1] * size
    inp = _floats(rank, sum(in_splits) * 2).reshape(-1, 2)
    t = torch.zeros(sum(out_splits), 2)
    run(dist.all_to_all_single, t, inp, output_split_sizes=out_splits,
        input_split_sizes=in_splits)
    record("all_to_all_single.unequal", t)


def checks(rank, world_size):
    """All results of one rank: on the world group (sync and async) and a subgroup."""
    out = {}
    _group_checks(out, "world", None, rank, world_size, wait_async=False)
    _group_checks(out, "world.async", None, rank, world_size, wait_async=True)
    members = list(range(1, world_size)) if world_size > 2 else [0, 1]
    group = dist.new_group(members)
    if rank in members:
        _group_checks(out, "subgroup", group, members.index(rank), len(members),
                      wait_async=False)
    # A group this rank is not in: the call is a no-op for it.
    others = dist.new_group([0]) if world_size > 1 else None
    if rank != 0:
        t = _floats(rank)
        dist.all_reduce(t, group=others)
        out["non_member.all_reduce"] = t.tolist()
    return out


def _threaded(world_size):
    from distspawn import threaded_world

    results = {}
    with threaded_world(world_size, timeout=120):
        store = dist.HashStore()

        def rank_main(rank):
            dist.init_process_group("threaded", rank=rank, world_size=world_size, store=store)
            try:
                results[rank] = checks(rank, world_size)
            except BaseException:
                results[rank] = {"error": traceback.format_exc()}
            finally:
                dist.destroy_process_group()

        threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world_size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return results


def _gloo_rank(rank, world_size, directory):
    dist.init_process_group("gloo", rank=rank, world_size=world_size,
                            init_method=f"file://{directory}/store")
    try:
        result = checks(rank, world_size)
    finally:
        dist.destroy_process_group()
    with open(os.path.join(directory, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)


def _gloo(world_size):
    with tempfile.TemporaryDirectory() as directory:
        mp.start_processes(_gloo_rank, args=(world_size, directory), nprocs=world_size,
                           start_method="spawn")
        results = {}
        for rank in range(world_size):
            with open(os.path.join(directory, f"rank{rank}.json")) as f:
                results[rank] = json.load(f)
    return results


if __name__ == "__main__":
    import warnings

    warnings.simplefilter("ignore")
    backend, world_size = sys.argv[1], int(sys.argv[2])
    results = (_threaded if backend == "threaded" else _gloo)(world_size)
    print("RESULTS " + json.dumps(results, sort_keys=True))
