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
  than :data:`successors.IMPORT_LIMIT_S`, or leaves anything running (a thread, a
  process, a socket, CUDA) ends that child: the server forks another, which
  imports the others without it. Once a child has imported all that it
  should, it becomes the server (ranks are forked from it) and the server it
  came from, which holds torch and distspawn but no test module, waits: for
  it to end, or for the test process to ask for another test module (the
  server holds one at a time, see ``distspawn.engine.rank_server``), when it
  ends that child and forks another for the new module. So each module is
  imported once when all goes well, a switch imports no torch again, and a
  process that imported a refused module never serves;
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

import importlib.machinery
import json
import os
import signal
import socket
import sys
from collections.abc import Callable
from typing import Any, NamedTuple

from ..early import rank_server_boot

from . import forked_exit, import_checks, leftovers, successors



def serve(preload_failures: dict[str, str]) -> None:
    """Finish the server's start: report its preload, then warm the test modules.

    ``preload_failures``: the server's own imports that raised (module -> why).
    Where they all imported, this process never serves: a successor does,
    with the test module, and this process (torch and distspawn loaded, no
    test module) stays to fork the next successor when the test process asks
    for another test module (see :func:`_serve_in_turn`).
    """
    report: dict[str, Any] = {
        "preload": rank_server_boot.preload_recording.stop(),
        "preload_failures": preload_failures,
        "modules": {}, "refused": {}, "switch": False,
    }
    connection = rank_server_boot.connect_to_test_process()
    if connection is None:
        return  # no hand-over, or the test process left before the server was ready
    with connection:
        lines = _Lines(connection)
        request = lines.next()
        if preload_failures:
            if "guess" in request:
                lines.next()  # the list: read, though nothing more is imported
            _send_report(connection, report)
            return
        guess = request.get("guess")
        # None in the process that serves from now on; a successor's pid in
        # the one it came from; else the list, to import afresh.
        outcome: int | dict[str, Any] | None = request
        if isinstance(guess, dict):
            outcome = _warm_on_guess(guess, lines, report)
            if outcome == {}:  # the guess was left before the list was read
                outcome = lines.next()
        if isinstance(outcome, dict):
            outcome = _warm(outcome, report)
        if outcome is not None:
            _serve_in_turn(outcome, lines, report)  # never returns here
        _send_report(connection, report)


def _send_report(connection: socket.socket, report: dict[str, Any]) -> None:
    # One line: the process a successor came from keeps the connection open
    # for the next test module, so its end is not the report's. It names the
    # folders torch made at import here, for the test process to remove should
    # everything be killed at once (the server's own exit removes them).
    report["exit_folders"] = sorted(leftovers.torch_exit_folders())
    try:
        connection.sendall(json.dumps(report).encode() + b"\n")
    except OSError:
        pass


