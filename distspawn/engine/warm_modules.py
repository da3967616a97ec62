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
- under pytest, the child may start on a guess (the files pytest is about to
  import, as it will name them) before collection is over, so that it imports
  them while the test process does. It then reads the list and checks the
  guess against it (:func:`_wrong_guess`); a wrong guess ends the child, and
  the server imports the list afresh, as above;
- every variable each import reads from the environment is recorded and sent
  back; the test process checks each rank's environment against the records
  before forking the rank, and restarts the server without a module whose
  record does not match (``distspawn.engine.rank_server``).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import json
import os
import select
import signal
import socket
import sys
import threading
from collections.abc import Callable
from typing import Any, NamedTuple, NoReturn

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
        lines = _Lines(connection)
        request = lines.next()
        guess = request.get("guess")
        if isinstance(guess, dict):
            # None: this process imported all on the guess, and serves now.
            request = {} if preload_failures else _warm_on_guess(guess, lines, report)
            if request == {}:  # the guess was left before the list was read
                request = lines.next()
        if not preload_failures and request is not None:
            _warm(request, report)
        try:
            connection.sendall(json.dumps(report).encode())
            # The end of the report, even while the server this one came from
            # (engine.warm_modules' successor) still holds the socket open.
            connection.shutdown(socket.SHUT_WR)
        except OSError:
            pass


class _Lines:
    """The test process's messages: one JSON object a line (``{}`` once it has
    shut its side, or left, or sent something else)."""

    def __init__(self, connection: socket.socket) -> None:
        self._connection = connection
        self._buffer = b""

    def next(self) -> dict[str, Any]:
        try:
            while b"\n" not in self._buffer:
                chunk = self._connection.recv(65536)
                if not chunk:
                    break
                self._buffer += chunk
        except OSError:
            return {}
        line, _, self._buffer = self._buffer.partition(b"\n")
        try:
            message = json.loads(line or b"{}")
        except ValueError:
            return {}
        return message if isinstance(message, dict) else {}


def _take_paths_and_environ(request: dict[str, Any]) -> None:
    path = request.get("sys_path")
    if isinstance(path, list):
        # The server may have started before the test directories were added
        # (pytest adds them as it imports the test modules).
        sys.path[:] = [p for p in path if isinstance(p, str)]
    environ = request.get("environ")
    if isinstance(environ, dict):
        # As the test process has it (after collection: conftests and test
        # modules may have set variables as they were imported).
        os.environ.clear()
        os.environ.update({str(k): str(v) for k, v in environ.items()})
        distspawn_rank_server.add_server_only_variables()


def _warm(request: dict[str, Any], report: dict[str, Any]) -> None:
    _take_paths_and_environ(request)
    pending = [name for name in request.get("modules", [])
               if isinstance(name, str) and name not in sys.modules
               and name not in report["refused"]]
    while pending:
        ended = _import_in_successor(lambda: _import_here(pending, report))
        if ended is None:
            return  # imported, in this process: it serves from now on
        name, why_not = ended.module, ended.why
        if name not in pending:  # the child ended before it named a module
            report["refused"].update({other: why_not for other in pending})
            return
        report["refused"][name] = why_not
        # What the child imported before it is not in this process: again.
        pending = [other for other in pending if other != name]


def _warm_on_guess(guess: dict[str, Any], lines: _Lines,
                   report: dict[str, Any]) -> dict[str, Any] | None:
    """Import the modules the test process guessed, while it imports them too.

    In a child, as :func:`_warm` does, which then reads the list and checks
    the guess against it (:func:`_wrong_guess`). It then imports the rest of
    the list and serves. On a guess that was wrong, the child ends and all it
    imported with it.

    Returns None in the child that serves; else the list as the child read
    it (to import afresh, less a module it refused), or ``{}`` where the child
    ended before reading it.
    """
    _take_paths_and_environ(guess)
    files = {entry[0]: entry[1] for entry in guess.get("modules", [])
             if isinstance(entry, list) and len(entry) == 2
             and all(isinstance(part, str) for part in entry)}
    names = [name for name in files if name not in sys.modules]
    ended = _import_in_successor(lambda: _import_guess_here(names, files, lines, report))
    if ended is None:
        return None
    request = ended.request
    # After the list, a module named is one of the list's own, not guessed
    # (a wrong guess ends the child before it imports any): refused.
    if request is not None and ended.module:
        report["refused"][ended.module] = ended.why
    return request or {}


class _ChildEnd(NamedTuple):
    """How a child that was to serve ended instead."""
    module: str  # the module it was importing ("" before any)
    why: str  # what ended it
    request: dict[str, Any] | None = None  # the list, where it had read it


def _import_in_successor(import_here: Callable[[], None]) -> _ChildEnd | None:
    """Run ``import_here`` in a child that serves in this process's place if all go well.

    Returns None in that child, once it has imported all (in this process it
    never returns then: it waits for the child to end, and ends with it), or,
    in this process, how the child ended.
    """
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        _messages_fd[0] = write_end
        import_here()
        return None
    os.close(write_end)
    with os.fdopen(read_end, "rb") as messages:
        ended = _follow(pid, messages)
    if ended is None:
        _wait_for_successor(pid)
    _, status = os.waitpid(pid, 0)
    if ended.why:
        return ended
    # Ended without a word: the import ended the process.
    why = (f"importing it ended the process (exit status {os.waitstatus_to_exitcode(status)})"
           if ended.module else "the rank server's child that was to import it ended at once")
    return ended._replace(why=why)


