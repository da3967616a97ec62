"""The torch side of the ``threaded`` backend: a ``ProcessGroup`` whose ranks are threads.

Each method turns a c10d call into a :class:`~distspawn.backends.threaded_ops.Call`
and hands it to the session's rendezvous (:mod:`distspawn.backends.rendezvous`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.futures import Future

from . import threaded_ops as ops
from .rendezvous import (BACKEND_NAME, Call, ThreadedSession, ThreadedWork, _GroupInfo, _Pending,
                         active_session)


# -- the process group --------------------------------------------------------------

def _flat(value: Any) -> list:
    if isinstance(value, torch.Tensor):
        return [value]
    return [t for v in value for t in _flat(v)]


class ThreadedProcessGroup(dist.ProcessGroup):
    """One rank's view of a group on the threaded backend (one instance per thread)."""

    def __init__(self, session: ThreadedSession, group: _GroupInfo, rank: int) -> None:
        super().__init__(rank, group.size)
        self._session = session
        self._group = group
        self._group_rank = rank
        self._global_rank = group.global_ranks[rank]
        self._seq = 0
        self._coalesced: list[ThreadedWork] | None = None

    # Upstream's class-level hooks ---------------------------------------------

    @classmethod
    def exception_handle(cls, exc: BaseException) -> None:
        """Stop every rank of the running threaded world (a peer raised ``exc``)."""
        session = active_session()
        if session is not None:
            session.stop(f"a rank raised {type(exc).__name__}")

    @classmethod
    def reset(cls) -> None:
        """Nothing to reset: each threaded world starts with fresh state."""

    # Identity ------------------------------------------------------------------

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return BACKEND_NAME

    @property
    def group_name(self) -> str:
        return self._group.name

    def _set_group_name(self, name: str) -> None:
        if name != self._group.name:
            self._group = _GroupInfo(name, self._group.global_ranks)

    # torch >= 2.14's batch_isend_irecv asks the group for its per-device
    # backend without catching the error a Python ProcessGroup (which has
    # none) raises. This group is its own backend; the flags send torch down
    # its plain paths (one isend/irecv each, no communicator splitting).
    supports_coalescing = False
    supports_splitting = False
    supports_time_estimate = False

    def _get_backend(self, device: Any) -> ThreadedProcessGroup:
        return self

    def __repr__(self) -> str:
        return (f"ThreadedProcessGroup(name={self._group.name!r}, rank={self._group_rank}, "
                f"size={self._group.size})")

    # Plumbing --------------------------------------------------------------------

    def _collective(self, kind: str, payload: Any, execute, params=(), *,
                    tensors: Any = None, strict: bool = True, outputs: Any = None
                    ) -> ThreadedWork:
        call = Call(kind, tuple(params), payload if tensors is None else tensors, payload,
                    execute, strict)
        seq, self._seq = self._seq, self._seq + 1
        pending = self._session.join_collective(self._group, seq, self._group_rank, call)
        return self._work(pending, outputs)

    def _work(self, pending: _Pending, outputs: Any) -> ThreadedWork:
        work = ThreadedWork(self._session, pending, self._global_rank, outputs)
        if self._coalesced is not None:
            self._coalesced.append(work)
        return work

    # Collectives -------------------------------------------------------------------

    def allreduce(self, tensors, opts=None):
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        name = ops.reduce_op_name(op)
        return self._collective("all_reduce", list(tensors), ops.all_reduce(op),
                                [("op", name)], outputs=list(tensors))

    def allreduce_coalesced(self, tensors, opts=None):
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        name = ops.reduce_op_name(op)
        return self._collective("all_reduce_coalesced", list(tensors), ops.all_reduce(op),
                                [("op", name)], outputs=list(tensors))

    def broadcast(self, tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        return self._collective("broadcast", list(tensors), ops.broadcast(root),
                                [("src", root)], outputs=list(tensors))

    def reduce(self, tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        name = ops.reduce_op_name(op)
        return self._collective("reduce", list(tensors), ops.reduce(root, op),
                                [("dst", root), ("op", name)],
                                outputs=list(tensors))

    def allgather(self, output_tensors, input_tensors, opts=None):
        return self._collective("all_gather", (output_tensors, list(input_tensors)),
                                ops.all_gather(), tensors=input_tensors, strict=False,
                                outputs=output_tensors)

    def allgather_coalesced(self, output_lists, input_tensors, opts=None):
        return self._collective("all_gather_coalesced", (output_lists, list(input_tensors)),
                                ops.all_gather_coalesced(), tensors=input_tensors,
                                strict=False, outputs=output_lists)

    def all_gather_single(self, output, input, opts=None):
        return self._collective("all_gather_into_tensor", [(output, input)],
                                ops.all_gather_into_tensor(), tensors=input, strict=False,
                                outputs=[output])

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        return self._collective("all_gather_into_tensor_coalesced",
                                list(zip(outputs, inputs)), ops.all_gather_into_tensor(),
                                tensors=list(inputs), strict=False, outputs=list(outputs))

    def gather(self, output_lists, input_tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        return self._collective("gather", (output_lists, list(input_tensors)),
                                ops.gather(root), [("dst", root)], tensors=input_tensors,
                                strict=False, outputs=output_lists)

    def scatter(self, output_tensors, input_lists, opts=None):
        root = opts.rootRank if opts is not None else 0
        return self._collective("scatter", (list(output_tensors), input_lists),
                                ops.scatter(root), [("src", root)], tensors=output_tensors,
                                strict=False, outputs=list(output_tensors))

    def reduce_scatter(self, output_tensors, input_lists, opts=None):
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        name = ops.reduce_op_name(op)
        return self._collective("reduce_scatter", (list(output_tensors), input_lists),
                                ops.reduce_scatter(op), [("op", name)],
                                tensors=output_tensors, strict=False,
                                outputs=list(output_tensors))

    def reduce_scatter_single(self, output, input, opts=None):
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        name = ops.reduce_op_name(op)
        return self._collective("reduce_scatter_tensor", [(output, input)],
                                ops.reduce_scatter_tensor(op), [("op", name)],
                                tensors=output, strict=False, outputs=[output])

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        name = ops.reduce_op_name(op)
        return self._collective("reduce_scatter_tensor_coalesced", list(zip(outputs, inputs)),
                                ops.reduce_scatter_tensor(op), [("op", name)],
                                tensors=list(outputs), strict=False, outputs=list(outputs))

    def alltoall(self, output_tensors, input_tensors, opts=None):
        return self._collective("all_to_all", (list(output_tensors), list(input_tensors)),
                                ops.all_to_all(), tensors=input_tensors, strict=False,
                                outputs=list(output_tensors))

    def all_to_all_single(self, output, input, output_split_sizes=None,
                          input_split_sizes=None, opts=None):
        return self._collective(
            "all_to_all_single", (output, input, output_split_sizes, input_split_sizes),
            ops.all_to_all_single(), tensors=input, strict=False, outputs=[output])

    def barrier(self, opts=None):
        return self._collective("barrier", [], ops.nothing(), tensors=[], outputs=[])

    # Names of the same ops in older torch releases.
    _allgather_base = all_gather_single
    allgather_into_tensor_coalesced = all_gather_single_coalesced
    _reduce_scatter_base = reduce_scatter_single
    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced
    alltoall_base = all_to_all_single

    # Point to point --------------------------------------------------------------

    def _one_tensor(self, tensors, what: str) -> torch.Tensor:
        tensors = list(tensors)
        if len(tensors) != 1:
            raise ValueError(f"threaded backend: {what} takes exactly one tensor, "
                             f"got {len(tensors)}")
        return tensors[0]

    def send(self, tensors, dst_rank, tag=0):
        tensor = self._one_tensor(tensors, "send")
        op = self._session.post_send(self._group, self._global_rank,
                                     self._group.global_ranks[dst_rank], tag, tensor)
        return self._work(op, [tensor])

    def recv(self, tensors, src_rank, tag=0):
        tensor = self._one_tensor(tensors, "recv")
        op = self._session.post_recv(self._group, self._group.global_ranks[src_rank],
                                     self._global_rank, tag, tensor)
        return self._work(op, [tensor])

    def recv_anysource(self, tensors, tag=0):
        tensor = self._one_tensor(tensors, "recv")
        op = self._session.post_recv(self._group, None, self._global_rank, tag, tensor)
        return self._work(op, [tensor])

    # Coalescing (c10d's _coalescing_manager) ------------------------------------

    def _start_coalescing(self, device=None):
        self._coalesced = []

    def _end_coalescing(self, device=None):
        works, self._coalesced = self._coalesced or [], None
        return _AllOf(works)


class _AllOf(dist.Work):
    """A work that is done when all the works it holds are done."""

    def __init__(self, works: list[ThreadedWork]) -> None:
        super().__init__()
        self._works = works

    def wait(self, timeout: Any = None) -> bool:
        for work in self._works:
            work.wait(timeout)
        return True

    def is_completed(self) -> bool:
        return all(w.is_completed() for w in self._works)

    def get_future(self) -> Future:
        future: Future = Future()
        future.set_result(None)
        return future
