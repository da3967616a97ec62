"""How rank processes start: the choice of multiprocessing start method.

Launchers differ only in how a rank's process comes to exist; everything the
rank does afterwards is the same (see ``worker.child_main``). The choice is
made per class (``start_method`` attribute) or per run (the environment
variable below), never by changing the global multiprocessing start method.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

import torch
import torch.multiprocessing as mp

from . import rank_server

START_METHOD_ENV = "DISTSPAWN_START_METHOD"
START_METHODS = ("spawn", "fork", "forkserver")
# A preloaded forkserver gives every test brand-new rank processes, forked from
# a clean server (never from the test process), without importing torch again.
DEFAULT_START_METHOD = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"


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
        # This process's own server, shared with nothing else, holding this
        # test's module and no other; where what it preloaded no longer fits
        # this process's environment, and it cannot be made to, these ranks
        # start afresh (the run was told why).
        rank_server.start_rank_server([test_module] if test_module else [])
        if not rank_server.ranks_may_fork(dict(os.environ), test_module):
            start_method = "spawn"
    return mp.get_context(start_method).Process
