"""The ``threaded`` backend: a process group whose ranks are threads of one process.

Registered with ``torch.distributed.Backend.register_backend`` under the name
``threaded``; each rank thread calls ``init_process_group("threaded", rank=...,
world_size=..., store=...)`` inside a :class:`ThreadedSession` (which
:class:`~distspawn.MultiThreadedTestCase`, ``spawn_threads_and_init_comms`` and
:func:`threaded_world` set up).

How a collective works: every rank deposits a :class:`~distspawn.threaded_ops.Call`
under the key (group name, n-th collective on that group) and gets a
:class:`ThreadedWork` back at once, so async ops never block. The rank that
completes the set checks that all calls agree, moves the data and wakes the
others. Point-to-point ops meet in mailboxes (a send completes when a matching
recv takes its data, as with gloo).

Every wait is bounded: by the session's deadline, by a failure on another
rank (the waiter raises :class:`PeerFailed`), and by deadlock detection: when
every unfinished rank is waiting and none of their ops can complete, the wait
fails at once with each rank's pending call instead of hanging.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Iterator

import torch
import torch.distributed as dist
from torch.futures import Future

from . import threaded_ops as ops
from .threaded_ops import Call, Incompatible, tensor_summary

__all__ = [
    "CollectiveDeadlockError",
    "CollectiveMismatchError",
    "CollectiveTimeoutError",
    "DeadlineReached",
    "PeerFailed",
    "ThreadedBackendError",
    "ThreadedProcessGroup",
    "ThreadedSession",
    "ThreadedWork",
    "active_session",
    "missing_threaded_hooks",
    "register_threaded_backend",
    "threaded_world",
]

BACKEND_NAME = "threaded"


class ThreadedBackendError(RuntimeError):
    """A collective on the threaded backend could not be carried out."""


class CollectiveMismatchError(ThreadedBackendError):
    """The ranks of a group called different collectives, or incompatible tensors."""


class CollectiveDeadlockError(ThreadedBackendError):
    """Every rank still running waits on an op that no rank can complete."""


class CollectiveTimeoutError(TimeoutError):
    """A wait reached the test's deadline."""


class DeadlineReached(CollectiveTimeoutError):
    """A wait reached the session's deadline (the harness reports the stuck ranks)."""


class PeerFailed(BaseException):
    """Raised in a rank whose peer failed first: this rank is stopped, not blamed.

    A ``BaseException`` so that a test's ``except Exception`` cannot swallow it.
    """


# -- the private hooks we depend on ---------------------------------------------

def missing_threaded_hooks() -> list[str]:
    """Private torch hooks the threaded world needs that this torch lacks."""
    missing = []
    c10d = dist.distributed_c10d if dist.is_available() else None
    if c10d is None:
        return ["torch.distributed (this torch was built without distributed support)"]
    for name in ("_World", "_world"):
        if not hasattr(c10d, name):
            missing.append(f"torch.distributed.distributed_c10d.{name}")
    if not hasattr(torch._C._distributed_c10d, "_set_thread_isolation_mode"):
        missing.append("torch._C._distributed_c10d._set_thread_isolation_mode")
    return missing


# -- pending ops and their works --------------------------------------------------

@dataclass(eq=False)
class _Pending:
    """An op some ranks wait on; completed (or failed) exactly once."""

    group: "_GroupInfo"
    done: bool = False
    error: BaseException | None = None
    source_rank: int = -1
    futures: list = field(default_factory=list)

    @property
    def description(self) -> str:
        return "an op"

    def waiting_for(self) -> str:
        return ""


@dataclass(eq=False)
class _Rendezvous(_Pending):
    seq: int = 0
    calls: dict = field(default_factory=dict)

    @property
    def description(self) -> str:
        return self.calls[min(self.calls)].describe() if self.calls else "a collective"

    def waiting_for(self) -> str:
        absent = [self.group.global_ranks[r] for r in range(self.group.size)
                  if r not in self.calls]
        return f"rank{'s' if len(absent) > 1 else ''} {_ranks_text(absent)} not there yet"


@dataclass(eq=False)
class _PointToPoint(_Pending):
    is_send: bool = True
    src: int | None = None  # global ranks; None: a recv from any source
    dst: int = -1
    tag: int = 0
    tensor: torch.Tensor | None = None

    @property
    def description(self) -> str:
        if self.is_send:
            return f"send(to rank {self.dst}, tag={self.tag}, {tensor_summary(self.tensor)})"
        source = "any rank" if self.src is None else f"rank {self.src}"
        return f"recv(from {source}, tag={self.tag}, {tensor_summary(self.tensor)})"

    def waiting_for(self) -> str:
        if self.is_send:
            return f"rank {self.dst} has not posted the matching recv"
        if self.src is None:
            return "no rank has sent it a matching message"
        return f"rank {self.src} has not posted the matching send"


