"""Ports, stores and devices for tests that set up their own rendezvous."""

from __future__ import annotations

import random
import socket
import sys
import time
from collections.abc import Callable, Iterable
from datetime import timedelta
from functools import partial, wraps
from typing import Any

import torch
import torch.distributed as c10d

# Error texts that mean "the rendezvous could not connect", worth a retry.
ADDRESS_IN_USE = "Address already in use"
CONNECT_TIMEOUT = "connect() timed out."

CONNECT_RETRIES = 10


def find_free_port() -> int:
    """A TCP port that was free a moment ago.

    Another process may take it before you bind it: pair it with
    :func:`retry_on_connect_failures`, or let the OS choose (port 0) where the
    API allows, as :func:`create_tcp_store` does.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("localhost", 0))
        return sock.getsockname()[1]


def _as_error_texts(connect_errors: str | Iterable[str]) -> tuple[str, ...]:
    # Upstream's default is a bare string, which it then iterates character by
    # character, retrying nearly any RuntimeError. A string here means one text.
    if isinstance(connect_errors, str):
        return (connect_errors,)
    texts = tuple(connect_errors)
    if not texts or not all(isinstance(text, str) and text for text in texts):
        raise ValueError(
            "connect_errors must be a non-empty string or a sequence of non-empty strings, "
            f"got {connect_errors!r}"
        )
    return texts


def retry_on_connect_failures(
    func: Callable | None = None,
    connect_errors: str | Iterable[str] = (ADDRESS_IN_USE,),
) -> Callable:
    """Re-run ``func`` (up to 10 tries) when it raises a RuntimeError naming a connect failure.

    Only errors whose text contains one of ``connect_errors`` are retried; any
    other error propagates at once.
    """
    texts = _as_error_texts(connect_errors)
    if func is None:
        return partial(retry_on_connect_failures, connect_errors=texts)

    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        attempt = 1
        while True:
            try:
                return func(*args, **kwargs)
            except RuntimeError as error:
                if not any(text in str(error) for text in texts):
                    raise
                if attempt == CONNECT_RETRIES:
                    raise RuntimeError(
                        f"Failing after {CONNECT_RETRIES} retries with error: {error}"
                    ) from error
            attempt += 1
            time.sleep(random.random())  # spread out processes racing for ports

    return wrapper


@retry_on_connect_failures
def create_tcp_store(
    addr: str = "localhost",
    world_size: int = 1,
    is_master: bool = True,
    timeout: timedelta = timedelta(minutes=5),
    wait_for_workers: bool = True,
    jit_class: bool = False,
    use_libuv: bool = True,
) -> Any:
    """A TCPStore on a free port (read it back from ``store.port``).

    The master binds port 0, so the OS picks the port and no other process can
    take it first; the TorchScript class needs a port up front and is retried.
    """
    if jit_class:
        timeout_ms = int(timeout / timedelta(milliseconds=1))
        return torch.classes.dist_c10d.TCPStore(
            addr, find_free_port(), world_size, is_master, timeout_ms)
    port = 0 if is_master else find_free_port()
    return c10d.TCPStore(
        addr,
        port,
        world_size,
        is_master,
        timeout=timeout,
        wait_for_workers=wait_for_workers,
        use_libuv=use_libuv,
    )


def create_device(interface: str | None = None, lazy_init: bool = False) -> Any:
    """A gloo transport device on loopback, or on the named network interface."""
    options: dict[str, Any] = {"lazy_init": lazy_init} if lazy_init else {}
    if sys.platform == "win32" or interface is None:
        return c10d.ProcessGroupGloo.create_device(hostname="127.0.0.1", **options)
    return c10d.ProcessGroupGloo.create_device(interface=interface, **options)