def _serve_in_turn(successor: int, lines: "_Lines", report: dict[str, Any]) -> None:
    """In the process a successor serves for: wait for the test process to ask
    for another test module, and fork a successor for it in place of the last.

    The test process may name the module it expects to ask for next
    (``{"prepare": ...}``, as the list is sent): a successor imports it
    meanwhile, and waits (:func:`_prepare`). Asked for that module, with the
    same ``sys.path``, and with an environment in which its imports read what
    they read then, that one serves; otherwise it ends, and one imports the
    module afresh. Returns in the new successor, which serves; otherwise
    never: this process ends with the last successor, once the test process
    has gone.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as the serving successor does
    prepared: _Prepared | None = None
    while True:
        request = lines.next()
        if isinstance(request.get("prepare"), dict):
            if prepared is None:
                prepared = _prepare(request["prepare"], report)
                if prepared is None:
                    return  # in the prepared successor, asked to serve
            continue
        if prepared is not None and not request:
            prepared.abandon()
        if not request:  # the test process has gone (or closed the connection)
            successors.wait_for_successor(successor)
        successors.stop_successor(successor)
        report["modules"] = {}
        taken = prepared.take(request, report) if prepared is not None else None
        prepared = None
        outcome = taken or _warm(request, report)
        if outcome is None:
            return
        successor = outcome


class _Prepared(NamedTuple):
    """A successor that imported the module the test process expects to ask for next."""
    pid: int
    request: dict[str, Any]  # what it was told to import
    messages: successors.Messages
    go: int  # this process's end of the pipe it waits on

    def take(self, request: dict[str, Any], report: dict[str, Any]) -> int | None:
        """Have it serve for ``request``, if it fits; its pid then, else None."""
        fits = all(request.get(key) == self.request.get(key) for key in ("modules", "sys_path"))
        follow = successors.follow
        ended = follow(self.pid, self.messages) if fits else None  # its imports
        if ended is not None:  # refused one, or ended
            if ended.module and ended.why:
                report["refused"][ended.module] = ended.why
        elif fits and self._tell_go(request) and follow(self.pid, self.messages) is None:
            os.close(self.go)
            self.messages.close()
            return self.pid
        self.abandon()  # (an import read what the request has otherwise: it ended)
        return None

    def _tell_go(self, request: dict[str, Any]) -> bool:
        data = json.dumps(request).encode() + b"\n"
        try:
            while data:
                data = data[os.write(self.go, data):]
        except OSError:
            return False
        return True

    def abandon(self) -> None:
        os.close(self.go)  # it ends, as it finds the pipe closed (or is ended)
        self.messages.close()
        successors.stop_successor(self.pid)


def _prepare(request: dict[str, Any], report: dict[str, Any]) -> _Prepared | None:
    # None in the child, once asked to serve.
    names = [name for name in request.get("modules", [])
             if isinstance(name, str) and name not in report["refused"]]
    go_read, go_write = os.pipe()
    pid, messages = _fork_telling()
    if pid == 0:
        os.close(go_write)
        try:
            if _serve_when_asked(request, names, go_read, report):
                return None
        except BaseException:  # noqa: BLE001 - it must never serve unasked
            pass
        forked_exit.run_own()  # (the server's own at-exit clean-ups are not its)
        os._exit(0)
    os.close(go_read)
    return _Prepared(pid, request, messages, go_write)


def _serve_when_asked(request: dict[str, Any], names: list[str], go_read: int,
                      report: dict[str, Any]) -> bool:
    """In a prepared successor: import ``names``, then wait to be asked to serve.

    True once asked, with an environment in which the imports would read
    what they read; False where a module was refused, it is not wanted, or
    the environment asked with differs.
    """
    successors.become_successor()
    _take_paths_and_environ(request)
    refused = _import_each(names, report)
    if refused is not None:
        successors.tell({"refused": refused[0], "why": refused[1]})
        return False
    successors.tell({"done": ""})
    with os.fdopen(go_read, "rb") as go:
        line = go.readline()
    if not line:
        return False  # not wanted
    asked = json.loads(line)
    for name, record in report["modules"].items():
        stale = rank_server_boot.stale_reads(record, asked.get("environ") or {})
        if stale:
            successors.tell({"stale": f"importing {name} read {', '.join(stale[:5])}"})
            return False
    _take_paths_and_environ(asked)
    _serve_from_here(report)
    return True


class _Lines:
    """The test process's messages: one JSON object a line (``{}`` once it has
    shut its side, or left, or sent something else).

    Reads no further than the line it returns: the next is for whichever
    process reads next (a child forked after this read, or this process once
    its successor is asked to end)."""

    def __init__(self, connection: socket.socket) -> None:
        self._connection = connection

    def next(self) -> dict[str, Any]:
        line = b""
        try:
            while not line.endswith(b"\n"):
                ahead = self._connection.recv(65536, socket.MSG_PEEK)
                if not ahead:
                    break
                end = ahead.find(b"\n")
                line += self._connection.recv(len(ahead) if end < 0 else end + 1)
        except OSError:
            return {}
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
        rank_server_boot.add_server_only_variables()


def _warm(request: dict[str, Any], report: dict[str, Any]) -> int | None:
    """Import the request's test modules in a successor (with none, one all
    the same: it can be replaced). Returns None in the process that serves
    from now on; in this process, while a successor serves, its pid."""
    _take_paths_and_environ(request)
    pending = [name for name in request.get("modules", [])
               if isinstance(name, str) and name not in sys.modules
               and name not in report["refused"]]
    while True:
        ended = _import_in_successor(lambda: _import_here(pending, report))
        if not isinstance(ended, successors.ChildEnd):
            return ended
        name, why_not = ended.module, ended.why
        if name not in pending:  # the child ended before it named a module
            report["refused"].update({other: why_not for other in pending})
            return None  # this process serves, as it is
        report["refused"][name] = why_not
        # What the child imported before it is not in this process: again.
        pending = [other for other in pending if other != name]


def _warm_on_guess(guess: dict[str, Any], lines: _Lines,
                   report: dict[str, Any]) -> int | dict[str, Any] | None:
    """Import the modules the test process guessed, while it imports them too.

    In a child, as :func:`_warm` does, which then reads the list and checks
    the guess against it (:func:`_wrong_guess`). It then imports the rest of
    the list and serves. On a guess that was wrong, the child ends and all it
    imported with it.

    Returns None in the child that serves, and its pid in this process;
    else the list as the child read it (to import afresh, less a module it
    refused), or ``{}`` where the child ended before reading it.
    """
    _take_paths_and_environ(guess)
    files = {entry[0]: entry[1] for entry in guess.get("modules", [])
             if isinstance(entry, list) and len(entry) == 2
             and all(isinstance(part, str) for part in entry)}
    names = [name for name in files if name not in sys.modules]
    ended = _import_in_successor(lambda: _import_guess_here(names, files, lines, report))
    if not isinstance(ended, successors.ChildEnd):
        return ended
    request = ended.request
    # After the list, a module named is one of the list's own, not guessed
    # (a wrong guess ends the child before it imports any): refused.
    if request is not None and ended.module:
        report["refused"][ended.module] = ended.why
    return request or {}


def _import_in_successor(import_here: Callable[[], None]) -> successors.ChildEnd | int | None:
    """Run ``import_here`` in a child that serves in this process's place if all go well.

    Returns None in that child, once it has imported all; in this process,
    the child's pid once it serves, or how it ended.
    """
    pid, messages = _fork_telling()
    if pid == 0:
        import_here()
        return None
    try:
        ended = successors.follow(pid, messages)
    finally:
        messages.close()
    if ended is None:
        return pid
    _, status = os.waitpid(pid, 0)
    if ended.why:
        return ended
    # Ended without a word: the import ended the process.
    why = (f"importing it ended the process (exit status {os.waitstatus_to_exitcode(status)})"
           if ended.module else "the rank server's child that was to import it ended at once")
    return ended._replace(why=why)


def _fork_telling() -> tuple[int, successors.Messages | None]:
    """Fork a child that tells this process how its imports go: 0 and None
    in the child (it tells through ``successors.tell``); in this process,
    the child's pid and its ``successors.Messages``."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        successors.messages_fd[0] = write_end
        return 0, None
    os.close(write_end)
    return pid, successors.Messages(read_end)


