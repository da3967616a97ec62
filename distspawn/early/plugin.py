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

import fnmatch
import getpass
import importlib.abc
import multiprocessing.util
import os
import pathlib
import re
import shutil
import socket
import sys
import tempfile
from typing import Any

import pytest

from distspawn.early import source_scan

MAX_WORLD_SIZE_VAR = "DISTSPAWN_MAX_WORLD_SIZE"  # read by distspawn.world_sizes
# What distspawn.engine.rank_server uses (importing it would import torch;
# test/test_layout.py checks that they agree).
SERVER_PRELOAD = ["__main__", "distspawn.early.rank_server_boot", "distspawn.engine.preload"]
STAND_IN_VAR = "DISTSPAWN_STAND_IN"  # read by distspawn.integrations.stand_in
STAND_IN_ON = ("1", "true", "yes", "on")
STAND_IN_OFF = ("", "0", "false", "no", "off")

MARKER_HELP = (
    "world_size(*sizes, per_device=False): run this distspawn test once per world size "
    "(items test_x[ws2], test_x[ws4], ...); sizes above what the machine can give are "
    f"skipped (cap: {MAX_WORLD_SIZE_VAR}, else twice the CPUs, at least 4; per_device=True: "
    "the accelerator count)"
)

_XDIST_STATE = pytest.StashKey[tuple]()
# xdist's controller: the folder that holds every worker's private TMPDIR.
_XDIST_RUN_DIR = pytest.StashKey[str]()
_RUN_DIR_KEY = "distspawn_run_dir"  # its name in each worker's workerinput
INDUCTOR_CACHE_VAR = "TORCHINDUCTOR_CACHE_DIR"  # where torch.compile keeps its on-disk cache


def _distspawn_loaded() -> bool:
    return "distspawn.cases.testcase" in sys.modules


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("distspawn")
    group.addoption(
        "--distspawn-max-world-size", type=int, default=None, metavar="N",
        help=f"largest world size to run; bigger ones skip (same as {MAX_WORLD_SIZE_VAR}=N)")
    group.addoption(
        "--distspawn-stand-in", action="store_true", default=False,
        help="run suites that import upstream's harness (torch.testing._internal."
             "common_distributed and the bases built on it) on distspawn's engine, "
             f"unchanged (same as {STAND_IN_VAR}=1)")


def pytest_report_header(config: pytest.Config) -> str:
    # From the installed metadata: the plugin imports no torch (nor distspawn).
    from importlib import metadata

    try:
        version = metadata.version("distspawn")
    except metadata.PackageNotFoundError:
        version = "(not installed)"
    method = os.environ.get("DISTSPAWN_START_METHOD") or "forkserver"
    stand_in = os.environ.get(STAND_IN_VAR, "").strip().lower() in STAND_IN_ON
    return (f"distspawn {version}: rank processes start by {method}, stand-in mode "
            f"{'on' if stand_in else 'off'}")


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser,
                                  args: list[str]) -> None:
    # Before any conftest or test module can import upstream's harness: the
    # stand-in must be in place first (see distspawn.integrations.stand_in).
    if getattr(early_config.known_args_namespace, "distspawn_stand_in", False):
        os.environ[STAND_IN_VAR] = "1"  # ranks and the rank server inherit it
    value = os.environ.get(STAND_IN_VAR, "").strip().lower()
    if value not in STAND_IN_ON + STAND_IN_OFF:
        raise pytest.UsageError(_bad_stand_in_value(os.environ[STAND_IN_VAR]))
    if value not in STAND_IN_ON or any(isinstance(f, _StandInTrigger) for f in sys.meta_path):
        return
    if any(name in sys.modules for name in _StandInTrigger.WATCHED):
        _stand_in_now()  # a plugin imported the harness: stand in, or say why not
    else:
        # distspawn (and torch) are imported, and stand in for upstream's
        # harness, when a conftest or test module first imports the harness:
        # a run that never does pays nothing for the mode.
        sys.meta_path.insert(0, _StandInTrigger())