_messages_fd = [-1]  # in a child: where it tells the server how its imports go


def _tell(message: dict[str, Any]) -> None:
    data = (json.dumps(message) + "\n").encode()
    while data:
        data = data[os.write(_messages_fd[0], data):]


def _become_successor() -> None:
    # In the child. Killing the server it came from (the test process does,
    # to stop a server still importing) must end it too.
    server_pid = os.getppid()
    if not parent_death.end_with_parent() or os.getppid() != server_pid:
        os._exit(0)  # the server's own check sees this child gone without a word


def _import_each(names: list[str], report: dict[str, Any]) -> tuple[str, str] | None:
    """Import ``names`` one by one; the first that failed or was refused, and why."""
    for name in names:
        if name in sys.modules:  # imported with one before it
            continue
        _tell({"importing": name})
        recording = distspawn_rank_server.EnvironRecording().start()
        try:
            why_not = _import_and_check(name)
        except BaseException as exc:  # noqa: BLE001 - reported, not raised
            why_not = f"importing it failed: {type(exc).__name__}: {exc}"
        record = recording.stop()
        if why_not is not None:
            return name, why_not[:4000]
        report["modules"][name] = record
    return None


def _import_here(names: list[str], report: dict[str, Any]) -> None:
    _become_successor()
    _import_then_serve(names, report)


def _import_then_serve(names: list[str], report: dict[str, Any]) -> None:
    refused = _import_each(names, report)
    if refused is not None:
        _tell({"refused": refused[0], "why": refused[1]})
        os._exit(0)
    _tell({"done": ""})
    os.close(_messages_fd[0])
    distspawn_rank_server.serve_from_this_process()


def _import_guess_here(names: list[str], files: dict[str, str], lines: _Lines,
                       report: dict[str, Any]) -> None:
    _become_successor()
    loaded_before = set(sys.modules)
    failed = _import_each(names, report)
    if failed is not None:
        _tell({"stale": f"guessed test module {failed[0]}: {failed[1]}"})
        os._exit(0)
    _tell({"waiting": ""})  # for the list: as long as the test process collects
    request = lines.next()
    _tell({"list": request})
    top_level = {name.partition(".")[0] for name in sys.modules if name not in loaded_before}
    wrong = _wrong_guess(files, request, report, top_level)
    if wrong is not None:
        _tell({"stale": wrong})
        os._exit(0)
    _take_paths_and_environ(request)
    _import_then_serve([name for name in request.get("modules", []) if isinstance(name, str)],
                       report)


def _wrong_guess(files: dict[str, str], request: dict[str, Any], report: dict[str, Any],
                 top_level: set[str]) -> str | None:
    """How the guess differs from the list, in what a rank could tell (None: it does not).

    ``top_level``: the top-level modules the guess imported. pytest adds to
    ``sys.path`` as it imports files collected after the guess (each test
    folder outside a package); a rank would not notice unless one of those
    modules is found elsewhere on the list's ``sys.path``.
    """
    listed = request.get("files") or {}
    for name, file in files.items():
        if name not in request.get("modules", []):
            return f"{name} is not a test module the ranks need"
        if not isinstance(listed.get(name), str) or not _same_file(listed[name], file):
            return f"{name} is {listed.get(name)!r}, not {file!r}"
    listed_path = request.get("sys_path")
    if not isinstance(listed_path, list) or not all(isinstance(p, str) for p in listed_path):
        return "the list gives no sys.path"
    if listed_path != sys.path:
        for name in sorted(top_level):
            if _found_at(name, sys.path) != _found_at(name, listed_path):
                return f"{name} is found elsewhere on the list's sys.path"
    environ = request.get("environ") or {}
    for name, record in report["modules"].items():
        stale = distspawn_rank_server.stale_reads(record, environ)
        if stale:
            return f"importing {name} read {', '.join(stale[:5])}, since changed"
    return None


def _found_at(name: str, path: list[str]) -> tuple[Any, ...] | None:
    # Where the import system's path search finds a top-level module on
    # ``path``: its file, and a package's folders (a namespace package's span
    # every entry that has a part of it).
    try:
        spec = importlib.machinery.PathFinder.find_spec(name, path)
    except (ImportError, ValueError):
        return ("unfindable",)
    if spec is None:
        return None
    return spec.origin, tuple(spec.submodule_search_locations or ())


def _same_file(one: str, other: str) -> bool:
    try:
        return os.path.samefile(one, other)
    except OSError:
        return False


def _follow(pid: int, messages: Any) -> _ChildEnd | None:
    """Read the child's messages: None once it has imported everything, else
    how it ended (``why`` empty: it did not say)."""
    current, request, limit = "", None, IMPORT_LIMIT_S
    while True:
        ready, _, _ = select.select([messages], [], [], limit)
        if not ready:
            os.kill(pid, signal.SIGKILL)
            return _ChildEnd(current, f"importing it took longer than {IMPORT_LIMIT_S:.0f} s",
                             request)
        line = messages.readline()
        if not line:
            return _ChildEnd(current, "", request)
        message = json.loads(line)
        limit = IMPORT_LIMIT_S
        if "done" in message:
            return None
        if "refused" in message:
            return _ChildEnd(message["refused"], message["why"], request)
        if "stale" in message:
            return _ChildEnd(current, message["stale"], request)
        if "waiting" in message:
            limit = None  # the test process is collecting
        elif "list" in message:
            current, request = "", message["list"]
        else:
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