def _ranks_text(ranks) -> str:
    return ", ".join(map(str, ranks))


@dataclass(frozen=True)
class _GroupInfo:
    name: str
    global_ranks: tuple[int, ...]

    @property
    def size(self) -> int:
        return len(self.global_ranks)

    def label(self) -> str:
        return f"group '{self.name}' (ranks {_ranks_text(self.global_ranks)})"


@dataclass
class _Waiter:
    pending: _Pending
    bounded: bool  # the caller gave its own timeout: it may give up by itself


class ThreadedSession:
    """The shared state of one threaded world: pending ops, deadline, stop flag."""

    def __init__(self, world_size: int | None, timeout: float | None = None) -> None:
        self.world_size = world_size
        self.timeout = timeout
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self._cond = threading.Condition(threading.RLock())
        self._collectives: dict[tuple[str, int], _Rendezvous] = {}
        self._sends: list[_PointToPoint] = []
        self._recvs: list[_PointToPoint] = []
        self._unsettled: list = []
        self._waiting: dict[int, _Waiter] = {}
        self._finished: dict[int, str] = {}
        self._stop_reason: str | None = None
        self.harness_record: Any = None  # what the test harness keeps about its ranks

    # -- life cycle -------------------------------------------------------

    def stop(self, reason: str) -> None:
        """Make every current and future wait raise :class:`PeerFailed`."""
        with self._cond:
            if self._stop_reason is None:
                self._stop_reason = reason
            self._cond.notify_all()

    @property
    def stopped(self) -> bool:
        return self._stop_reason is not None

    def rank_finished(self, rank: int, how: str) -> None:
        """``rank`` left its test (``how``: passed, raised, skipped...)."""
        with self._cond:
            self._finished[rank] = how
            self._cond.notify_all()

    def has_finished(self, rank: int) -> bool:
        with self._cond:
            return rank in self._finished

    # -- collectives --------------------------------------------------------

    def join_collective(self, group: _GroupInfo, seq: int, group_rank: int,
                        call: Call) -> _Rendezvous:
        with self._settling():
            self._raise_if_stopped()
            key = (group.name, seq)
            rendezvous = self._collectives.get(key)
            if rendezvous is None:
                rendezvous = _Rendezvous(group, seq=seq)
                self._collectives[key] = rendezvous
            rendezvous.calls[group_rank] = call
            if len(rendezvous.calls) == group.size:
                del self._collectives[key]
                self._complete(rendezvous, self._run_collective)
            return rendezvous

    def _run_collective(self, rendezvous: _Rendezvous) -> None:
        calls = [rendezvous.calls[r] for r in range(rendezvous.group.size)]
        where = (f"{rendezvous.group.label()}, collective #{rendezvous.seq + 1} on that "
                 "group")
        if len({c.match_key() for c in calls}) > 1:
            raise CollectiveMismatchError(
                f"collective mismatch on {where}: the ranks' calls differ:\n"
                + self._call_lines(rendezvous, calls))
        try:
            with torch.no_grad():
                calls[0].execute([c.payload for c in calls])
        except Incompatible as exc:
            raise CollectiveMismatchError(
                f"collective mismatch on {where}: {exc}\n"
                + self._call_lines(rendezvous, calls)) from None
        except Exception as exc:
            raise ThreadedBackendError(
                f"{calls[0].describe()} on {where} failed: {type(exc).__name__}: {exc}"
            ) from exc

    @staticmethod
    def _call_lines(rendezvous: _Rendezvous, calls: list[Call]) -> str:
        return "\n".join(f"  rank {rendezvous.group.global_ranks[r]}: {call.describe()}"
                         for r, call in enumerate(calls))

    # -- point to point --------------------------------------------------------

    def post_send(self, group: _GroupInfo, src: int, dst: int, tag: int,
                  tensor: torch.Tensor) -> _PointToPoint:
        op = _PointToPoint(group, is_send=True, src=src, dst=dst, tag=tag, tensor=tensor)
        with self._settling():
            self._raise_if_stopped()
            match = next((r for r in self._recvs if self._pairs(op, r)), None)
            if match is None:
                self._sends.append(op)
            else:
                self._recvs.remove(match)
                self._deliver(op, match)
        return op

    def post_recv(self, group: _GroupInfo, src: int | None, dst: int, tag: int,
                  tensor: torch.Tensor) -> _PointToPoint:
        op = _PointToPoint(group, is_send=False, src=src, dst=dst, tag=tag, tensor=tensor)
        with self._settling():
            self._raise_if_stopped()
            match = next((s for s in self._sends if self._pairs(s, op)), None)
            if match is None:
                self._recvs.append(op)
            else:
                self._sends.remove(match)
                self._deliver(match, op)
        return op

    @staticmethod
    def _pairs(send: _PointToPoint, recv: _PointToPoint) -> bool:
        return (send.group.name == recv.group.name and send.dst == recv.dst
                and recv.src in (None, send.src) and send.tag == recv.tag)

    def _deliver(self, send: _PointToPoint, recv: _PointToPoint) -> None:
        def move(_):
            source, target = send.tensor, recv.tensor
            if source.numel() != target.numel() or source.dtype != target.dtype:
                raise CollectiveMismatchError(
                    f"send/recv mismatch on {send.group.label()}:\n"
                    f"  rank {send.src}: {send.description}\n"
                    f"  rank {recv.dst}: {recv.description}")
            with torch.no_grad():
                target.detach().copy_(source.reshape(target.shape).to(target.device))
            recv.source_rank = send.group.global_ranks.index(send.src)

        self._complete_pair(send, recv, move)

    # -- completing ------------------------------------------------------------

    def _complete(self, pending: _Pending, action) -> None:
        self._complete_pair(pending, None, action)

    def _complete_pair(self, first: _Pending, second: _Pending | None, action) -> None:
        # Called with the lock held; both sides of a pair see the same outcome.
        try:
            action(first)
        except ThreadedBackendError as exc:
            first.error = exc
        for pending in [first] if second is None else [first, second]:
            pending.error = first.error
            pending.done = True
            self._unsettled.extend((future, outputs, pending)
                                   for future, outputs in pending.futures)
            pending.futures = []
        self._cond.notify_all()

    @contextlib.contextmanager
    def _settling(self):
        """Hold the lock; afterwards complete the futures of ops done meanwhile.

        A torch Future runs its callbacks inline, so it must not be set while
        the lock is held (a callback may start another op).
        """
        with self._cond:
            yield
            settle, self._unsettled = self._unsettled, []
        for future, outputs, pending in settle:
            _settle(future, outputs, pending)

    # -- waiting ---------------------------------------------------------------

    def wait(self, pending: _Pending, rank: int, timeout: float | None = None) -> None:
        """Block ``rank`` until ``pending`` completes; raise if it cannot."""
        give_up = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self._waiting[rank] = _Waiter(pending, bounded=timeout is not None)
            try:
                while not pending.done:
                    now = time.monotonic()
                    if self.deadline is not None and now >= self.deadline:
                        raise DeadlineReached(
                            f"rank {rank}: {pending.description} on {pending.group.label()} "
                            f"did not complete before the test's deadline "
                            f"({self.timeout:g} s): {pending.waiting_for()}")
                    self._raise_if_stopped()
                    if give_up is not None and now >= give_up:
                        raise CollectiveTimeoutError(
                            f"rank {rank}: {pending.description} on "
                            f"{pending.group.label()} timed out after {timeout:g} s: "
                            f"{pending.waiting_for()}")
                    report = self._deadlock_report()
                    if report is not None:
                        self._stop_reason = f"rank {rank} found a deadlock"
                        self._cond.notify_all()
                        raise CollectiveDeadlockError(report)
                    ends = [t for t in (self.deadline, give_up) if t is not None]
                    self._cond.wait(min(ends) - now if ends else None)
            finally:
                del self._waiting[rank]
        if pending.error is not None:
            error = pending.error
            raise type(error)(str(error)) from error.__cause__

    def _raise_if_stopped(self) -> None:
        if self._stop_reason is not None:
            raise PeerFailed(f"stopped by distspawn: {self._stop_reason}")

    def _deadlock_report(self) -> str | None:
        if self.world_size is None:
            return None  # world size unknown (a bare install): no detection
        for rank in range(self.world_size):
            if rank in self._finished:
                continue
            waiter = self._waiting.get(rank)
            if waiter is None or waiter.bounded or waiter.pending.done:
                return None  # this rank can still act
        lines = ["deadlock: every rank still running waits on an op that no rank "
                 "can complete:"]
        for rank in range(self.world_size):
            waiter = self._waiting.get(rank)
            if waiter is None:
                lines.append(f"  rank {rank}: finished its test ({self._finished[rank]})")
                continue
            pending = waiter.pending
            lines.append(f"  rank {rank}: waiting in {pending.description} on "
                         f"{pending.group.label()}: {pending.waiting_for()}")
        return "\n".join(lines)

    def pending_summary(self) -> Iterator[str]:
        """What each waiting rank waits on (for timeout reports)."""
        with self._cond:
            for rank, waiter in sorted(self._waiting.items()):
                yield (f"rank {rank}: waiting in {waiter.pending.description} on "
                       f"{waiter.pending.group.label()}: {waiter.pending.waiting_for()}")