class _StandInTrigger(importlib.abc.MetaPathFinder):
    """Imports distspawn (which installs the stand-in) right after upstream's harness loads.

    Watched: ``common_distributed``, on which every derived base is built, and
    ``multi_threaded_pg``, which it imports (and some files import alone). The
    names are put in once the outer of the two has run its whole body, and
    before the module that imported it (``common_dtensor``, a test file) takes
    any of them.
    """

    WATCHED = ("torch.testing._internal.common_distributed",
               "torch.testing._internal.distributed.multi_threaded_pg")

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in self.WATCHED:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(name, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _ThenStandIn(spec.loader, self)
        return spec

    def fire(self, loaded: str) -> None:
        others_loading = [w for w in self.WATCHED if w != loaded and getattr(
            getattr(sys.modules.get(w), "__spec__", None), "_initializing", False)]
        if others_loading:
            return  # the outer module fires once its body has run
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        _stand_in_now()


def _stand_in_now() -> None:
    # distspawn stands in as its first subpackage that needs torch is imported,
    # where the variable is set by then. A plugin named by -p is imported
    # before --distspawn-stand-in sets it: where such a plugin imported
    # distspawn's subpackages, that import did not stand in (and the run would
    # go on upstream's harness, at its speed, saying nothing).
    import distspawn

    checked_before = distspawn._stand_in_checked
    from distspawn.integrations import stand_in

    if checked_before and not stand_in.installed():
        stand_in.install_if_requested("--distspawn-stand-in, after a plugin imported distspawn")


class _ThenStandIn:
    """A loader that runs the real one, then the stand-in trigger."""

    def __init__(self, loader: Any, trigger: _StandInTrigger) -> None:
        self._loader = loader
        self._trigger = trigger

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        self._trigger.fire(module.__name__)

    def __getattr__(self, name: str) -> Any:  # get_source, get_code, ... for tracebacks
        return getattr(self._loader, name)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARKER_HELP)
    cap = config.getoption("--distspawn-max-world-size", None)
    if cap is not None:
        if cap < 1:
            raise pytest.UsageError(f"--distspawn-max-world-size={cap}: expected an integer >= 1")
        os.environ[MAX_WORLD_SIZE_VAR] = str(cap)
    # xdist's own mark of a worker (PYTEST_XDIST_WORKER is inherited by every
    # process a worker starts, a nested pytest run included: isolating each of
    # those again nested TMPDIRs until the rank server's socket path was too long).
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        config.stash[_XDIST_STATE] = _isolate_xdist_worker(
            str(workerinput.get("workerid", "gw")), workerinput.get(_RUN_DIR_KEY))


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    # xdist's controller, as it starts each worker (a replacement for a
    # crashed one too). A worker removes its own private TMPDIR as it ends,
    # but one that is killed outright (SIGKILL, the OOM killer, a crash in C)
    # cannot: its rank server's socket folder, store files and whatever its
    # tests left would stay. So every worker's lives in one folder of the run,
    # which the controller, still alive, removes once the workers are gone.
    config = node.config
    run_dir = config.stash.get(_XDIST_RUN_DIR, None)
    if run_dir is None:
        run_dir = config.stash[_XDIST_RUN_DIR] = tempfile.mkdtemp(prefix="distspawn-")
    node.workerinput[_RUN_DIR_KEY] = run_dir


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> bool | None:
    # pytest-timeout's thread method ends the process from its timer thread:
    # distspawn shows where the ranks are first (the signal method's exception
    # gets that note in the test's own thread). Nothing to show without distspawn.
    if not _distspawn_loaded():
        return None
    from distspawn.integrations.pytest_timeout_thread import set_thread_timer
    return set_thread_timer(item, settings)


def pytest_unconfigure(config: pytest.Config) -> None:
    run_dir = config.stash.get(_XDIST_RUN_DIR, None)
    if run_dir is not None:  # the controller: its workers have ended by now
        shutil.rmtree(run_dir, ignore_errors=True)
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


