"""Where the rank threads' calls meet: the rendezvous of the ``threaded`` backend.

Every rank deposits a :class:`~distspawn.backends.threaded_ops.Call` under the
key (group name, n-th collective on that group) and gets a
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
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Iterator

import torch
import torch.distributed as dist
from torch.futures import Future

from .threaded_ops import Call, Incompatible, tensor_summary


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


@dataclass(slots=True)
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
        # Keyed by the group's name and members: c10d can give disjoint groups
        # one name (each rank creates only its own subgroup in
        # _find_or_create_pg_by_ranks_and_tag, named by its own group count).
        self._collectives: dict[tuple[_GroupInfo, int], _Rendezvous] = {}
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
        # The hot path of every collective: each rank thread runs it in turn
        # under the GIL, so every step here is paid world-size times per op.
        with self._cond:
            self._raise_if_stopped()
            key = (group, seq)
            rendezvous = self._collectives.get(key)
            if rendezvous is None:
                rendezvous = self._collectives[key] = _Rendezvous(group, seq=seq)
            calls = rendezvous.calls
            calls[group_rank] = call
            if len(calls) == group.size:
                del self._collectives[key]
                self._complete(rendezvous, self._run_collective)
            settle = self._take_unsettled()
        if settle:
            _settle_all(settle)
        return rendezvous

    def _run_collective(self, rendezvous: _Rendezvous) -> None:
        calls = [rendezvous.calls[r] for r in range(rendezvous.group.size)]
        first_key = calls[0].match_key()
        if any(c.match_key() != first_key for c in calls[1:]):
            raise CollectiveMismatchError(
                f"collective mismatch: {self._where(rendezvous)}: the ranks' calls "
                "differ:\n" + self._call_lines(rendezvous, calls))
        try:
            with torch.no_grad():
                calls[0].execute([c.payload for c in calls])
        except Incompatible as exc:
            raise CollectiveMismatchError(
                f"collective mismatch: {self._where(rendezvous)}: {exc}\n"
                + self._call_lines(rendezvous, calls)) from None
        except Exception as exc:
            raise ThreadedBackendError(
                f"{calls[0].describe()} on {self._where(rendezvous)} failed: "
                f"{type(exc).__name__}: {exc}") from exc

    @staticmethod
    def _where(rendezvous: _Rendezvous) -> str:
        # Worded as process ranks' stall reports are (engine.stall).
        return f"collective #{rendezvous.seq + 1} on {rendezvous.group.label()}"

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
        return (send.group == recv.group and send.dst == recv.dst
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
            settle = self._take_unsettled()
        _settle_all(settle)

    def _take_unsettled(self) -> list:
        settle, self._unsettled = self._unsettled, []
        return settle

    # -- waiting ---------------------------------------------------------------

    def wait(self, pending: _Pending, rank: int, timeout: float | None = None) -> None:
        """Block ``rank`` until ``pending`` completes; raise if it cannot."""
        if not pending.done:  # done already: the rank that completed it, or an async op
            self._block_until_done(pending, rank, timeout)
        if pending.error is not None:
            error = pending.error
            raise type(error)(str(error)) from error.__cause__

    def _block_until_done(self, pending: _Pending, rank: int, timeout: float | None) -> None:
        # Every rank but the last to arrive passes here once per collective,
        # one after another under the GIL: keep the loop lean.
        give_up = None if timeout is None else time.monotonic() + timeout
        if self.deadline is None or give_up is None:
            wake_by = self.deadline if give_up is None else give_up
        else:
            wake_by = min(self.deadline, give_up)
        with self._cond:
            self._waiting[rank] = _Waiter(pending, timeout is not None)
            try:
                while not pending.done:
                    now = None
                    if wake_by is not None:
                        now = time.monotonic()
                        if self.deadline is not None and now >= self.deadline:
                            raise DeadlineReached(
                                f"rank {rank}: {pending.description} on "
                                f"{pending.group.label()} did not complete before the "
                                f"test's deadline ({self.timeout:g} s): "
                                f"{pending.waiting_for()}")
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
                    self._cond.wait(None if now is None else wake_by - now)
            finally:
                del self._waiting[rank]

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


# The session installed in this process (threaded_pg installs it). It lives
# here, beside the class, so the process-group adapter can reach it without
# importing the module that installs it.
_installed: ThreadedSession | None = None


def active_session() -> ThreadedSession | None:
    """The threaded session now installed in this process, if any."""
    return _installed


def set_active_session(session: ThreadedSession | None) -> None:
    """Record ``session`` as installed (``None``: none is)."""
    global _installed
    _installed = session


def _settle_all(settle: list) -> None:
    for future, outputs, pending in settle:
        _settle(future, outputs, pending)


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
        if timeout is None:
            pass  # c10d's own wait after every blocking op: no parsing on the hot path
        elif isinstance(timeout, timedelta):
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
