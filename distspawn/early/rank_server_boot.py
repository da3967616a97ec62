"""The rank server's first preload: the test process's environment, and what reads it.

Both sides of the hand-over are here: the test process starts the server with
:func:`start_server` (the pytest plugin does, before it imports torch), and the
server runs this module first. Kept outside the ``distspawn`` package, and on
the standard library alone, so that it runs in the forkserver before anything
imports torch: every import the
server does after it (torch, distspawn, the test modules) sees exactly the
environment the test process handed over, and every variable those imports
read is recorded. The test process compares those records with each rank's
environment before forking the rank (``distspawn.engine.rank_server``).

Why hand the environment over at all: the server's process starts with the
test process's C-level environment, which can differ from its ``os.environ``.
(pytest imports ``readline``, which sets ``COLUMNS`` and ``LINES`` there; a
rank takes the test process's ``os.environ``, so a module imported in the
server saw variables no rank has.)
"""

from __future__ import annotations

import atexit
import hmac
import json
import os
import secrets
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

SERVER_VAR = "DISTSPAWN_RANK_SERVER"  # "1" in the server's start alone: this is it
# A JSON file, 0600 in multiprocessing's 0700 folder: the environment to take,
# and the secret the server greets the test process with.
ENVIRON_VAR = "DISTSPAWN_SERVER_ENVIRON"
LIST_SOCKET_VAR = "DISTSPAWN_WARM_LIST_SOCKET"  # where the test modules are told (a path)
LIST_WAIT_S = 120.0  # for the server to ask for the modules, once its own imports are done
GREETING_WAIT_S = 10.0  # for a connection to the hand-over to say who it is
# A Unix socket's peer, as the kernel tells it (SO_PEERCRED): pid, uid, gid.
_PEER_CREDENTIALS = struct.Struct("3i")
# Set by pytest for each test: no import could have depended on its value.
PER_TEST_VARIABLES = ("PYTEST_CURRENT_TEST",)
# Set in the server alone, where the test process has not set them. With it,
# torch.cuda.is_available() asks NVML, not the CUDA runtime: after asking the
# runtime (upstream's common_utils does, at import), torch refuses CUDA in
# every process forked later, and every rank is forked from the server. Ranks
# need not share it: it changes how availability is asked, not the answer.
SERVER_ONLY_VARIABLES = {"PYTORCH_NVML_BASED_CUDA_CHECK": "1"}
# The longest path a Unix socket can be bound to on Linux (sun_path, less its NUL).
UNIX_SOCKET_PATH_MAX = 107
# What multiprocessing adds below the temp folder for the forkserver's socket
# (newer Pythons name it "sock-" and 12 characters: as long).
_SOCKET_TAIL = len("/pymp-12345678/listener-12345678")
SHORT_TEMP_DIR = "/tmp"  # where the socket's folder goes when TMPDIR is too long


class _RecordingEnviron(type(os.environ)):  # type: ignore[misc]
    """``os.environ`` itself (the same data), noting every variable read through it.

    Values taken while listing the environment (a copy, ``items()``, a prefix
    scan such as tqdm's for ``TQDM_*``) are not noted: a module that copies
    the environment depends on no one variable of it, and counting every
    variable there (tqdm is imported by torch) would make any change to any
    variable between tests restart the server.
    """

    def __getitem__(self, key: str) -> str:
        try:
            value = super().__getitem__(key)
        except KeyError:
            self._distspawn_reads.setdefault(key, None)
            raise
        if key in self._distspawn_listed:
            self._distspawn_listed.discard(key)  # its next read is a real one
        else:
            self._distspawn_reads.setdefault(key, value)
        return value

    def __iter__(self):
        names = list(super().__iter__())
        self._distspawn_listed.update(names)
        return iter(names)


class EnvironRecording:
    """Records what is read from ``os.environ`` between :meth:`start` and :meth:`stop`."""

    def __init__(self) -> None:
        self._original: Any = None
        self._recording: Any = None

    def start(self) -> "EnvironRecording":
        self._original = os.environ
        recording = object.__new__(_RecordingEnviron)
        recording.__dict__.update(self._original.__dict__)  # shares the variables themselves
        recording._distspawn_reads = {}
        recording._distspawn_listed = set()
        self._recording = recording
        os.environ = recording
        return self

    def stop(self) -> dict[str, list[str | None]]:
        """Stop recording; each variable read: [its value when first read, its value
        now] (None where unset). They differ where the imports set it themselves."""
        if self._recording is None:  # never started
            return {}
        if os.environ is self._recording:
            os.environ = self._original
        return {key: [value, os.environ.get(key)]
                for key, value in self._recording._distspawn_reads.items()}


