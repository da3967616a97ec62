"""In the rank server: the children that import test modules, and may serve in its place.

The server forks a child to import test modules (``engine.warm_modules``). The
child tells the server, one JSON line at a time, how its imports go; the
server follows it (:func:`follow`), with a time limit on each import. A child
that imported all it should becomes the server's successor: ranks are forked
from it, and the server waits for it to end (:func:`wait_for_successor`) or
ends it (:func:`stop_successor`) to fork another for another test module.
"""

from __future__ import annotations

import json
import os
import select
import signal
from typing import Any, NamedTuple, NoReturn

from . import forked_exit, parent_death

IMPORT_LIMIT_S = 120.0  # a module whose import takes longer is left to the ranks
STOP_WAIT_S = 10.0  # for a successor asked to end to do so; then it is killed


class ChildEnd(NamedTuple):
    """How a child that was to serve ended instead."""
    module: str  # the module it was importing ("" before any)
    why: str  # what ended it
    request: dict[str, Any] | None = None  # the list, where it had read it


# -- in a child --------------------------------------------------------------

messages_fd = [-1]  # in a child: where it tells the server how its imports go


def tell(message: dict[str, Any]) -> None:
    """In a child: tell the server ``message`` (see :func:`follow`)."""
    data = (json.dumps(message) + "\n").encode()
    while data:
        data = data[os.write(messages_fd[0], data):]


def become_successor() -> None:
    """In a child: be ready to serve in the server's place."""
    # Killing the server it came from (the test process does,
    # to stop a server still importing) must end it too.
    server_pid = os.getppid()
    if not parent_death.end_with_parent() or os.getppid() != server_pid:
        os._exit(0)  # the server's own check sees this child gone without a word
    # What the server made (torch 2.8's torch.distributed.nn makes a
    # temporary folder it writes to later) is the server's to clean up: it
    # forks the next successor from it.
    forked_exit.note_inherited()
    # Asked to end (another test module's successor takes its place), it
    # leaves as when the test process goes: through its at-exit clean-ups.
    # Not in what it forks: a rank ends on SIGTERM, as a fresh process does.
    successor_pid = os.getpid()
    signal.signal(signal.SIGTERM, _leave)
    os.register_at_fork(after_in_child=lambda: _default_sigterm_in_child_of(successor_pid))


def _leave(signum: int, frame: Any) -> None:
    raise SystemExit(0)


def _default_sigterm_in_child_of(successor_pid: int) -> None:
    if os.getppid() == successor_pid:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


# -- in the server -------------------------------------------------------------

class Messages:
    """A child's messages to the server, one JSON object a line, each waited
    for at most a given time. (A buffered file's ``readline`` may take several
    lines in one read, and ``select`` on its pipe then waits for more while the
    next line is already read.)"""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._buffer = b""

    def next(self, wait_s: float | None) -> dict[str, Any] | None:
        """The next message (None: the child closed its end); raises
        ``TimeoutError`` where none came within ``wait_s``."""
        while b"\n" not in self._buffer:
            ready, _, _ = select.select([self._fd], [], [], wait_s)
            if not ready:
                raise TimeoutError
            chunk = os.read(self._fd, 65536)
            if not chunk:
                return None
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return json.loads(line)

    def close(self) -> None:
        os.close(self._fd)


def follow(pid: int, messages: Messages) -> ChildEnd | None:
    """Read the child's messages: None once it has imported everything, else
    how it ended (``why`` empty: it did not say)."""
    current, request, limit = "", None, IMPORT_LIMIT_S
    while True:
        try:
            message = messages.next(limit)
        except TimeoutError:
            os.kill(pid, signal.SIGKILL)
            return ChildEnd(current, f"importing it took longer than {IMPORT_LIMIT_S:.0f} s",
                            request)
        if message is None:
            return ChildEnd(current, "", request)
        limit = IMPORT_LIMIT_S
        if "done" in message:
            return None
        if "refused" in message:
            return ChildEnd(message["refused"], message["why"], request)
        if "stale" in message:
            return ChildEnd(current, message["stale"], request)
        if "waiting" in message:
            limit = None  # the test process is collecting
        elif "list" in message:
            current, request = "", message["list"]
        else:
            current = message["importing"]


def wait_for_successor(pid: int) -> NoReturn:
    """Wait for the successor ``pid`` to end, and leave with it."""
    # The test process has closed the connection (it is leaving). This
    # process stays the child's parent until it ends (the test process knows
    # this one as its server: it ends the child by killing this one, or by
    # closing the pipe both watch); then it leaves.
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    forked_exit.run_exit_finalizers()  # what it made itself: its successors left it
    os._exit(max(os.waitstatus_to_exitcode(status), 0))


def stop_successor(pid: int) -> None:
    """End the successor ``pid``, which serves, to fork another in its place."""
    # The test process asks only once no rank forked from it still runs. It
    # ends as it would once the test process leaves (SystemExit in its
    # forkserver loop: its at-exit clean-ups run), or is killed.
    try:
        os.kill(pid, signal.SIGTERM)
        if not _ends_within(pid, STOP_WAIT_S):
            os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def _ends_within(pid: int, wait_s: float) -> bool:
    try:
        watch = os.pidfd_open(pid)
    except (AttributeError, OSError):  # no pidfd here: no waiting with a limit
        return False
    try:
        ready, _, _ = select.select([watch], [], [], wait_s)
        return bool(ready)
    finally:
        os.close(watch)