def _import_each(names: list[str], report: dict[str, Any]) -> tuple[str, str] | None:
    """Import ``names`` one by one; the first that failed or was refused, and why."""
    for name in names:
        if name in sys.modules:  # imported with one before it
            continue
        successors.tell({"importing": name})
        recording = rank_server_boot.EnvironRecording().start()
        try:
            why_not = import_checks.import_and_check(name)
        except BaseException as exc:  # noqa: BLE001 - reported, not raised
            why_not = f"importing it failed: {type(exc).__name__}: {exc}"
        record = recording.stop()
        if why_not is not None:
            return name, why_not[:4000]
        report["modules"][name] = record
    return None


def _import_here(names: list[str], report: dict[str, Any]) -> None:
    successors.become_successor()
    _import_then_serve(names, report)


def _import_then_serve(names: list[str], report: dict[str, Any]) -> None:
    refused = _import_each(names, report)
    if refused is not None:
        successors.tell({"refused": refused[0], "why": refused[1]})
        os._exit(0)
    _serve_from_here(report)


def _serve_from_here(report: dict[str, Any]) -> None:
    # In a successor that imported all it should: it serves from now on.
    report["switch"] = True  # the server it came from can fork another
    successors.tell({"done": ""})
    os.close(successors.messages_fd[0])
    rank_server_boot.serve_from_this_process()


def _import_guess_here(names: list[str], files: dict[str, str], lines: _Lines,
                       report: dict[str, Any]) -> None:
    successors.become_successor()
    loaded_before = set(sys.modules)
    failed = _import_each(names, report)
    if failed is not None:
        successors.tell({"stale": f"guessed test module {failed[0]}: {failed[1]}"})
        os._exit(0)
    successors.tell({"waiting": ""})  # for the list: as long as the test process collects
    request = lines.next()
    successors.tell({"list": request})
    top_level = {name.partition(".")[0] for name in sys.modules if name not in loaded_before}
    wrong = _wrong_guess(files, request, report, top_level)
    if wrong is not None:
        successors.tell({"stale": wrong})
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
        stale = rank_server_boot.stale_reads(record, environ)
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
