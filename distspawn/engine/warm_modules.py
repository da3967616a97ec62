"""In the rank server: import the test modules once, so that ranks find them loaded.

Run as a script, a test file is ``__main__`` and multiprocessing's forkserver
imports it before forking any rank. Under pytest or ``python -m unittest``,
``__main__`` is the runner, so each rank of each test imported the test module
and everything it imports (``torch.testing._internal`` alone costs about 1 s).
The test process tells the server those modules (over a socket, once it knows
them: pytest's collection), and the server imports them after its own preload.

What the server preloads must be indistinguishable, to a rank, from the rank
importing it itself. An import's side effects (a ``torch.library`` op, an entry
in a registry kept in C++) outlive any attempt to undo it, so nothing is ever
undone or dropped:
- the modules are imported in a child forked from the server, one by one,
  each checked after its import. A module whose import fails, takes longer
  than :data:`IMPORT_LIMIT_S`, or leaves anything running (a thread, a
  process, a socket, CUDA) ends that child: the server forks another, which
  imports the others without it. Once a child has imported all that it
  should, it becomes the server (ranks are forked from it) and the server it
  came from only waits for it to end. So each module is imported once when
  all goes well, and a process that imported a refused module never serves;
- every variable each import reads from the environment is recorded and sent
  back; the test process checks each rank's environment against the records
  before forking the rank, and restarts the server without a module whose
  record does not match (``distspawn.engine.rank_server``).
"""

from __future__ import annotations

import importlib
import json
import os
import select
import signal
import socket
import sys
import threading
from typing import Any, NoReturn

import distspawn_rank_server

from . import parent_death

IMPORT_LIMIT_S = 120.0  # a module whose import takes longer is left to the ranks


def serve(preload_failures: dict[str, str]) -> None:
    """Finish the server's start: report its preload, then warm the test modules.

    ``preload_failures``: the server's own imports that raised (module -> why).
    """
    report: dict[str, Any] = {
        "preload": distspawn_rank_server.preload_recording.stop(),
        "preload_failures": preload_failures,
        "modules": {}, "refused": {},
    }
    name = distspawn_rank_server.list_socket_name()
    if name is None:
        return
    try:
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        connection.connect("\0" + name)
    except OSError:
        return  # the test process left before the server was ready
    with connection:
        request = _receive(connection)
        if not preload_failures:
            _warm(request, report)
        try:
            connection.sendall(json.dumps(report).encode())
            # The end of the report, even while the server this one came from
            # (engine.warm_modules' successor) still holds the socket open.
            connection.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def _receive(connection: socket.socket) -> dict[str, Any]:
    # The test process answers once it knows every module (pytest: after
    # collection) and shuts its side down; it closes without a word when it
    # leaves without knowing.
    data = b""
    try:
        while chunk := connection.recv(65536):
            data += chunk
        message = json.loads(data or b"{}")
    except (OSError, ValueError):
        return {}
    return message if isinstance(message, dict) else {}


def _warm(request: dict[str, Any], report: dict[str, Any]) -> None:
    path = request.get("sys_path")
    if isinstance(path, list):
        # The server may have started before the test directories were added
        # (pytest adds them as it imports the test modules).
        sys.path[:] = [p for p in path if isinstance(p, str)]
    environ = request.get("environ")
    if isinstance(environ, dict):
        # As the test process has it now, after collection (conftests and
        # test modules may have set variables as they were imported).
        os.environ.clear()
        os.environ.update({str(k): str(v) for k, v in environ.items()})
        distspawn_rank_server.add_server_only_variables()
    pending = [name for name in request.get("modules", [])
               if isinstance(name, str) and name not in sys.modules]
    while pending:
        refused = _import_in_successor(pending, report)
        if refused is None:
            return  # imported, in this process: it serves from now on
        name, why_not = refused
        if name not in pending:  # the child ended before it named a module
            report["refused"].update({other: why_not for other in pending})
            return
        report["refused"][name] = why_not
        # What the child imported before it is not in this process: again.
        pending = [other for other in pending if other != name]


