"""How rank processes start: the choice of multiprocessing start method.

Launchers differ only in how a rank's process comes to exist; everything the
rank does afterwards is the same (see ``worker.child_main``). The choice is
made per class (``start_method`` attribute) or per run (the environment
variable below), never by changing the global multiprocessing start method.
"""

from __future__ import annotations

import atexit
import json
import multiprocessing.connection
import multiprocessing.forkserver
import os
import signal
import socket
import sys
import tempfile
import threading
import warnings
from collections.abc import Iterable
from typing import Any

import torch
import torch.multiprocessing as mp

from . import warm_modules

START_METHOD_ENV = "DISTSPAWN_START_METHOD"
START_METHODS = ("spawn", "fork", "forkserver")
# A preloaded forkserver gives every test brand-new rank processes, forked from
# a clean server (never from the test process), without importing torch again.
DEFAULT_START_METHOD = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
# What the forkserver imports once: the script being run (as multiprocessing
# does by default) and everything a rank needs (see distspawn.engine.preload).
FORKSERVER_PRELOAD = ["__main__", "distspawn.engine.preload"]
LIST_WAIT_S = 120.0


def resolve_start_method(class_choice: str | None, owner: str = "start_method") -> str:
    """The start method to use: the class's choice, else the env var, else the default.

    Raises ``ValueError`` naming where a bad value came from and what is accepted.
    """
    if class_choice is not None:
        source, value = owner, class_choice
    elif os.environ.get(START_METHOD_ENV):
        source, value = START_METHOD_ENV, os.environ[START_METHOD_ENV]
    else:
        return DEFAULT_START_METHOD
    if value not in START_METHODS:
        raise ValueError(
            f"{source}={value!r} is not a start method distspawn knows; "
            f"use one of: {', '.join(START_METHODS)}"
        )
    if value != "spawn" and value not in mp.get_all_start_methods():
        raise ValueError(f"{source}={value!r} is not available on this platform; use 'spawn'")
    return value


class TerminatedBySignal(KeyboardInterrupt):
    """SIGTERM reached the test process: stop the run as Ctrl-C would."""


def _stop_like_ctrl_c(signum: int, frame: Any) -> None:
    raise TerminatedBySignal(f"stopped by {signal.Signals(signum).name}")


