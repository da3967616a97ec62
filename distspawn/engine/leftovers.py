"""Remove the test process's temporary files even where it is killed outright.

A test process ended by SIGKILL (a CI job's time limit after its grace, the
OOM killer, ``kill -9``) runs no clean-up: each test's folder of rank files,
the reused workers' rendezvous file and folder, and multiprocessing's folder
with the rank server's socket would stay in the temp folder for good.

So the first path watched starts a watcher: a small interpreter of its own
(no torch), in a session of its own so that a signal sent to the test's
process group leaves it be. It reads the paths to watch on a pipe whose other
end only the test process holds (and processes forked from it, which end with
it). When that pipe closes, the test process has ended, however it ended: the
watcher removes each watched path that is still there, and exits. A path the
test process removed itself is simply gone by then. At a normal exit the
test process cleans up itself: it tells the watcher so, and waits for it to
end, so that nothing of the test's lives on after it.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import threading
from collections.abc import Iterable

# Run with -I -S: nothing of the user's site, path or environment is imported.
_WATCHER = r"""
import os, shutil, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
watched = []
for line in sys.stdin.buffer:
    if line == b"\n":  # the test process is ending normally: it cleans up itself
        watched.clear()
    else:
        watched.append(os.fsdecode(line[:-1]))
for path in watched:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.remove(path)
        except OSError:
            pass
"""
EXIT_WAIT_S = 2.0  # at a normal exit: how long to wait for the watcher to end

# Folders torch makes when a module of its is imported, and removes at exit
# (atexit), which a killed process never reaches: torch 2.8's folder for
# remote-module templates, made by importing torch.distributed.checkpoint or
# fsdp (later releases make none). (module, attribute holding the path)
_TORCH_EXIT_FOLDERS = (("torch.distributed.nn.jit.instantiator",
                        "INSTANTIATED_TEMPLATE_DIR_PATH"),)
_torch_folders_seen: set[str] = set()  # watched, or made by the process this was forked from

_lock = threading.Lock()
_watcher: subprocess.Popen | None = None
_watcher_pid = 0  # the process that started it (one forked from it starts its own)


def remove_if_killed(path: str) -> None:
    """Have ``path`` (a file or a folder) removed should this process be
    killed before removing it itself. Best effort: without a watcher (one
    could not start) nothing changes."""
    watch_torchs_exit_folders()
    _send(path)


def watch_torchs_exit_folders(named: Iterable[str] = ()) -> None:
    """Have the folders torch made at import in this process removed should it
    be killed (see ``_TORCH_EXIT_FOLDERS``), and those ``named`` by a process
    that ends with this one; each is watched once. A process forked from this
    one does not watch this one's: they are not its own."""
    for path in (torch_exit_folders() | set(named)) - _torch_folders_seen:
        _torch_folders_seen.add(path)
        _send(path)


def torch_exit_folders() -> set[str]:
    """Those of ``_TORCH_EXIT_FOLDERS`` this process has (its modules imported).

    The rank server, which has no watcher of its own (it ends with the test
    process), names its own to the test process, which watches them."""
    paths = (getattr(sys.modules.get(module_name), attribute, None)
             for module_name, attribute in _TORCH_EXIT_FOLDERS)
    return {path for path in paths if isinstance(path, str)}


# A forked child has its parent's folders: they are not its own to watch.
os.register_at_fork(after_in_child=lambda: _torch_folders_seen.update(torch_exit_folders()))


def _send(path: str) -> None:
    data = os.fsencode(os.path.abspath(path))
    if b"\n" in data:
        return  # the watcher reads one path a line
    with _lock:
        watcher = _running_watcher()
        if watcher is None:
            return
        try:
            watcher.stdin.write(data + b"\n")
            watcher.stdin.flush()
        except OSError:
            pass


_inherited_watchers: list[subprocess.Popen] = []


def _running_watcher() -> subprocess.Popen | None:
    global _watcher, _watcher_pid
    if _watcher_pid != os.getpid():  # not started, or started by the process this was forked from
        if _watcher is not None:
            # The parent's: kept, so this process never finalises it (its
            # process is the parent's to wait for; dropped, it warns).
            _inherited_watchers.append(_watcher)
        _watcher, _watcher_pid = None, os.getpid()
        if not sys.executable:  # an embedded interpreter: no way to start one
            return None
        try:
            _watcher = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _WATCHER], stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        except OSError:
            return None
    return _watcher


def _wait_for_watcher() -> None:
    # At a normal exit the test process removes what it made itself (some of
    # it later than this: multiprocessing's folder, whose removal fails loudly
    # if it is gone): the watcher is told to forget it all, and exits at once.
    global _watcher
    if _watcher_pid != os.getpid() or _watcher is None:
        return
    watcher, _watcher = _watcher, None
    try:
        watcher.stdin.write(b"\n")
        watcher.stdin.close()
        watcher.wait(EXIT_WAIT_S)
    except (OSError, subprocess.TimeoutExpired):
        pass  # a forked child still holds the pipe: the watcher ends with it


atexit.register(_wait_for_watcher)
