"""distspawn's pytest plugin, registered through the ``pytest11`` entry point.

Kept apart from the ``distspawn`` package so that loading it costs nothing:
pytest loads every installed plugin for every run, and importing distspawn
imports torch. The hooks that need distspawn act only once a test module has
imported it (a distspawn test class cannot exist before that) and then hand
over to ``distspawn.integrations.pytest_plugin``. See that module and README.rst for what
the plugin does: world-size markers, rank-labelled failure sections and
per-worker isolation under pytest-xdist.
"""

from __future__ import annotations

import multiprocessing.util
import os
import shutil
import socket
import sys
import tempfile
from typing import Any

import pytest

MAX_WORLD_SIZE_VAR = "DISTSPAWN_MAX_WORLD_SIZE"  # read by distspawn.world_sizes

MARKER_HELP = (
    "world_size(*sizes, per_device=False): run this distspawn test once per world size "
    "(items test_x[ws2], test_x[ws4], ...); sizes above what the machine can give are "
    f"skipped (cap: {MAX_WORLD_SIZE_VAR}, else twice the CPUs, at least 4; per_device=True: "
    "the accelerator count)"
)

_XDIST_STATE = pytest.StashKey[tuple]()


def _distspawn_loaded() -> bool:
    return "distspawn.cases.testcase" in sys.modules


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("distspawn")
    group.addoption(
        "--distspawn-max-world-size", type=int, default=None, metavar="N",
        help=f"largest world size to run; bigger ones skip (same as {MAX_WORLD_SIZE_VAR}=N)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARKER_HELP)
    cap = config.getoption("--distspawn-max-world-size", None)
    if cap is not None:
        if cap < 1:
            raise pytest.UsageError(f"--distspawn-max-world-size={cap}: expected an integer >= 1")
        os.environ[MAX_WORLD_SIZE_VAR] = str(cap)
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        config.stash[_XDIST_STATE] = _isolate_xdist_worker(worker)


def pytest_unconfigure(config: pytest.Config) -> None:
    state = config.stash.get(_XDIST_STATE, None)
    if state is None:
        return
    saved_environ, saved_tempdir, private_dir = state
    for key, value in saved_environ.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    tempfile.tempdir = saved_tempdir
    # Not now: multiprocessing removes its own temp dir (inside this one) when
    # the worker exits, and fails loudly if it is already gone. Its finalizers
    # run in priority order at exit; its temp dir's is -100, so ours comes after.
    multiprocessing.util.Finalize(None, shutil.rmtree, args=(private_dir,),
                                  kwargs={"ignore_errors": True}, exitpriority=-200)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("localhost", 0))
        return sock.getsockname()[1]


def _isolate_xdist_worker(worker: str) -> tuple:
    # Per-test dirs and OS-picked ports already keep tests apart; a private TMPDIR
    # also keeps each worker's forkserver socket, store files and any leftovers
    # apart, and a MASTER_PORT fixed for the whole run must not be shared.
    private_dir = tempfile.mkdtemp(prefix=f"distspawn-{worker}-")
    saved_environ = {key: os.environ.get(key) for key in ("TMPDIR", "MASTER_PORT")}
    saved_tempdir = tempfile.tempdir
    os.environ["TMPDIR"] = private_dir
    tempfile.tempdir = private_dir
    if "MASTER_PORT" in os.environ:
        os.environ["MASTER_PORT"] = str(_free_port())
    return saved_environ, saved_tempdir, private_dir


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makeitem(collector: Any, name: str, obj: Any) -> Any:
    if not _distspawn_loaded():
        return None
    from distspawn.integrations.pytest_plugin import make_class_collector

    return make_class_collector(collector, name, obj)


def pytest_collection_finish(session: pytest.Session) -> None:
    if _distspawn_loaded() and not session.config.option.collectonly:
        from distspawn.integrations.pytest_plugin import start_rank_server_for

        start_rank_server_for(session.items)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Any:
    outcome = yield
    if _distspawn_loaded():
        from distspawn.integrations.pytest_plugin import label_rank_failures

        label_rank_failures(item, call, outcome.get_result())