def stop_cleanly_on_sigterm() -> None:
    """Make SIGTERM stop the test process the way Ctrl-C does.

    Python's default for SIGTERM ends the process on the spot: no ``finally``,
    no ``atexit``, so rank processes of a test that was running, their
    rendezvous files and multiprocessing's temp dir would all be left behind
    (CI runners and timeouts send SIGTERM). As KeyboardInterrupt, it ends the
    ranks and removes the files, and unittest and pytest end the run as for
    Ctrl-C. A handler the program installed itself is left alone.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _stop_like_ctrl_c)


class WarmImportWarning(UserWarning):
    """A test module could not be preloaded into the rank server (the reason says why)."""


_warm_wanted: list[str] = []
_notes_path: str | None = None  # set once this process started its server
_list_socket: socket.socket | None = None  # the server waits to be told more modules


# The longest path a Unix socket can be bound to on Linux (sun_path, less its NUL).
UNIX_SOCKET_PATH_MAX = 107


def check_rank_server_address() -> None:
    """Raise one clear error where the forkserver could not bind its socket here.

    multiprocessing puts it in a directory under ``TMPDIR`` (except where it
    uses an abstract socket, in some Pythons); a long ``TMPDIR`` makes the
    path too long, and the bind fails deep inside multiprocessing.
    """
    address = multiprocessing.connection.arbitrary_address("AF_UNIX")
    size = len(os.fsencode(address))
    if address.startswith("\0") or size <= UNIX_SOCKET_PATH_MAX:
        return
    raise ValueError(
        f"TMPDIR={tempfile.gettempdir()!r} is too long for the rank server: its socket "
        f"would be {address!r}, {size} bytes, and a Unix socket path "
        f"takes at most {UNIX_SOCKET_PATH_MAX}. Set TMPDIR to a shorter directory, or "
        f"{START_METHOD_ENV}=spawn (or start_method = \"spawn\" on the class).")


def start_rank_server(modules: Iterable[str] = (), more_to_come: bool = False) -> None:
    """Start this process's forkserver now, unless it runs, with ``modules`` preloaded.

    It starts at the latest when the first rank does. ``more_to_come``: start
    it at once (it imports torch meanwhile) but let it wait for the rest of the
    modules, which the next call without ``more_to_come`` sends (the first
    rank's start makes that call too, so the server never waits for nothing).
    Under pytest the plugin calls this with ``more_to_come`` when it first
    collects a multi-process test, and without once collection is over.
    """
    global _notes_path, _list_socket
    for name in modules:
        if name != "__main__" and name in sys.modules and name not in _warm_wanted:
            _warm_wanted.append(name)
    mp.get_context("forkserver").set_forkserver_preload(FORKSERVER_PRELOAD)
    if _notes_path is not None:
        if not more_to_come:
            _send_module_list()
            multiprocessing.forkserver.ensure_running()  # restarts one that died
        return
    check_rank_server_address()
    server_environ = {warm_modules.MODULES_VAR: ",".join(_warm_wanted)}
    if more_to_come:
        if not sys.platform.startswith("linux"):
            return  # no abstract sockets: start with the first rank instead
        name = f"distspawn-warm-{os.getpid()}-{os.urandom(6).hex()}"
        _list_socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        _list_socket.bind("\0" + name)  # abstract: nothing on disk to remove
        _list_socket.listen(1)
        server_environ[warm_modules.LIST_SOCKET_VAR] = name
    fd, _notes_path = tempfile.mkstemp(prefix="distspawn-warm-", suffix=".json")
    os.close(fd)
    atexit.register(_remove_notes)
    server_environ[warm_modules.NOTES_VAR] = _notes_path
    # Read by the server alone (distspawn.engine.warm_modules), then unset:
    # nothing the tests start inherits them.
    os.environ.update(server_environ)
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        for key in server_environ:
            os.environ.pop(key, None)


def adopt_rank_server(notes_path: str, list_socket: socket.socket) -> None:
    """Take over a server started with :func:`start_rank_server`'s protocol elsewhere.

    (The pytest plugin starts one before torch is imported, so it cannot call
    this module then.) ``list_socket`` is where the server waits for the modules.
    """
    global _notes_path, _list_socket
    if _notes_path is not None:
        list_socket.close()
        return
    _notes_path, _list_socket = notes_path, list_socket
    atexit.register(_remove_notes)


def rank_server_started() -> bool:
    """Whether :func:`start_rank_server` started this process's server."""
    return _notes_path is not None


def _send_module_list() -> None:
    global _list_socket
    listening, _list_socket = _list_socket, None
    if listening is None:
        return
    # The server asks once its own imports are done: answered from a thread,
    # so that the test process goes on meanwhile (its first rank waits for the
    # server anyway). A server that died never asks: the thread gives up.
    # sys.path too: the server may have started before the test directories
    # were added to it (pytest adds them as it imports the test modules).
    names = json.dumps({"modules": _warm_wanted, "sys_path": sys.path}).encode()

    def answer() -> None:
        listening.settimeout(LIST_WAIT_S)
        try:
            connection, _ = listening.accept()
            with connection:
                connection.sendall(names)
        except OSError:
            pass
        finally:
            listening.close()

    threading.Thread(target=answer, name="distspawn-warm-list", daemon=True).start()


def report_warm_notes() -> None:
    """Once the server answered: say, once, which modules it could not preload and why."""
    if _notes_path is None or not os.path.exists(_notes_path):
        return
    try:
        with open(_notes_path) as f:
            notes = json.load(f)
    except (OSError, ValueError):
        return  # not written yet: the server has not finished starting
    _remove_notes()
    for name, why in notes.items():
        warnings.warn(f"distspawn: test module {name} is not preloaded into the rank "
                      f"server: {why}; each rank imports it itself", WarmImportWarning,
                      stacklevel=2)


def _remove_notes() -> None:
    if _notes_path is not None:
        try:
            os.remove(_notes_path)
        except OSError:
            pass


def process_class(start_method: str, test_module: str | None = None) -> type:
    """The ``Process`` class that starts ranks with ``start_method``.

    ``test_module``: the module of the test class, preloaded into the
    forkserver if it has not started yet (see :func:`start_rank_server`).
    """
    stop_cleanly_on_sigterm()
    if start_method == "fork" and torch.cuda.is_initialized():
        raise RuntimeError(
            "start method 'fork' cannot be used after CUDA was initialised in the parent "
            "process (forked children would inherit a broken CUDA context); use 'spawn'"
        )
    if start_method == "forkserver":
        # This process's own server, shared with nothing else.
        start_rank_server([test_module] if test_module else [])
    return mp.get_context(start_method).Process