def _bad_stand_in_value(value: str) -> str:
    # The words of distspawn.integrations.stand_in.bad_value_message (test_layout).
    return (f"{STAND_IN_VAR}={value!r}: expected 1 (run upstream's harness modules on "
            "distspawn's engine) or 0 / unset (leave them alone)")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("localhost", 0))
        return sock.getsockname()[1]


def _isolate_xdist_worker(worker: str, run_dir: str | None) -> tuple:
    # Per-test dirs and OS-picked ports already keep tests apart; a private TMPDIR
    # also keeps each worker's forkserver socket, store files and any leftovers
    # apart, and a MASTER_PORT fixed for the whole run must not be shared.
    # run_dir: the controller's folder for them (see pytest_configure_node),
    # where it named one. Short names: the rank server's socket is a path
    # under this folder, and a Unix socket's path takes at most 107 bytes.
    private_dir = None
    if run_dir is not None and os.path.isdir(run_dir):
        try:
            private_dir = os.path.join(run_dir, worker)
            os.mkdir(private_dir, 0o700)
        except FileExistsError:  # (xdist names a replacement worker anew: in case not)
            private_dir = tempfile.mkdtemp(prefix=f"{worker}-", dir=run_dir)
    if private_dir is None:
        private_dir = tempfile.mkdtemp(prefix=f"distspawn-{worker}-")
    saved_environ = {key: os.environ.get(key)
                     for key in ("TMPDIR", "MASTER_PORT", INDUCTOR_CACHE_VAR)}
    saved_tempdir = tempfile.tempdir
    cache = _inductor_cache_outside(tempfile.gettempdir())
    if cache is not None:
        os.environ[INDUCTOR_CACHE_VAR] = cache
    os.environ["TMPDIR"] = private_dir
    tempfile.tempdir = private_dir
    if "MASTER_PORT" in os.environ:
        os.environ["MASTER_PORT"] = str(_free_port())
    return saved_environ, saved_tempdir, private_dir


