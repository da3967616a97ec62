"""Test modules imported once, into the rank server, instead of by every rank.

Run as a script, a test file is ``__main__`` and multiprocessing's forkserver
imports it before forking any rank. Under pytest or ``python -m unittest``,
``__main__`` is the runner, so each rank of each test imported the test module
and everything it imports (``torch.testing._internal`` alone costs about 1 s).
The test process names those modules here before the server starts; the server
imports each one, and ranks forked from it find them already loaded.

Importing into a process that will fork is only safe for modules whose import
leaves nothing running. So the server first imports each module in a throwaway
child (forked from it, and never forked from): a module whose import started a
thread, a process or a socket, or initialised CUDA, is not imported into the
server; the test process says why, once, and ranks import it themselves as
before.

A module imported into the server read the environment as it was when the
server started; a rank imported it with the environment its test had set up.
The server records which variables each warm import read (the module and every
module it pulled in), and a rank whose environment differs on any of them drops
those modules, so they are imported afresh with the rank's environment.
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
from dataclasses import dataclass, field
from typing import Any

MODULES_VAR = "DISTSPAWN_WARM_MODULES"  # set only while the server starts
NOTES_VAR = "DISTSPAWN_WARM_NOTES"
LIST_SOCKET_VAR = "DISTSPAWN_WARM_LIST_SOCKET"  # more modules are sent there
PROBE_LIMIT_S = 120.0  # a module whose import takes longer is left to the ranks


@dataclass
class WarmImport:
    """What importing one test module into the server did."""

    environ_read: dict[str, str | None] = field(default_factory=dict)
    read_whole_environ: dict[str, str] | None = None
    modules: tuple[str, ...] = ()


# In the server, filled at its start; ranks inherit it by being forked.
_warm: dict[str, WarmImport] = {}


# -- in the server ----------------------------------------------------------

def warm_from_environment() -> None:
    """Import the modules the test process asked for (called by the preload)."""
    names = [n for n in os.environ.pop(MODULES_VAR, "").split(",") if n]
    notes_path = os.environ.pop(NOTES_VAR, None)
    list_socket = os.environ.pop(LIST_SOCKET_VAR, None)
    if list_socket:
        names += [n for n in _receive_module_list(list_socket) if n not in names]
    notes = {}
    for name in names:
        why_not = _probe(name)
        if why_not is None:
            try:
                _warm[name] = _import_recording_environ(name)
            except BaseException as exc:  # noqa: BLE001 - the ranks will import it
                why_not = f"importing it failed: {type(exc).__name__}: {exc}"
        if why_not is not None:
            notes[name] = why_not
    if notes_path:
        try:  # never created here: a test process that already left removed it
            fd = os.open(notes_path, os.O_WRONLY | os.O_TRUNC)
        except OSError:
            return
        with os.fdopen(fd, "w") as out:
            json.dump(notes, out)


def _receive_module_list(name: str) -> list[str]:
    # The test process answers once it knows every module (pytest: after
    # collection), or closes the socket when it leaves without knowing.
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.connect("\0" + name)
            data = b""
            while chunk := connection.recv(65536):
                data += chunk
        message = json.loads(data or b"{}")
        names = message.get("modules", [])
        path = message.get("sys_path")
    except (OSError, ValueError, AttributeError):
        return []
    if isinstance(path, list):
        sys.path[:] = [p for p in path if isinstance(p, str)]
    return [n for n in names if isinstance(n, str)]


def _probe(name: str) -> str | None:
    """Import ``name`` in a throwaway child; why it is unsafe, or None."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        try:
            why_not = _import_and_check(name)
        except BaseException as exc:  # noqa: BLE001 - reported, not raised
            why_not = f"importing it failed: {type(exc).__name__}: {exc}"
        os.write(write_end, (why_not or "").encode()[:4000])
        os._exit(0)
    os.close(write_end)
    try:
        ready, _, _ = select.select([read_end], [], [], PROBE_LIMIT_S)
        if not ready:
            os.kill(pid, signal.SIGKILL)
            return f"importing it took longer than {PROBE_LIMIT_S:.0f} s"
        answer = b""
        while chunk := os.read(read_end, 4096):
            answer += chunk
        return answer.decode(errors="replace") or None
    finally:
        os.close(read_end)
        os.waitpid(pid, 0)


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


class _RecordingEnviron(type(os.environ)):  # type: ignore[misc]
    """``os.environ`` itself (same data), noting every variable read through it."""

    def __getitem__(self, key: str) -> str:
        try:
            value = super().__getitem__(key)
        except KeyError:
            self._distspawn_reads.setdefault(key, None)
            raise
        self._distspawn_reads.setdefault(key, value)
        return value

    def __iter__(self):
        self._distspawn_read_all = True
        return super().__iter__()


def _import_recording_environ(name: str) -> WarmImport:
    original = os.environ
    recording = object.__new__(_RecordingEnviron)
    recording.__dict__.update(original.__dict__)  # shares the variables themselves
    recording._distspawn_reads = {}
    recording._distspawn_read_all = False
    modules_before = set(sys.modules)
    os.environ = recording
    try:
        importlib.import_module(name)
    finally:
        os.environ = original
    whole = dict(original) if recording._distspawn_read_all else None
    return WarmImport(dict(recording._distspawn_reads), whole,
                      tuple(set(sys.modules) - modules_before))


# -- in a rank --------------------------------------------------------------

# Set by pytest for each test: a module that read the whole environment did
# not read this one's value in any way that could matter.
_PER_TEST_VARIABLES = ("PYTEST_CURRENT_TEST",)


def _comparable(environ: Any) -> dict[str, str]:
    return {k: v for k, v in environ.items() if k not in _PER_TEST_VARIABLES}


def drop_stale_imports() -> None:
    """Forget warm imports that read the environment differently from this rank's.

    Modules warmed after a stale one go too: they may hold its classes (a test
    module importing a base from a module that read the environment), and a
    class whose module is imported again is no longer the one pickle finds.
    """
    stale = False
    for record in _warm.values():  # in the order they were imported
        if not stale:
            if record.read_whole_environ is not None:
                stale = _comparable(record.read_whole_environ) != _comparable(os.environ)
            else:
                stale = any(os.environ.get(k) != v for k, v in record.environ_read.items())
        if stale:
            for module in record.modules:
                sys.modules.pop(module, None)
    _warm.clear()