def stale_reads(record: dict[str, list[str | None]], environ: dict[str, str]) -> list[str]:
    """The variables ``record`` read that ``environ`` has otherwise (empty: none).

    A variable the imports set themselves after reading it (torch's inductor
    exports its default cache directory) is also consistent with the value
    they left: imported again with that value, they would use it as is.
    """
    return sorted(key for key, (first, last) in record.items()
                  if key not in PER_TEST_VARIABLES and key not in SERVER_ONLY_VARIABLES
                  and environ.get(key) not in {first, last})


def add_server_only_variables() -> None:
    """Put :data:`SERVER_ONLY_VARIABLES` in this (the server's) environment, unless set."""
    for key, value in SERVER_ONLY_VARIABLES.items():
        if os.environ.get(key) is None:
            os.environ[key] = value


def _take_test_process_environ() -> None:
    path = os.environ.get(ENVIRON_VAR)
    if not path:
        return
    try:
        with open(path) as f:
            hand_over = json.load(f)
        os.remove(path)
    except (OSError, ValueError):
        return  # the test process checks the server's records either way
    environ = hand_over.get("environ") if isinstance(hand_over, dict) else None
    token = hand_over.get("token") if isinstance(hand_over, dict) else None
    if not (isinstance(environ, dict) and isinstance(token, str)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in environ.items())):
        return  # not the test process's: nothing taken, and the server never asks
    list_socket = os.environ.get(LIST_SOCKET_VAR)
    os.environ.clear()
    os.environ.update(environ)
    if list_socket:  # for the server alone: never in the environment it imports with
        _server_settings["list_socket"] = list_socket
        _server_settings["token"] = token


def _look_like_a_rank_process() -> None:
    # A module imported here is imported, as far as it can tell, in a rank:
    # some check at import whether they run in a child of the test process
    # (autoparallel's tests install their DTensor propagator where
    # ``current_process().name != "MainProcess"``). Ranks take their own names.
    import multiprocessing

    multiprocessing.current_process().name = "distspawn rank server"


def _end_at_once() -> None:
    # The server's last at-exit step: a normal exit would then tear down
    # torch, dynamo and the test modules, about 0.8 s of CPU after the test
    # process has gone (and what reads its output waits for that). First the
    # clean-ups of what the server made itself (a temporary folder), as a
    # normal exit runs them; its ranks were forked and end through os._exit.
    # A successor (engine.successors) runs only those it made: the server it
    # came from outlives it, and forks the next from what it has.
    if os.getpid() != _server_settings.get("pid"):
        return
    try:
        from distspawn.engine import forked_exit

        forked_exit.run_exit_finalizers(forked_exit.inherited())
    except Exception:  # noqa: BLE001 - the package did not load: a normal exit, then
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed stream has nothing to flush
            pass
    os._exit(0)


_server_settings: dict[str, Any] = {}
# Stopped by distspawn.engine.preload once everything a rank needs is imported.
preload_recording = EnvironRecording()
# Only in the server: the test process (the pytest plugin starts the server
# from there) imports this module too, and must keep its own name and
# environment.
if os.environ.pop(SERVER_VAR, None) == "1":
    _take_test_process_environ()
    add_server_only_variables()
    _look_like_a_rank_process()
    # Registered before torch is imported: the at-exit steps of everything
    # imported later run before it.
    _server_settings["pid"] = os.getpid()
    atexit.register(_end_at_once)
    preload_recording.start()


def serve_from_this_process() -> None:
    """This process, forked from the server, now serves in its place
    (``distspawn.engine.warm_modules``): it ends the way the server does."""
    _server_settings["pid"] = os.getpid()


def list_socket_name() -> str | None:
    """The socket's path the test process tells the test modules on, if any."""
    return _server_settings.get("list_socket")


def peer_credentials(connection: socket.socket) -> tuple[int, int]:
    """The (pid, uid) of the process at the other end of a Unix socket, as the
    kernel saw it connect (or, for a listening socket's peer, listen)."""
    data = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                 _PEER_CREDENTIALS.size)
    pid, uid, _gid = _PEER_CREDENTIALS.unpack(data)
    return pid, uid


def proc_stat_fields(pid: int) -> list[bytes] | None:
    """The fields of ``/proc/PID/stat`` after the command: state, parent pid,
    ... (None where it cannot be read: no ``/proc``, or the process is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # "pid (command) state ppid ...": the command may hold spaces and parentheses.
    return stat[stat.rfind(b")") + 1:].split()


def parent_pid_of(pid: int) -> int | None:
    """``pid``'s parent, read from ``/proc`` (None: gone, or no ``/proc``)."""
    fields = proc_stat_fields(pid)
    return int(fields[1]) if fields and len(fields) > 1 else None