def _inductor_cache_outside(temp_root: str) -> str | None:
    # torch.compile's on-disk caches (inductor's compiled code, FX graphs,
    # autotuning) are kept, unless this variable says where, in a folder
    # named after the user in the temp folder, where they outlive the run.
    # In a worker's private TMPDIR they were compiled anew each run and
    # removed with the worker (ao's 8 files, -n 2: 135 s against 33 s).
    if os.environ.get(INDUCTOR_CACHE_VAR):
        return None
    try:
        user = getpass.getuser()
    except (KeyError, OSError, ImportError):  # no name for this uid: torch names it so
        user = f"uid_{os.getuid()}" if hasattr(os, "getuid") else "unknown_user"
    return os.path.join(temp_root, "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))


# A rank server started before the test process imported torch: where it
# asks for the test modules, and its environment file (see below).
_early_server: tuple[Any, str] | None = None
_early_server_tried = False  # once a run: a second would find the first running
# The first test file that may start rank processes, as pytest will import it
# (module name, file, the sys.path entry it adds): the server imports it while
# this process does. See _guess_test_modules. (Empty where it cannot be named.)
_guesses: list[tuple[str, str, str]] = []
_guess_state = {"mode": "prepend", "sent": False}  # sent: the guess has gone


def pytest_collect_file(file_path: Any, parent: Any) -> None:
    # The first test file that may start rank processes starts the rank
    # server, so that it imports torch while this process does (about 2 s,
    # otherwise paid by the first test), then that file's module while this
    # process imports it too. That module alone: a server holds one test
    # module (the one whose tests start ranks first), as a rank that imported
    # its own module would; later files are not looked at. Nothing here
    # imports torch.
    global _early_server, _early_server_tried
    if _early_server_tried or not str(file_path).endswith(".py") \
            or parent.config.option.collectonly or _no_core_to_spare(parent.config) \
            or not _collected_as_tests(file_path, parent) \
            or not _may_start_rank_processes(file_path):
        return None
    _early_server_tried = True
    guess = _test_module_guess(file_path, parent.config)
    if guess is not None:
        _guesses.append(guess)
    _early_server = _start_rank_server_early()
    if _early_server is not None:
        _early_server[0].offer_guess(_guess_test_modules)
    return None


def _no_core_to_spare(config: pytest.Config) -> bool:
    # The early start pays where a core would otherwise idle while this
    # process collects. In an xdist worker with as many workers as cores,
    # every core is collecting: the server's imports only compete, and are
    # wasted where the collection shows no test this worker runs starts
    # ranks (ao's two files with no rank test, -n 2 on 2 cores: 13.3 s
    # against 9.5 s on upstream's harness). There the server starts once the
    # collection shows a test that starts ranks.
    workers = getattr(config, "workerinput", {}).get("workercount")
    if not isinstance(workers, int):
        return False
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return workers >= cores


def _test_module_guess(file_path: Any, config: pytest.Config) -> tuple[str, str, str] | None:
    # pytest's "prepend" (the default) and "append" import modes import a file
    # as its dotted path from above its topmost package (the folders upwards
    # that hold an __init__.py), with that folder in sys.path. Its other modes
    # (importlib, namespace packages) name modules otherwise: no guess there.
    mode = str(config.getoption("importmode", "prepend"))
    try:
        namespaces = bool(config.getini("consider_namespace_packages"))
    except ValueError:  # a pytest before 8.1, without that setting
        namespaces = False
    path = pathlib.Path(str(file_path))
    if mode not in ("prepend", "append") or namespaces or not path.stem.isidentifier() \
            or path.name == "__init__.py":
        return None
    _guess_state["mode"] = mode
    parts, root = [path.stem], path.parent
    while (root / "__init__.py").is_file() and root.name.isidentifier():
        parts.insert(0, root.name)
        root = root.parent
    return ".".join(parts), str(path), str(root)


def _guess_test_modules() -> dict[str, Any] | None:
    # Called (from a thread) when the server asks: the guessed modules, and
    # sys.path and the environment as pytest will have them after importing
    # the ones it has not imported yet. (Files collected later are left to
    # the list, after collection.)
    guesses = list(_guesses)
    if not guesses:
        _guess_state["sent"] = True
        return None
    sys_path = list(sys.path)
    for name, _, root in guesses:
        if name in sys.modules:  # imported, or being imported: its entry is in
            continue
        if _guess_state["mode"] == "append":
            if root not in sys_path:
                sys_path.append(root)
        elif not sys_path or sys_path[0] != root:
            sys_path.insert(0, root)
    for _ in range(5):
        try:
            environ = dict(os.environ)
            break
        except RuntimeError:  # changed meanwhile by pytest's thread
            continue
    else:
        environ = None
    _guess_state["sent"] = True
    if environ is None:
        return None
    return {"modules": [[name, file] for name, file, _ in guesses], "sys_path": sys_path,
            "environ": environ}


def _collected_as_tests(file_path: Any, parent: Any) -> bool:
    # pytest 8 calls this hook for every file of each directory on the way to
    # the paths it was given (README.rst, setup.py, other test files, ...):
    # only a file named on the command line, or inside a directory named there
    # and matching python_files, is a test module of this run.
    if parent.session.isinitpath(file_path):
        return True
    path = os.path.realpath(str(file_path))
    base = str(parent.config.invocation_params.dir)
    inside = any(path.startswith(os.path.realpath(os.path.join(base, arg.split("::")[0])) + os.sep)
                 for arg in parent.config.args)
    name = os.path.basename(path)
    return inside and any(fnmatch.fnmatch(path if os.sep in pattern else name, pattern)
                          for pattern in parent.config.getini("python_files"))


def _may_start_rank_processes(file_path: Any) -> bool:
    # A file whose test classes derive from a class that starts rank
    # processes: one of distspawn's, or under the stand-in mode one of
    # upstream's harness, named in the file or reached through the project's
    # own modules. A file that names none starts nothing: one that runs its
    # ranks as threads only (a server importing torch in the background would
    # only compete with the rank threads for the CPUs: a trivial threaded test
    # took twice as long), or names distspawn only for TestCase or the fake
    # backend. A guess the other way costs only a later start: a process class
    # collected starts the server too.
    try:
        with open(file_path, "rb") as f:
            text = f.read(1 << 20)
    except OSError:
        return False
    stand_in = os.environ.get(STAND_IN_VAR, "").strip().lower() in STAND_IN_ON
    names_harness = b"distspawn" in text or (stand_in and b"torch.testing._internal" in text)
    derived = source_scan.derives_from_rank_processes(text, str(file_path), stand_in, sys.path)
    if names_harness and source_scan.PROCESS_RANK_NAMES.search(text):
        # Named, and no class of the file derives from it (one imported for
        # isinstance, a helper or a type hint): no rank is started, unless
        # the file makes classes as it runs (rpc_utils' generate_tests,
        # type(...), globals()), which the source does not show, or imports
        # a rank class from the project (pytest collects it here too).
        if derived is False and not source_scan.MAKES_CLASSES_AT_RUN_TIME.search(text) \
                and source_scan.imports_a_rank_class(text, str(file_path), stand_in,
                                                     sys.path) is False:
            return False
    else:
        # Where a base leads out of sight (an installed package, a star
        # import), a file naming distspawn is taken to start ranks unless it
        # names only the classes that run them as threads.
        if not (derived or (derived is None and b"distspawn" in text
                            and not source_scan.THREAD_RANK_NAMES.search(text))):
            return False
    # A file whose rank tests all skip here (most tests written for GPUs, on
    # a machine without one) starts nothing: a server started for it would
    # only compete with collection for the CPUs.
    return not source_scan.rank_tests_all_skip(text, source_scan.accelerator_device_present())


def _start_rank_server_early() -> tuple[Any, str] | None:
    # distspawn.engine.rank_server's hand-over, without importing torch.
    import multiprocessing

    from distspawn.early import rank_server_boot

    if not sys.platform.startswith("linux") or "forkserver" not in \
            multiprocessing.get_all_start_methods():
        return None
    if os.environ.get("DISTSPAWN_START_METHOD", "forkserver") != "forkserver":
        return None
    try:
        return rank_server_boot.start_server(SERVER_PRELOAD)
    except OSError:
        # e.g. a TMPDIR too long for the server's socket: no early start; the
        # first test that starts ranks gives distspawn's error saying so.
        return None


def _hand_over_early_server() -> None:
    # distspawn is loaded now: its launcher owns the server from here on.
    global _early_server
    if _early_server is not None:
        from distspawn.integrations.pytest_plugin import adopt_early_rank_server

        adopt_early_rank_server(*_early_server)
        _early_server = None


def _drop_early_server() -> None:
    # No distspawn test after all: the server ends now, not after importing
    # torch for nobody.
    global _early_server
    if _early_server is not None:
        from distspawn.early import rank_server_boot

        channel, environ_path = _early_server
        _early_server = None
        rank_server_boot.stop_server()
        channel.close()
        try:  # the server removes it once it has read it
            os.remove(environ_path)
        except OSError:
            pass


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makeitem(collector: Any, name: str, obj: Any) -> Any:
    if not _distspawn_loaded():
        return None
    _hand_over_early_server()
    from distspawn.integrations.pytest_plugin import make_class_collector

    return make_class_collector(collector, name, obj)


def pytest_collection_finish(session: pytest.Session) -> None:
    if _distspawn_loaded() and not session.config.option.collectonly:
        _hand_over_early_server()
        from distspawn.integrations.pytest_plugin import start_rank_server_for

        start_rank_server_for(session.items)
    _drop_early_server()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Any:
    outcome = yield
    if _distspawn_loaded():
        from distspawn.integrations.pytest_plugin import label_rank_failures

        label_rank_failures(item, call, outcome.get_result())
