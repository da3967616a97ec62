"""This test process's rank server: the forkserver every rank is forked from.

The server imports torch, distspawn and one test module (see
``engine.preload`` and ``engine.warm_modules``); each rank forked from it
starts with all of that loaded. That is only right while a rank could not tell
the difference from importing it all itself, so:
- a server holds the module of the tests whose ranks it forks, and no other
  test module: a rank started afresh imports its own test module alone, and
  one module's imports can change what another's see (importing pytorch's RPC
  faulty-agent fixture replaces ``BackendType`` in the RPC backend registry,
  so a TensorPipe test in another module fails in a rank that has it). When
  the tests of another module start ranks, the server is switched to that
  module instead (never holding both): the process that serves ends, and the
  one it was forked from, with torch and distspawn loaded but no test module,
  forks another that imports the new module (``engine.warm_modules``);
- the server took this process's environment when it started, and again when
  it was told the test modules; every variable its imports read is recorded,
  and a rank whose environment differs in one of them would have imported
  something else: the server is restarted without that test module (or, for
  its own preload, with the environment as it is now), and the run says so
  once, naming the module and the variables;
- a test module the server refused (its import failed, ended the process,
  took too long, or left a thread or a socket running) is imported by each
  rank itself;
- where the server could not import its own preload, or cannot be restarted,
  ranks start afresh (``spawn``) for the rest of the run.
"""

from __future__ import annotations

import atexit
import json
import multiprocessing
import multiprocessing.connection
import multiprocessing.forkserver
import multiprocessing.util
import os
import socket
import sys
import tempfile
import threading
import warnings
from collections.abc import Iterable
from typing import Any

from ..early import rank_server_boot

from . import leftovers, server_report

# What the forkserver imports once: the script being run (as multiprocessing
# does by default), the environment hand-over, then everything a rank needs.
FORKSERVER_PRELOAD = ["__main__", "distspawn.early.rank_server_boot", "distspawn.engine.preload"]
REPORT_WAIT_S = 900.0  # for it to import them (each import has its own limit)


class WarmImportWarning(UserWarning):
    """The rank server did not preload something, or was restarted (the text says why)."""


class _Server:
    """One start of the rank server, as this process knows it."""

    def __init__(self, channel: rank_server_boot.ModuleListChannel | None,
                 environ_path: str | None) -> None:
        self.channel = channel  # None once the module list is on its way
        # Kept open once the report came, where the server can switch modules.
        self.connection: socket.socket | None = None
        self.module: str | None = None  # the test module it was told to preload
        self.environ_path = environ_path  # removed by the server once read
        self.report: dict[str, Any] | None = None
        self.answered = threading.Event()
        self.reports = channel is not None  # no protocol (not Linux): nothing to check
        self.fits: dict[str, str] | None = None  # the last environment found to fit it
        self.malformed: str | None = None  # why its last report was refused whole
        # What to tell the run, once, from the thread that starts ranks.
        self.notes: list[str] = []
        # A process forked from this one (pytest-forked forks one per test)
        # inherits this object, but not the threads that talk to the server,
        # which answers this process alone: it must not wait on it.
        self.owner = os.getpid()
        if not self.reports:
            self.answered.set()
        atexit.register(self.remove_environ_file)
        # multiprocessing's folder, the server's socket in it: its own clean-up
        # at exit removes it, where this process gets to exit.
        leftovers.remove_if_killed(multiprocessing.util.get_temp_dir())

    def switchable(self) -> bool:
        return self.connection is not None and bool((self.report or {}).get("switch"))

    def close(self) -> None:
        if self.connection is not None:
            self.connection.close()
            self.connection = None

    def remove_environ_file(self) -> None:
        if self.environ_path is not None:
            try:
                os.remove(self.environ_path)
            except OSError:
                pass


_wanted: list[str] = []  # test modules to preload, in the order asked for
_excluded: dict[str, str] = {}  # never preloaded again: module -> why
_imported_again: set[str] = set()  # imported anew once already, for a changed environment
_server: _Server | None = None
_spawn_instead: str | None = None  # why ranks start afresh for the rest of the run
_said: set[str] = set()