def connect_to_test_process() -> socket.socket | None:
    """In the server: the hand-over's connection, greeted with the secret
    (None: no hand-over, or the socket is not the test process's).

    The socket is in a folder only the user can enter; the peer must be this
    server's parent, of this uid, besides: a listener another process put
    there is never told anything, nor believed.
    """
    name, token = list_socket_name(), _server_settings.get("token")
    if name is None or token is None:
        return None
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(name)
        if peer_credentials(connection) != (os.getppid(), os.getuid()):
            raise ConnectionRefusedError("not the test process")
        connection.sendall(json.dumps({"greeting": token}).encode() + b"\n")
    except OSError:
        connection.close()
        return None  # the test process left before the server was ready
    return connection


# -- in the test process ----------------------------------------------------

class ModuleListChannel:
    """The test process's end of the socket the server is told the test modules on.

    The server connects once its own preload (torch, distspawn) is done and
    greets this process with the secret it was handed in the environment file;
    it then reads one JSON line at a time: optionally a guess (``{"guess":
    ...}``, see :meth:`offer_guess`), then the list itself, which the test
    process sends once it knows it (pytest: after collection) before shutting
    its side. A connection from any other process is refused unheard: not of
    this uid, not this process's child, or without the secret. Each refusal is
    kept in :attr:`refused`, for the run to say so once.
    """

    def __init__(self, listening: socket.socket, token: str) -> None:
        self._listening = listening
        self._path = listening.getsockname()
        self._token = token
        self._connection: socket.socket | None = None
        self._guesser: threading.Thread | None = None
        self.refused: list[str] = []  # one line for each connection refused

    def offer_guess(self, guess: Callable[[], dict[str, Any] | None],
                    wait_s: float = LIST_WAIT_S) -> None:
        """Send ``guess()`` as soon as the server connects, from a thread.

        The test modules pytest is about to import, computed when the server
        asks: it imports them while this process does, instead of after
        collection. The server checks the guess against the list (the
        modules, their files, ``sys.path``, what each import read from the
        environment) and drops all it imported on a guess that was wrong.
        """
        def accept_and_send() -> None:
            connection = self._accept(wait_s)
            if connection is None:
                return
            message = guess()
            if message:
                try:
                    connection.sendall(json.dumps({"guess": message}).encode() + b"\n")
                except OSError:
                    pass  # the list's own send fails the same way, and says so

        self._guesser = threading.Thread(target=accept_and_send, daemon=True,
                                         name="distspawn-rank-server-guess")
        self._guesser.start()

    def connect(self, wait_s: float) -> socket.socket | None:
        """The server's connection, once it asks (None: not within ``wait_s``)."""
        if self._guesser is None:
            return self._accept(wait_s)
        self._guesser.join(wait_s)
        return self._connection

    def _accept(self, wait_s: float) -> socket.socket | None:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                self._listening.settimeout(max(deadline - time.monotonic(), 0.001))
                connection, _ = self._listening.accept()
            except OSError:  # timed out, or closed (the server is gone)
                return None
            why_not = self._why_not_the_server(connection)
            if why_not is None:
                self._connection = connection
                return connection
            self.refused.append(why_not)
            connection.close()

    def _why_not_the_server(self, connection: socket.socket) -> str | None:
        # Checked before a byte is sent: the peer's uid and pid as the kernel
        # tells them, then its greeting (the secret from the environment file).
        try:
            pid, uid = peer_credentials(connection)
        except OSError as e:
            return f"a connection whose peer could not be told ({e})"
        who = f"pid {pid}, uid {uid}"
        if uid != os.getuid():
            return f"a connection from another user ({who})"
        if parent_pid_of(pid) != os.getpid():
            return f"a connection from a process this test process did not start ({who})"
        line = b""
        connection.settimeout(GREETING_WAIT_S)
        try:
            while not line.endswith(b"\n") and len(line) <= 4096:
                chunk = connection.recv(4096 - len(line) + 1)
                if not chunk:
                    break
                line += chunk
            greeting = json.loads(line)
        except (OSError, ValueError):
            greeting = None
        token = greeting.get("greeting") if isinstance(greeting, dict) else None
        if not isinstance(token, str) or not hmac.compare_digest(token, self._token):
            return f"a connection without the rank server's secret ({who})"
        connection.settimeout(None)
        return None

    def close(self) -> None:
        """Stop waiting for the server (a thread blocked in accept wakes up)."""
        try:
            self._listening.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listening.close()
        try:
            os.remove(self._path)
        except (OSError, TypeError):
            pass  # gone with multiprocessing's folder already


ABSTRACT_FORKSERVER = (
    "this Python's forkserver listens on an abstract socket, which any local user can connect "
    "to (CVE-2022-42919; Python 3.11.1 and later use a private folder), so no rank is forked "
    "from it")


def forkserver_socket_is_abstract() -> bool:
    """Whether multiprocessing's forkserver would listen on an abstract socket
    (Python 3.11.0), which has no permissions: then it must not be started."""
    import multiprocessing.connection

    keep_socket_folder_short()  # (asking makes multiprocessing's folder)
    return multiprocessing.connection.arbitrary_address("AF_UNIX").startswith("\0")


