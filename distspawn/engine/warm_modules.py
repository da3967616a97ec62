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
- each module is first imported in a throwaway child forked from the server; a
  module whose import fails there, or leaves anything running (a thread, a
  process, a socket, CUDA), is never imported into the server;
- every variable each import reads from the environment is recorded and sent
  back; the test process checks each rank's environment against the records
  before forking the rank, and restarts the server without a module whose
  record does not match (``distspawn.engine.rank_server``);
- an import that fails in the server after its probe passed leaves the server
  unusable: it says so, and the test process restarts it without that module.
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
from typing import Any

import distspawn_rank_server

PROBE_LIMIT_S = 120.0  # a module whose import takes longer is left to the ranks


def serve(preload_failures: dict[str, str]) -> None:
    """Finish the server's start: report its preload, then warm the test modules.

    ``preload_failures``: the server's own imports that raised (module -> why).
    """
    report: dict[str, Any] = {
        "preload": distspawn_rank_server.preload_recording.stop(),
        "preload_failures": preload_failures,
        "modules": {}, "refused": {}, "broken": None,
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
    for name in request.get("modules", []):
        if not isinstance(name, str) or name in sys.modules:
            continue
        why_not = _probe(name)
        if why_not is not None:
            report["refused"][name] = why_not
            continue
        recording = distspawn_rank_server.EnvironRecording().start()
        try:
            importlib.import_module(name)
        except BaseException as exc:  # noqa: BLE001 - the test process restarts the server
            recording.stop()
            report["broken"] = {"module": name, "why": f"{type(exc).__name__}: {exc}"}
            return
        report["modules"][name] = recording.stop()


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