def check_rank_server_address() -> None:
    """Raise one clear error where the forkserver could not bind its socket here.

    multiprocessing puts it in a directory under ``TMPDIR`` (except where it
    uses an abstract socket, in some Pythons), or under ``/tmp`` where
    ``TMPDIR`` is too long (``rank_server_boot.keep_socket_folder_short``).
    That is too late once multiprocessing made its folder under a long
    ``TMPDIR`` before the first rank, and then the bind would fail deep inside
    multiprocessing.
    """
    rank_server_boot.keep_socket_folder_short()
    address = multiprocessing.connection.arbitrary_address("AF_UNIX")
    size = len(os.fsencode(address))
    if address.startswith("\0") or size <= rank_server_boot.UNIX_SOCKET_PATH_MAX:
        return
    raise ValueError(
        f"TMPDIR={tempfile.gettempdir()!r} is too long for the rank server: its socket "
        f"would be {address!r}, {size} bytes, and a Unix socket path "
        f"takes at most {rank_server_boot.UNIX_SOCKET_PATH_MAX} (multiprocessing made its "
        f"folder there before the first rank started, or {rank_server_boot.SHORT_TEMP_DIR} "
        "is not writable). Set TMPDIR to a shorter directory, or "
        "DISTSPAWN_START_METHOD=spawn (or start_method = \"spawn\" on the class).")


def start_rank_server(modules: Iterable[str] = (), more_to_come: bool = False) -> None:
    """Start this process's forkserver now, unless it runs, with ``modules`` preloaded.

    It starts at the latest when the first rank does. ``more_to_come``: start
    it at once (it imports torch meanwhile) but let it wait for the rest of the
    modules, which the next call without ``more_to_come`` sends (the first
    rank's start makes that call too, so the server never waits for nothing).
    Under pytest the plugin calls this with ``more_to_come`` and no modules for
    each multi-process test class it collects, and without once collection is
    over, with the modules of the tests it kept.
    """
    if _inherited():
        return  # ranks_may_fork says why these ranks start afresh
    for name in modules:
        if name != "__main__" and name in sys.modules and name not in _wanted:
            _wanted.append(name)
    first = _wanted[0] if _wanted else None  # the first tests to run are its
    if _server is not None:
        if not more_to_come:
            _send_module_list(_server, first)
        return
    if _spawn_instead is not None:
        return
    if rank_server_boot.forkserver_socket_is_abstract():
        _fall_back_to_spawn(rank_server_boot.ABSTRACT_FORKSERVER)
        return
    check_rank_server_address()
    _start(first, send_now=not more_to_come)


def _start(module: str | None, send_now: bool) -> None:
    global _server
    # No SO_PEERCRED to check the hand-over with: no test modules.
    if not sys.platform.startswith("linux"):
        multiprocessing.get_context("forkserver").set_forkserver_preload(FORKSERVER_PRELOAD)
        rank_server_boot.ensure_server_running()
        _server = _Server(None, None)
        return
    _server = _Server(*rank_server_boot.start_server(FORKSERVER_PRELOAD))
    if send_now:
        _send_module_list(_server, module)


def adopt_rank_server(channel: rank_server_boot.ModuleListChannel,
                      environ_path: str) -> None:
    """Take over a server started with this module's protocol elsewhere.

    (The pytest plugin starts one before this process imports torch, so it
    cannot call this module then.) ``channel`` is where the server asks for
    the modules; ``environ_path`` the environment file it was given.
    """
    global _server
    if _server is not None:
        channel.close()
        try:  # a second server that never started: nothing will read it
            os.remove(environ_path)
        except OSError:
            pass
        return
    _server = _Server(channel, environ_path)


def _inherited() -> bool:
    """Whether this process was forked from the one whose server ``_server`` is."""
    return _server is not None and _server.owner != os.getpid()


def rank_server_started() -> bool:
    """Whether this process started its server."""
    return _server is not None


def stop_rank_server() -> None:
    """End the server now, unless ranks were forked from it; a later rank starts another.

    For a server started early, on a guess, when no collected test turns out
    to start ranks: it would otherwise import torch for nobody.
    """
    global _server
    if _server is None or _inherited() or _live_forked_ranks():
        return
    if rank_server_boot.stop_server():
        if _server.channel is not None:  # the module list was never sent
            _server.channel.close()
        _server.close()
        _server.remove_environ_file()
        _server = None


def _stop_server_still_importing() -> None:
    # At exit: a server that has not reported yet has forked no rank (ranks
    # wait for its report), and would go on importing after this process.
    if _server is not None and not _server.answered.is_set():
        rank_server_boot.stop_server()


atexit.register(_stop_server_still_importing)


def _request(server: _Server, module: str | None) -> bytes:
    # ``module``: the test module it is to preload (None, or one excluded: none).
    server.module = module if module not in _excluded else None
    return _line(_request_body(server.module))


def _request_body(module: str | None) -> dict[str, Any]:
    # Each module's file too: the server checks a guess it was sent against it.
    modules = [module] if module is not None else []
    return {
        "modules": modules, "sys_path": sys.path, "environ": dict(os.environ),
        "files": {m: getattr(sys.modules.get(m), "__file__", None) for m in modules},
    }


