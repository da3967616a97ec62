"""How rank processes start: the choice of multiprocessing start method.

Launchers differ only in how a rank's process comes to exist; everything the
rank does afterwards is the same (see ``worker.child_main``). The choice is
made per class (``start_method`` attribute) or per run (the environment
variable below), never by changing the global multiprocessing start method.
"""

from __future__ import annotations

import os

import torch
import torch.multiprocessing as mp

START_METHOD_ENV = "DISTSPAWN_START_METHOD"
START_METHODS = ("spawn", "fork", "forkserver")
# A preloaded forkserver gives every test brand-new rank processes, forked from
# a clean server (never from the test process), without importing torch again.
DEFAULT_START_METHOD = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
# What the forkserver imports once: the script being run (as multiprocessing
# does by default) and everything a rank needs (see distspawn._preload).
FORKSERVER_PRELOAD = ["__main__", "distspawn._preload"]


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


def process_class(start_method: str) -> type:
    """The ``Process`` class that starts ranks with ``start_method``."""
    if start_method == "fork" and torch.cuda.is_initialized():
        raise RuntimeError(
            "start method 'fork' cannot be used after CUDA was initialised in the parent "
            "process (forked children would inherit a broken CUDA context); use 'spawn'"
        )
    context = mp.get_context(start_method)
    if start_method == "forkserver":
        # Read when the server starts (the first time one is needed in this
        # process); it is this process's own server, shared with nothing else.
        context.set_forkserver_preload(FORKSERVER_PRELOAD)
    return context.Process