def _settle(future: Future, outputs: Any, pending: _Pending) -> None:
    if pending.error is not None:
        future.set_exception(type(pending.error)(str(pending.error)))
    else:
        future.set_result(outputs)


class ThreadedWork(dist.Work):
    """The handle a threaded op returns; ``wait()`` honours every bound of the session."""

    def __init__(self, session: ThreadedSession, pending: _Pending, rank: int,
                 outputs: Any = None) -> None:
        super().__init__()
        self._session = session
        self._pending = pending
        self._rank = rank
        self._outputs = outputs

    def wait(self, timeout: Any = None) -> bool:
        seconds = None
        if isinstance(timeout, timedelta):
            seconds = timeout.total_seconds() or None
        elif isinstance(timeout, (int, float)) and timeout > 0:
            seconds = float(timeout)
        self._session.wait(self._pending, self._rank, seconds)
        return True

    def is_completed(self) -> bool:
        return self._pending.done

    def is_success(self) -> bool:
        return self._pending.done and self._pending.error is None

    def exception(self) -> BaseException | None:
        return self._pending.error

    def source_rank(self) -> int:
        return self._pending.source_rank

    _source_rank = source_rank

    def result(self) -> list:
        return list(self._outputs or [])

    def synchronize(self) -> None:
        pass

    def get_future(self) -> Future:
        future: Future = Future()
        with self._session._cond:
            if not self._pending.done:
                self._pending.futures.append((future, self._outputs))
                return future
        _settle(future, self._outputs, self._pending)
        return future


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
        ops.check_reduce_op(op)
        return self._collective("all_reduce", list(tensors), ops.all_reduce(op),
                                [("op", ops.op_name(op))], outputs=list(tensors))

    def allreduce_coalesced(self, tensors, opts=None):
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        ops.check_reduce_op(op)
        return self._collective("all_reduce_coalesced", list(tensors), ops.all_reduce(op),
                                [("op", ops.op_name(op))], outputs=list(tensors))

    def broadcast(self, tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        return self._collective("broadcast", list(tensors), ops.broadcast(root),
                                [("src", root)], outputs=list(tensors))

    def reduce(self, tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        ops.check_reduce_op(op)
        return self._collective("reduce", list(tensors), ops.reduce(root, op),
                                [("dst", root), ("op", ops.op_name(op))],
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
        ops.check_reduce_op(op)
        return self._collective("reduce_scatter", (list(output_tensors), input_lists),
                                ops.reduce_scatter(op), [("op", ops.op_name(op))],
                                tensors=output_tensors, strict=False,
                                outputs=list(output_tensors))

    def reduce_scatter_single(self, output, input, opts=None):
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        ops.check_reduce_op(op)
        return self._collective("reduce_scatter_tensor", [(output, input)],
                                ops.reduce_scatter_tensor(op), [("op", ops.op_name(op))],
                                tensors=output, strict=False, outputs=[output])

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        ops.check_reduce_op(op)
        return self._collective("reduce_scatter_tensor_coalesced", list(zip(outputs, inputs)),
                                ops.reduce_scatter_tensor(op), [("op", ops.op_name(op))],
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


# -- per-thread c10d state -------------------------------------------------------

_WORLD_FIELDS: dict[str, Any] = {
    "default_pg": lambda: None,
    "pg_map": dict,
    "pg_names": dict,
    "pg_group_ranks": dict,
    "pg_backend_config": dict,
    "group_count": lambda: 0,
    "tags_to_pg": dict,
    "pg_to_tag": dict,
    "pg_coalesce_state": dict,
    "comms": list,
}


@functools.lru_cache(maxsize=None)
def _per_thread_world_class():
    """A ``_World`` whose state is separate in every thread (built on first use)."""
    base = dist.distributed_c10d._World

    def field_property(name, make):
        def get(self):
            state = self._local.__dict__
            if name not in state:
                state[name] = make()
            return state[name]

        def set_(self, value):
            self._local.__dict__[name] = value

        return property(get, set_)

    namespace = {name: field_property(name, make) for name, make in _WORLD_FIELDS.items()}

    def __init__(self):  # noqa: N807
        self._local = threading.local()

    namespace["__init__"] = __init__
    namespace["_get_world"] = lambda self: self  # upstream's accessor for the state
    namespace["__doc__"] = "c10d's world state, kept separately for each rank thread."
    return type("PerThreadWorld", (base,), namespace)


# -- sessions ------------------------------------------------------------------------

_session_lock = threading.Lock()
_active: ThreadedSession | None = None
_saved_world: Any = None
_autograd_threads: Any = None
_saved_excepthook: Any = None


def active_session() -> ThreadedSession | None:
    """The threaded session now installed in this process, if any."""
    return _active


def _create_threaded_pg(options, _backend_options=None) -> ThreadedProcessGroup:
    session = _active
    if session is None:
        raise RuntimeError(
            "the 'threaded' backend runs its ranks as threads of one process and needs a "
            "per-thread world: use MultiThreadedTestCase, @spawn_threads_and_init_comms, "
            "or init each rank thread inside `with distspawn.threaded_world(world_size):`")
    ranks = tuple(options.global_ranks_in_group or range(options.group_size))
    group = _GroupInfo(str(options.group_id), ranks)
    return ThreadedProcessGroup(session, group, options.group_rank)


def register_threaded_backend() -> None:
    """Register (or re-register over another) the ``threaded`` backend with c10d."""
    plugin = dist.Backend._plugins.get(BACKEND_NAME.upper())
    if plugin is not None and plugin.creator_fn is _create_threaded_pg:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create_threaded_pg, extended_api=True,
                                  devices=["cpu", "cuda"])


def install(session: ThreadedSession) -> None:
    """Give every thread its own c10d world and make ``session`` the active one."""
    global _active, _saved_world, _autograd_threads, _saved_excepthook
    missing = missing_threaded_hooks()
    if missing:
        raise RuntimeError("the threaded backend needs private torch hooks this torch "
                           f"({torch.__version__}) lacks: {', '.join(missing)}")
    with _session_lock:
        if _active is not None:
            raise RuntimeError("a threaded world is already running in this process; "
                               "threaded tests cannot nest or run concurrently")
        register_threaded_backend()
        c10d = dist.distributed_c10d
        _saved_world = c10d._world
        c10d._world = _per_thread_world_class()()
        torch._C._distributed_c10d._set_thread_isolation_mode(True)
        # Autograd's device threads would not see the rank thread's world.
        _autograd_threads = torch.autograd.set_multithreading_enabled(False)
        # Each init_process_group wraps sys.excepthook and nothing unwraps it:
        # thousands of threaded inits would nest it past the recursion limit.
        _saved_excepthook = sys.excepthook
        _active = session


def uninstall(session: ThreadedSession) -> None:
    """Undo :func:`install`; later ops of stray rank threads raise PeerFailed."""
    global _active, _saved_world, _autograd_threads, _saved_excepthook
    session.stop("the test ended")
    with _session_lock:
        if _active is not session:
            return
        dist.distributed_c10d._world = _saved_world
        torch._C._distributed_c10d._set_thread_isolation_mode(False)
        if _autograd_threads is not None:
            _autograd_threads.__exit__(None, None, None)
        sys.excepthook = _saved_excepthook
        _active = _saved_world = _autograd_threads = _saved_excepthook = None


class threaded_world:  # noqa: N801 - used as a context manager, like torch's
    """Context manager: a threaded world for ``world_size`` rank threads.

    Inside it, each rank thread may call ``init_process_group("threaded",
    rank=r, world_size=world_size, store=store)`` with one shared store; every
    wait ends by ``timeout`` seconds.
    """

    def __init__(self, world_size: int, timeout: float | None = None) -> None:
        self.session = ThreadedSession(world_size, timeout)

    def __enter__(self) -> ThreadedSession:
        install(self.session)
        return self.session

    def __exit__(self, *exc_info) -> None:
        uninstall(self.session)