def _prepare_next(module: str | None) -> bytes | None:
    """What tells the server, serving ``module``'s ranks, the test module
    whose tests come next, to import meanwhile (None: none is known).

    Under pytest the modules are known, in the order of their tests, once
    collection is over. The server checks, when it is asked for that module,
    that nothing its import read has changed since.
    """
    if module not in _wanted:
        return None
    upcoming = [name for name in _wanted[_wanted.index(module) + 1:] if name not in _excluded]
    if not upcoming:
        return None
    return _line({"prepare": _request_body(upcoming[0])})


def _line(message: dict[str, Any]) -> bytes:
    return json.dumps(message).encode() + b"\n"


def _read_report(connection: socket.socket, server: _Server) -> dict[str, Any] | None:
    # One JSON line, checked field by field (None: the server ended first, or
    # sent something else, and server.malformed says what).
    connection.settimeout(REPORT_WAIT_S)
    data = b""
    while not data.endswith(b"\n"):
        chunk = connection.recv(65536)
        if not chunk:
            break
        data += chunk
    if not data.strip():
        return None
    try:
        report = server_report.parse_report(data)
    except server_report.MalformedReport as e:
        server.malformed = str(e)
        return None
    # The server's folders go with this process's: should a CI job's limit
    # kill both at once, nothing of the server's is left (torch 2.8 makes one).
    # Only folders torch could have made: a path is removed on no one's word.
    accepted = []
    for path in report["exit_folders"]:
        why_not = server_report.exit_folder_refusal(path)
        if why_not is None:
            accepted.append(path)
        else:
            server.notes.append(f"the rank server named {path!r} to be removed should the run be "
                                f"killed, which is not a folder torch makes ({why_not}); it is "
                                "left alone")
    leftovers.watch_torchs_exit_folders(accepted)
    return report


def _send_module_list(server: _Server, module: str | None) -> None:
    channel, server.channel = server.channel, None
    if channel is None:
        return
    request = _request(server, module)
    prepare = _prepare_next(server.module)

    # The server asks once its own imports are done: answered from a thread,
    # so that this process goes on meanwhile (its first rank waits for the
    # server anyway). A server that died never asks: the thread gives up.
    def converse() -> None:
        connection = None
        try:
            connection = channel.connect(rank_server_boot.LIST_WAIT_S)
            if connection is None:
                return
            connection.sendall(request)
            server.report = _read_report(connection, server)
        except (OSError, ValueError):
            pass
        finally:
            server.notes.extend(f"refused {why} to the rank server's hand-over"
                                for why in channel.refused)
            channel.close()
            server.connection = connection  # kept where the server can switch
            if server.switchable():
                _send_prepare(server, prepare)
            else:
                server.close()
            server.answered.set()

    threading.Thread(target=converse, name="distspawn-rank-server", daemon=True).start()


def _switch(module: str | None) -> bool:
    """Have the server serve ``module``'s ranks in place of the last module's,
    without importing torch again (False: it cannot, or failed to)."""
    server = _server
    # (Where it is still importing the last module, its report comes first.)
    if server is None or not server.answered.wait(REPORT_WAIT_S) or not server.switchable():
        return False
    server.report = server.fits = None
    try:
        server.connection.sendall(_request(server, module))
        server.report = _read_report(server.connection, server)
    except (OSError, ValueError):
        pass
    if server.malformed is not None:
        _fall_back_to_spawn(_malformed_text(server))
    if server.report is None:
        return False
    _send_prepare(server, _prepare_next(server.module))
    return True


def _send_prepare(server: _Server, prepare: bytes | None) -> None:
    if prepare is not None and server.switchable():
        try:
            server.connection.sendall(prepare)
        except OSError:
            pass  # the next switch fails the same way, and restarts the server


def _say_once(text: str) -> None:
    if text not in _said:
        _said.add(text)
        warnings.warn(f"distspawn: {text}", WarmImportWarning, stacklevel=3)