def private_folder() -> str:
    """multiprocessing's folder for this process (where the forkserver's
    socket goes), checked to be this user's alone: the hand-over lives there.

    Raises ``OSError`` where it is not (another user made it, or opened it).
    """
    import multiprocessing.util

    keep_socket_folder_short()
    if forkserver_socket_is_abstract():
        raise PermissionError(ABSTRACT_FORKSERVER)
    folder = multiprocessing.util.get_temp_dir()
    info = os.lstat(folder)
    if info.st_uid != os.getuid() or info.st_mode & 0o077 or not os.path.isdir(folder) \
            or os.path.islink(folder):
        raise PermissionError(f"{folder} is not a folder only this user can enter")
    return folder


def start_server(preload: list[str]) -> tuple[ModuleListChannel, str]:
    """Start multiprocessing's forkserver with ``preload``, on this hand-over.

    Linux only (``SO_PEERCRED``). The hand-over's socket and the environment
    file are in multiprocessing's own folder, which only this user can
    enter (0700), and removed with it. Returns where the server will ask for
    the test modules, and the environment file it removes once read. Raises
    ``OSError`` where the server cannot start, leaving nothing behind.
    """
    import multiprocessing.forkserver

    multiprocessing.get_context("forkserver").set_forkserver_preload(preload)
    folder = private_folder()
    tag = secrets.token_hex(4)
    socket_path = os.path.join(folder, f"dslist-{tag}")
    environ_path = os.path.join(folder, f"dsenv-{tag}.json")
    token = secrets.token_hex(16)
    listening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listening.bind(socket_path)
        listening.listen(8)
        fd = os.open(environ_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump({"environ": dict(os.environ), "token": token}, out)
        ensure_server_running({ENVIRON_VAR: environ_path, LIST_SOCKET_VAR: socket_path})
    except BaseException:
        listening.close()
        for path in (socket_path, environ_path):
            try:
                os.remove(path)
            except OSError:
                pass
        raise
    return ModuleListChannel(listening, token), environ_path


def keep_socket_folder_short() -> None:
    """Have multiprocessing make its folder, where the forkserver's socket goes,
    in ``/tmp`` where ``TMPDIR`` is too long for a Unix socket path.

    Under a long ``TMPDIR`` (Bazel's, a nested pytest run's) the forkserver
    cannot bind its socket, where upstream's harness (spawn, no socket) runs.
    Newer Pythons' multiprocessing falls back to ``/tmp`` itself
    (python/cpython#132124); this does the same on the others. It can only
    act before multiprocessing made its folder, which it keeps for the life of
    the process; the folder is removed at exit, as multiprocessing's always is.
    """
    import multiprocessing.util
    import tempfile

    if len(os.fsencode(tempfile.gettempdir())) + _SOCKET_TAIL <= UNIX_SOCKET_PATH_MAX:
        return
    if not (os.path.isdir(SHORT_TEMP_DIR) and os.access(SHORT_TEMP_DIR, os.W_OK | os.X_OK)):
        return  # the socket's bind then fails, and the caller says why
    # multiprocessing makes its folder where tempfile makes temp folders, and
    # has no setting of its own for it: tempfile.tempdir is the public one.
    chosen = tempfile.tempdir
    tempfile.tempdir = SHORT_TEMP_DIR
    try:
        multiprocessing.util.get_temp_dir()
    finally:
        tempfile.tempdir = chosen


def ensure_server_running(hand_over: dict[str, str] | None = None) -> None:
    """multiprocessing's ``ensure_running``, with the server's start marked.

    The variables (:data:`SERVER_VAR` and ``hand_over``) are in this
    process's environment only while the server starts: read by the server
    alone, which then takes the environment from the file, so nothing the
    tests start inherits them.
    """
    import multiprocessing.forkserver

    keep_socket_folder_short()
    variables = {SERVER_VAR: "1", **(hand_over or {})}
    os.environ.update(variables)
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        for key in variables:
            os.environ.pop(key, None)


def stop_server() -> bool:
    """End this process's forkserver now, even in the middle of its imports.

    For a server no rank was forked from: once its imports are done it would
    end by itself, finding this process gone, but until then it spends a CPU
    and outlives the test process by seconds. Returns False where this
    Python's multiprocessing does not keep the server where this looks for it
    (then it is left to end by itself).
    """
    import multiprocessing.forkserver
    import signal

    server = getattr(multiprocessing.forkserver, "_forkserver", None)
    pid = getattr(server, "_forkserver_pid", None)
    stop = getattr(server, "_stop", None)
    if pid is None or stop is None:
        return False
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass  # gone already: _stop reaps it all the same
    stop()  # closes this side of its pipes and waits for it
    return True