def _import_in_successor(names: list[str], report: dict[str, Any]) -> tuple[str, str] | None:
    """Import ``names`` in a child that serves in this process's place if all go well.

    Returns None in that child, once it has imported them (in this process it
    never returns then: it waits for the child to end, and ends with it), or,
    in this process, the module that ended the child and why.
    """
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        _import_here(names, report, write_end)
        return None
    os.close(write_end)
    with os.fdopen(read_end, "rb") as messages:
        outcome = _follow(pid, messages)
    if outcome is None:
        _wait_for_successor(pid)
    _, status = os.waitpid(pid, 0)
    name, why_not = outcome
    if why_not is None:  # ended without a word: the import ended the process
        why_not = (f"importing it ended the process (exit status "
                   f"{os.waitstatus_to_exitcode(status)})" if name
                   else "the rank server's child that was to import it ended at once")
    return name, why_not


def _import_here(names: list[str], report: dict[str, Any], write_end: int) -> None:
    # In the child. Killing the server it came from (the test process does,
    # to stop a server still importing) must end it too.
    server_pid = os.getppid()
    if not parent_death.end_with_parent() or os.getppid() != server_pid:
        os._exit(0)  # the server's own check sees this child gone without a word

    def tell(message: dict[str, str]) -> None:
        os.write(write_end, (json.dumps(message) + "\n").encode())

    for name in names:
        if name in sys.modules:  # imported with one before it
            continue
        tell({"importing": name})
        recording = distspawn_rank_server.EnvironRecording().start()
        try:
            why_not = _import_and_check(name)
        except BaseException as exc:  # noqa: BLE001 - reported, not raised
            why_not = f"importing it failed: {type(exc).__name__}: {exc}"
        record = recording.stop()
        if why_not is not None:
            tell({"refused": name, "why": why_not[:4000]})
            os._exit(0)
        report["modules"][name] = record
    tell({"done": ""})
    os.close(write_end)
    distspawn_rank_server.serve_from_this_process()


def _follow(pid: int, messages: Any) -> tuple[str, str | None] | None:
    """Read the child's messages: None once it has imported everything, else
    the module that ended it ("" before any) and why (None: it did not say)."""
    current = ""
    while True:
        ready, _, _ = select.select([messages], [], [], IMPORT_LIMIT_S)
        if not ready:
            os.kill(pid, signal.SIGKILL)
            return current, f"importing it took longer than {IMPORT_LIMIT_S:.0f} s"
        line = messages.readline()
        if not line:
            return current, None
        message = json.loads(line)
        if "done" in message:
            return None
        if "refused" in message:
            return message["refused"], message["why"]
        current = message["importing"]


def _wait_for_successor(pid: int) -> NoReturn:
    # The child serves now. This process stays its parent until it ends (the
    # test process knows this one as its server: it ends the child by killing
    # this one, or by closing the pipe both watch); then it leaves.
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as the serving child does
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    os._exit(max(os.waitstatus_to_exitcode(status), 0))


def _process_state() -> dict[str, Any]:
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    try:
        sockets = sum(1 for fd in os.listdir("/proc/self/fd")
                      if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"))
        native_threads = len(os.listdir("/proc/self/task"))
    except OSError:  # not Linux: the Python-level checks still hold
        sockets = native_threads = 0
    return {
        "threads": {t.ident: t.name for t in threading.enumerate()},
        "native_threads": native_threads,
        "sockets": sockets,
        "cuda": bool(cuda is not None and cuda.is_initialized()),
        "children": set(_child_pids()),
    }


def _child_pids() -> list[int]:
    try:
        with open(f"/proc/self/task/{os.getpid()}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def _import_and_check(name: str) -> str | None:
    before = _process_state()
    importlib.import_module(name)
    after = _process_state()
    new_threads = [n for i, n in after["threads"].items() if i not in before["threads"]]
    if new_threads:
        return f"importing it started thread(s) {', '.join(sorted(new_threads))}"
    if after["native_threads"] > before["native_threads"]:
        return (f"importing it started {after['native_threads'] - before['native_threads']} "
                "native thread(s)")
    if after["cuda"] and not before["cuda"]:
        return "importing it initialised CUDA"
    if after["sockets"] > before["sockets"]:
        return "importing it opened a socket"
    if after["children"] - before["children"]:
        return "importing it started a process"
    return None
