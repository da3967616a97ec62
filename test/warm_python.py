"""Scenario runs forked from an interpreter that already imported torch and pytest.

A scenario run is ``python ARGS`` in a subprocess (``harness.run_python``), and
most of its cost on a 2-core machine is the import of torch, numpy and pytest
(1.5-2 s of CPU) before its first line runs: the suite makes several hundred
such runs. The same technique the engine uses for ranks serves here: one
interpreter per test process (the *zygote*) imports those once, and each run
is a process forked from it that then becomes ``python ARGS`` in every way a
test can see:

- its environment, working folder, ``sys.argv`` and ``sys.path[0]`` are the
  run's, set before the run's first line, with ``tempfile``'s cached folder,
  the random seeds and multiprocessing's authentication key made afresh;
- its stdout and stderr are a pipe the test process reads, its stdin
  ``/dev/null``; its exit status is the one a fresh interpreter would give
  (the run leaves through the interpreter's own shutdown: atexit handlers,
  thread joins, torch's own destructors);
- it leads a session of its own, so that everything it starts can be found
  even where the processes do not carry the run's marker variable in their
  ``/proc/PID/environ`` (a forked process shows the zygote's).

A run whose outcome could depend on what the zygote imported goes to a fresh
interpreter as before (:func:`why_cold` says why): Python options other than
``-m``/``-c``/a script, and an environment that differs from the zygote's in
a variable the preload read from ``os.environ`` (the zygote notes each one)
or one of :data:`READ_AT_START`, read by the interpreter's start or by C++. So do the tests that assert what a process imports,
by asking for ``warm=False``; ``DISTSPAWN_TEST_WARM=0`` sends every run there.

The channel is a ``socketpair`` the zygote inherits: no file, no name another
user could reach.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

WARM_VAR = "DISTSPAWN_TEST_WARM"
# What the zygote imports: the costly, stateless part of every scenario run.
# Never distspawn (a run may assert what importing it does), upstream's
# harness (the stand-in mode must come first), nor a pytest plugin (pytest
# warns that a plugin imported before it started cannot be rewritten).
PRELOAD = ("numpy", "torch", "torch.distributed", "unittest", "pytest")
# Variables the interpreter reads as it starts, or C++ code may read as torch
# imports, where the zygote cannot see the read: a run whose environment
# differs from the zygote's in one of these starts afresh, as in one the
# preload read through os.environ.
READ_AT_START = ("PYTHON", "LD_", "LC_", "LANG", "HOME", "MALLOC", "TORCH", "PYTORCH",
                 "COMPILE_", "FX_", "KINETO", "NPY", "NUMPY", "OPENBLAS", "OMP_", "GOMP",
                 "KMP_", "MKL", "CUDA", "NCCL", "GLOO", "NVIDIA", "TRITON", "PYTEST_PLUGINS")
MESSAGE_MAX = 1 << 20


def why_cold(args: list[str], env: dict[str, str], zygote_env: dict[str, str],
             read: frozenset[str] = frozenset()) -> str | None:
    """Why ``python *args`` with ``env`` cannot be forked from a zygote started with
    ``zygote_env`` whose preload read ``read`` (None: it can)."""
    if not args or (args[0].startswith("-") and args[0] not in ("-m", "-c")):
        return f"the interpreter option {args[:1]}"
    if args[0] in ("-m", "-c") and len(args) < 2:
        return "an option without its argument"
    changed = {key for key in env.keys() | zygote_env.keys()
               if env.get(key) != zygote_env.get(key)}
    differs = sorted(key for key in changed if key in read or key.startswith(READ_AT_START))
    if differs:
        return f"the environment differs in {', '.join(differs)}, read at start"
    return None


class WarmProcess:
    """A run forked by the zygote, with the part of ``subprocess.Popen``'s
    interface ``harness.run_python`` uses."""

    def __init__(self, pid: int, output: int, status: socket.socket) -> None:
        self.pid = pid
        self.session = pid  # it called setsid(): its session id is its pid
        self.returncode: int | None = None
        self._output = output
        self._status = status
        self._chunks: list[bytes] = []

    def communicate(self, timeout: float | None = None) -> tuple[str, None]:
        """Its output until it and all it started closed their stdout, then its
        status; ``subprocess.TimeoutExpired`` past ``timeout`` (call again)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._output >= 0:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(["python"], timeout)
            ready, _, _ = select.select([self._output], [], [], left)
            if ready:
                chunk = os.read(self._output, 1 << 16)
                if chunk:
                    self._chunks.append(chunk)
                else:
                    os.close(self._output)
                    self._output = -1
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        # As Popen(text=True) reads it: universal newlines.
        text = b"".join(self._chunks).decode(errors="replace")
        return text.replace("\r\n", "\n").replace("\r", "\n"), None

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self._status.settimeout(timeout)
            try:
                message = self._status.recv(64)
            except socket.timeout:
                raise subprocess.TimeoutExpired(["python"], timeout) from None
            self._status.close()
            # The zygote's status line; none (it died) reads as a SIGKILL.
            self.returncode = int(message.split()[1]) if message.startswith(b"EXIT ") else -9
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Zygote:
    """This test process's zygote, started on first use (see the module's text)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen | None = None
        self._control: socket.socket | None = None
        self.env: dict[str, str] = {}
        self.read: frozenset[str] = frozenset()  # what its preload read from os.environ
        self.broken: str | None = None  # why runs go cold for the rest of this process

    def start(self, args: list[str], env: dict[str, str], cwd: Path) -> WarmProcess | None:
        """``python *args`` forked from the zygote, or None where it must start afresh."""
        if os.environ.get(WARM_VAR) == "0":
            return None
        with self._lock:
            if not self._running():
                return None
            if why_cold(args, env, self.env, self.read) is not None:
                return None
            output, theirs = os.pipe()
            status, status_theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            request = json.dumps({"args": args, "env": env, "cwd": str(cwd)}).encode()
            try:
                socket.send_fds(self._control, [request], [theirs, status_theirs.fileno()])
            except OSError as exc:
                self.broken = f"the zygote's channel failed: {exc}"
                for end in (output, theirs):
                    os.close(end)
                status.close()
                status_theirs.close()
                return None
            os.close(theirs)
            status_theirs.close()
        started = status.recv(64)
        if not started.startswith(b"PID "):
            os.close(output)
            status.close()
            return None
        return WarmProcess(int(started.split()[1]), output, status)

    def _running(self) -> bool:
        if self.broken is not None:
            return False
        if self._process is not None and self._process.poll() is None:
            return True
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # CI is the CI runner's flag, not a run's (harness.run_python drops it too).
        self.env = {k: v for k, v in os.environ.items() if k != "CI"}
        self._process = subprocess.Popen(
            [sys.executable, __file__, str(theirs.fileno())], pass_fds=[theirs.fileno()],
            env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        theirs.close()
        ready = ours.recv(MESSAGE_MAX)
        if ready.startswith(b"READY "):
            self.read = frozenset(json.loads(ready[len(b"READY "):]))
        else:
            self.broken = f"the zygote did not start: {ready.decode(errors='replace')}"
            # Said once; every run starts afresh, as slow as before but right.
            warnings.warn(f"{self.broken}; scenario runs start fresh interpreters")
            ours.close()
            self._process.wait()
            return False
        self._control = ours
        return True


ZYGOTE = Zygote()


# The zygote's side.


def _serve(control: socket.socket) -> None:
    """Fork a run for each request until the test process closes the channel.

    No try/finally or with-block encloses the fork: the forked run leaves
    through this function's frames as an exception or a return, and must
    find nothing of the zygote's to clean up on its way out.
    """
    running: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, status socket)
    while True:
        ready, _, _ = select.select([control, *running], [], [])
        for pidfd in [fd for fd in ready if fd in running]:
            pid, status = running.pop(pidfd)
            _, wait_status = os.waitpid(pid, 0)
            _tell(status, b"EXIT %d" % os.waitstatus_to_exitcode(wait_status))
            status.close()
            os.close(pidfd)
        if control not in ready:
            continue
        try:
            message, fds, _, _ = socket.recv_fds(control, MESSAGE_MAX, 2)
        except OSError:
            message, fds = b"", []
        if not message:
            return  # the test process has gone
        request = json.loads(message)
        output, status_fd = fds
        status = socket.socket(fileno=status_fd)
        pid = os.fork()
        if pid == 0:
            for pidfd, (_, other) in running.items():
                os.close(pidfd)
                other.close()
            control.close()
            status.close()
            _become_the_run(request, output)
            return _run(request["args"])
        os.close(output)
        _tell(status, b"PID %d" % pid)
        running[os.pidfd_open(pid)] = (pid, status)


def _tell(status: socket.socket, message: bytes) -> None:
    try:
        status.send(message)
    except OSError:
        pass  # the test process stopped listening (it was ended): nothing to tell


def _become_the_run(request: dict, output: int) -> None:
    import multiprocessing
    import multiprocessing.process
    import random
    import tempfile

    import numpy

    # The run's streams first: whatever happens from here on is its output.
    os.dup2(output, 1)
    os.dup2(output, 2)
    os.close(output)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.setsid()
    os.chdir(request["cwd"])
    # multiprocessing took the working folder as it was imported: a script
    # named by a relative path is found from there by spawned processes.
    multiprocessing.process.ORIGINAL_DIR = os.getcwd()
    os.environ.clear()
    os.environ.update(request["env"])
    tempfile.tempdir = None  # found again from TMPDIR, as a fresh interpreter would
    random.seed()
    numpy.random.seed()
    multiprocessing.current_process().authkey = os.urandom(32)


def _run(args: list[str]) -> None:
    """Run ``args`` as the interpreter would, then leave through its shutdown.

    An exception the run does not catch is shown as the interpreter shows it,
    less the zygote's own frames; a KeyboardInterrupt then ends the process by
    SIGINT, as the interpreter does, after the atexit handlers ran.
    """
    global _INTERRUPTED
    try:
        _run_as_main(args)
    except SystemExit:
        raise
    except BaseException as exc:
        trace = exc.__traceback__
        while trace is not None and trace.tb_frame.f_code.co_filename == __file__:
            trace = trace.tb_next
        sys.excepthook(type(exc), exc.with_traceback(trace), trace)
        _INTERRUPTED = isinstance(exc, KeyboardInterrupt)
        sys.exit(1)
    sys.exit(0)


_INTERRUPTED = False


def _end_as_interrupted() -> None:
    """The last atexit handler of a run (the first registered): a run ended by
    an uncaught KeyboardInterrupt ends by SIGINT."""
    if _INTERRUPTED:
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)


def _run_as_main(args: list[str]) -> None:
    import runpy

    if args[0] == "-m":
        sys.argv = [args[1], *args[2:]]
        sys.path[0] = os.getcwd()
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        return
    main = type(sys)("__main__")
    if args[0] == "-c":
        sys.argv = ["-c", *args[2:]]
        sys.path[0] = ""
        source, filename = args[1], "<string>"
    else:
        # As the interpreter does: __file__ and the code's file name are the
        # full path, sys.argv[0] the path as given, sys.path[0] its real folder.
        import importlib.machinery

        sys.argv = list(args)
        filename = os.path.abspath(args[0])
        sys.path[0] = os.path.dirname(os.path.realpath(filename))
        source = Path(filename).read_bytes()
        main.__file__ = filename
        main.__cached__ = None
        main.__loader__ = importlib.machinery.SourceFileLoader("__main__", filename)
    sys.modules["__main__"] = main
    exec(compile(source, filename, "exec"), main.__dict__)


def _preload_and_serve(control_fd: int) -> None:
    import atexit
    import gc
    import importlib

    atexit.register(_end_as_interrupted)  # before any import's: it runs last
    control = socket.socket(fileno=control_fd)
    # Each variable read through os.environ (get, [], in) while the preload
    # imports: a run that sets it otherwise would have imported otherwise. A
    # value taken while the whole environment is listed (a copy, items())
    # is not a read of that one variable. (The rank server's recorder,
    # distspawn.early.rank_server_boot.EnvironRecording, keeps the same rule;
    # importing it here would put distspawn in every run's sys.modules.)
    read: set[str] = set()
    listing = 0
    environ_type = type(os.environ)
    reading, iterating = environ_type.__getitem__, environ_type.__iter__

    def noting(environ: os._Environ, key: str) -> str:
        if not listing:
            read.add(key)
        return reading(environ, key)

    def listed(environ: os._Environ):
        nonlocal listing
        listing += 1
        try:
            yield from iterating(environ)
        finally:
            listing -= 1

    environ_type.__getitem__, environ_type.__iter__ = noting, listed
    for name in PRELOAD:
        importlib.import_module(name)
    environ_type.__getitem__, environ_type.__iter__ = reading, iterating
    # What the preload made lives as long as the zygote: out of the collector's
    # sight, so that a run's collections skip it and leave its pages shared.
    gc.freeze()
    if threading.active_count() > 1:  # a fork would not have it: no run is forked
        names = [thread.name for thread in threading.enumerate()]
        control.send(f"Python threads run after the preload: {names}".encode())
        return
    control.send(b"READY " + json.dumps(sorted(read)).encode())
    _serve(control)


if __name__ == "__main__":
    _preload_and_serve(int(sys.argv[1]))