def ranks_may_fork(environ: dict[str, str], test_module: str | None = None) -> bool:
    """Whether ranks with ``environ``, of a test in ``test_module``, may be forked
    from the server now.

    Checks the server's report (waiting for it if it is still importing),
    restarting the server where it holds another test module, or where a
    preloaded module read the environment otherwise than ``environ`` has it.
    False: start these ranks afresh (``spawn``); the run has been told why,
    once (or, where ranks of another module's test still run from the server,
    these start afresh, as each rank imports its own module alone).
    """
    if _spawn_instead is None and _inherited():
        _fall_back_to_spawn("this process was forked from the one that started the rank "
                            "server (pytest-forked forks one for each test), and that server "
                            "serves its parent alone")
    for _ in range(len(_wanted) + 3):  # a restart leaves a module out, or takes the environment
        if _spawn_instead is not None:
            return False
        if _server is None:
            return True
        wanted = test_module if test_module in _wanted and test_module not in _excluded \
            else None
        if _server.channel is not None:  # not told its module yet: this one
            _send_module_list(_server, wanted)
        elif _server.module != wanted:
            if _live_forked_ranks():
                return False
            if not _switch(wanted):
                _restart(wanted)
            continue
        if _server.fits == environ:
            return True  # every test of a class starts ranks with the same environment
        if not _server.answered.wait(REPORT_WAIT_S):
            _fall_back_to_spawn("the rank server did not finish its start")
            return False
        restart = _what_to_restart_for(_server, environ)
        if restart is None:
            if _spawn_instead is None:
                _server.fits = dict(environ)
            return _spawn_instead is None
        if _live_forked_ranks():
            return False  # forked from this server: a restart would end them
        # Less a module just excluded, or with one imported anew (a switch),
        # or with the environment as it is now (only a restart: torch and
        # distspawn read the old one).
        if restart == "preload" or not _switch(_server.module):
            _restart(_server.module)
    _fall_back_to_spawn("the rank server kept going stale")
    return False


def _fall_back_to_spawn(why: str) -> None:
    global _spawn_instead
    _spawn_instead = why
    _say_once(f"{why}; ranks start afresh (spawn) for the rest of the run")


def _what_to_restart_for(server: _Server, environ: dict[str, str]) -> str | None:
    """What the server must be restarted without ("preload": with ``environ``),
    or None where it fits ``environ`` (or ranks must start afresh instead)."""
    report = server.report
    while server.notes:
        _say_once(server.notes.pop(0))
    if not server.reports:
        return None
    if report is None:
        _fall_back_to_spawn(_malformed_text(server) if server.malformed is not None else
                            "the rank server ended before it reported what it preloaded")
        return None
    if report.get("preload_failures"):
        name, why = next(iter(report["preload_failures"].items()))
        _fall_back_to_spawn(f"the rank server could not import {name} ({why})")
        return None
    for name, why in report.get("refused", {}).items():
        _say_once(f"test module {name} is not preloaded into the rank server: {why}; "
                  "each rank imports it itself")
        _excluded.setdefault(name, why)  # not asked for again
        if server.module == name:
            server.module = None  # what it holds
    stale_preload = rank_server_boot.stale_reads(report.get("preload", {}), environ)
    if stale_preload:
        # Each time (a restart costs what one spawned rank does): classes that
        # set a variable in setUpClass and remove it after are common.
        _say_once("the environment changed in variables the rank server's preload (torch, "
                  f"distspawn) read: {', '.join(stale_preload[:5])}; the server is restarted "
                  "with the environment as it is now")
        return "preload"
    for name, record in report.get("modules", {}).items():
        stale = rank_server_boot.stale_reads(record, environ)
        if stale and name not in _imported_again:
            # Imported during collection, before its class set up the
            # environment its ranks have (TestDistBackend points INIT_METHOD
            # at its folder in setUp): imported again with the environment
            # as it is now, as each rank would import it, and kept while
            # that holds.
            _imported_again.add(name)
            return name
        if stale:
            _excluded[name] = "read " + ", ".join(stale[:5])
            _say_once(f"test module {name} (or a module it imports) read the environment "
                      f"at import, and ranks have it otherwise ({', '.join(stale[:5])}), "
                      "again after it was imported anew; the rank server is restarted "
                      "without it, and each rank imports it itself")
            return name
    return None


def _malformed_text(server: _Server) -> str:
    return (f"the rank server's report was not of its shape ({server.malformed}), so none of "
            "it is used")


def _live_forked_ranks() -> bool:
    forked = multiprocessing.context.ForkServerProcess
    return any(isinstance(p, forked) for p in multiprocessing.active_children())


def _restart(module: str | None) -> None:
    global _server
    if _spawn_instead is not None:
        return  # no more ranks are forked in this run: a server would import for nobody
    stop = getattr(getattr(multiprocessing.forkserver, "_forkserver", None), "_stop", None)
    if stop is None:  # private to multiprocessing (see distspawn.private_apis)
        _fall_back_to_spawn("this Python's forkserver cannot be restarted")
        return
    if _server is not None:
        _server.close()
    stop()
    _server = None
    _start(module, send_now=True)
