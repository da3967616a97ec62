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

import ast
import fnmatch
import functools
import glob
import importlib.abc
import multiprocessing.util
import os
import re
import shutil
import socket
import sys
import tempfile
from typing import Any

import pytest

MAX_WORLD_SIZE_VAR = "DISTSPAWN_MAX_WORLD_SIZE"  # read by distspawn.world_sizes
# What distspawn.engine.rank_server uses (importing it would import torch;
# test/test_layout.py checks that they agree).
SERVER_PRELOAD = ["__main__", "distspawn_rank_server", "distspawn.engine.preload"]
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
        import distspawn  # noqa: F401 - a plugin imported the harness: stand in, or say why not
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
        import distspawn  # noqa: F401 - installs the stand-in


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
        config.stash[_XDIST_STATE] = _isolate_xdist_worker(str(workerinput.get("workerid", "gw")))


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


def _bad_stand_in_value(value: str) -> str:
    # The words of distspawn.integrations.stand_in.bad_value_message (test_layout).
    return (f"{STAND_IN_VAR}={value!r}: expected 1 (run upstream's harness modules on "
            "distspawn's engine) or 0 / unset (leave them alone)")


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


# A rank server started before the test process imported torch: the socket it
# waits on for the test modules, and its environment file (see below).
_early_server: tuple[socket.socket, str] | None = None


# Names that show a file runs its ranks as threads of the test process, and
# the classes that start rank processes (test/test_pytest_plugin.py checks
# that these name every such class distspawn exports).
THREAD_RANK_NAMES = re.compile(
    rb"\b(?:MultiThreadedTestCase|spawn_threads_and_init_comms|threaded_world"
    rb"|FSDPTestMultiThread|(?:Local)?DTensorOpTestBase)\b")
PROCESS_RANK_NAMES = re.compile(
    rb"\b(?:MultiProcessTestCase|MultiProcContinu?ousTest|DynamoDistributedMultiProcTestCase"
    rb"|(?:Local)?DTensor(?:Continuous)?TestBase|FSDPTest(?:Continuous)?|DistributedTestBase"
    rb"|DistributedTest|TestDistBackend|C10dTorchCommsTestBase)\b")


def pytest_collect_file(file_path: Any, parent: Any) -> None:
    # The first test file that may start rank processes starts the rank
    # server, so that it imports torch while this process does (about 2 s,
    # otherwise paid by the first test). Nothing here imports torch.
    global _early_server
    if (_early_server is None and str(file_path).endswith(".py")
            and not parent.config.option.collectonly and _collected_as_tests(file_path, parent)
            and _may_start_rank_processes(file_path)):
        _early_server = _start_rank_server_early()
    return None


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
    # A file that mentions distspawn, unless it plainly runs its ranks as
    # threads only: there a server importing torch in the background would
    # only compete with the rank threads for the CPUs (a trivial threaded test
    # took twice as long). A guess the other way costs only a later start: a
    # process class collected starts the server too.
    try:
        with open(file_path, "rb") as f:
            text = f.read(1 << 20)
    except OSError:
        return False
    if b"distspawn" not in text:
        # Under the stand-in mode, files that import upstream's harness run on
        # distspawn's engine without naming it; one that names no class that
        # starts rank processes (it may use common_utils alone) starts nothing.
        stand_in = os.environ.get(STAND_IN_VAR, "").strip().lower() in STAND_IN_ON
        if not (stand_in and b"torch.testing._internal" in text
                and PROCESS_RANK_NAMES.search(text)):
            return False
    elif THREAD_RANK_NAMES.search(text) and not PROCESS_RANK_NAMES.search(text):
        return False
    # A file whose rank tests all skip here (most tests written for GPUs, on
    # a machine without one) starts nothing: a server started for it would
    # only compete with collection for the CPUs.
    return not rank_tests_all_skip(text, accelerator_device_present())


# A device node of each kind of accelerator torch runs distributed tests on:
# NVIDIA, AMD (ROCm), Intel (XPU; also any GPU with a render node), Habana and
# other accel-class drivers, Ascend, AWS Neuron. Checked instead of asking
# torch, which this process has not imported yet.
ACCELERATOR_DEVICE_NODES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd", "/dev/dri/renderD*",
                            "/dev/accel/*", "/dev/davinci*", "/dev/neuron*")


@functools.lru_cache(maxsize=None)
def accelerator_device_present() -> bool:
    """Whether this machine may have an accelerator (True where it cannot tell).

    Asked once a run: pytest asks for each file it collects until one starts
    the server.
    """
    if not sys.platform.startswith("linux"):
        return True
    return any(glob.glob(pattern) for pattern in ACCELERATOR_DEVICE_NODES)


# Words of a condition on an accelerator being there (not on NCCL: CUDA builds
# have it on machines without a GPU).
_ACCELERATOR_WORDS = re.compile(
    r"cuda|gpu|device_count|accelerator|rocm|(?<![a-z])(?:xpu|hpu|npu|hip\b)", re.IGNORECASE)
# Skips decided in the test process, before any rank starts: unittest's skip
# decorators (and those built on them, such as skip_but_pass_in_sandcastle_if)
# and pytest's skip marks. Not skip_if_lt_x_gpu: its ranks start, and skip.
_ALWAYS_SKIPS = re.compile(r"(?:^|\.)skip$")  # unittest.skip(...), pytest.mark.skip
_SKIPS_UNLESS = re.compile(r"(?:^|\.)skipUnless$")
_SKIPS_IF = re.compile(r"(?:^|\.)(?:skipIf|skipif|skip_but_pass_in_sandcastle_if)$")


def rank_tests_all_skip(text: bytes, accelerator: bool) -> bool:
    """Whether the source shows that every test of the file's rank classes skips.

    Read from the text, as pytest has not imported the file yet. A test skips
    when the module skips itself (``pytestmark = pytest.mark.skip``; without
    an accelerator, ``if not torch.cuda.is_available(): pytest.skip(...)``),
    or its class or the test itself carries a skip decided before any rank
    starts: ``@unittest.skip``, and without an accelerator
    ``@skipUnless(torch.cuda.is_available(), ...)``,
    ``@pytest.mark.skipif(device_count() < 4, ...)``,
    ``@skip_but_pass_in_sandcastle_if(not TEST_MULTIGPU, ...)``. (A test under
    ``@skip_if_lt_x_gpu`` starts its ranks, which skip.) Without an accelerator,
    a class made into per-device classes by ``instantiate_device_type_tests(cls,
    globals(), only_for=...)`` where ``only_for`` names no ``"cpu"`` gives no test
    (pytest never sees the generic class), and so does a class whose world size
    is the accelerator count (``min(torch.cuda.device_count(), 4)``): 0 ranks,
    no rank to start. A rank class's tests are
    its own and those of the file's classes it derives from. Whatever it
    cannot see (a test inherited from an imported class, a class made at run
    time) counts as a test that runs: the guess only ever costs a later start.
    """
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return False
    local_classes: dict[str, Any] = {}
    rank_classes: set[str] = set()
    no_cpu_classes = set() if accelerator or b"instantiate_device_type_tests" not in text \
        else _instantiated_for_accelerators_only(tree)
    for node in tree.body:
        if isinstance(node, ast.If) and not accelerator \
                and _holds_without_accelerator(node.test) \
                and any(_skips_the_module(statement) for statement in node.body):
            return True
        if isinstance(node, ast.Assign) and any(
                isinstance(target, ast.Name) and target.id == "pytestmark"
                for target in node.targets) and _skips(node.value, accelerator):
            return True
        if not isinstance(node, ast.ClassDef):
            continue
        local_classes[node.name] = node
        bases = [ast.unparse(base) for base in node.bases]
        if not any(PROCESS_RANK_NAMES.search(base.encode()) or base in rank_classes
                   for base in bases):
            continue
        rank_classes.add(node.name)
        if node.name in no_cpu_classes or any(
                _skips(decorator, accelerator) for decorator in node.decorator_list) \
                or not accelerator and _world_sized_by_accelerators(node, local_classes):
            continue
        tests = _own_tests(node)
        for base in bases:
            if base in local_classes:
                tests += _own_tests(local_classes[base])
            elif not PROCESS_RANK_NAMES.search(base.encode()):
                return False  # may bring tests of its own
        if not tests or not all(any(_skips(decorator, accelerator)
                                    for decorator in test.decorator_list)
                                for test in tests):
            return False
    return bool(rank_classes)


def _instantiated_for_accelerators_only(tree: Any) -> set[str]:
    # Classes passed to instantiate_device_type_tests with an only_for that
    # names no "cpu": a string, a list or tuple of them, or a module name
    # bound only to such values (pytorch's test_functional_api.py: DEVICE =
    # "cuda", or "hpu" / "xpu" under an if). Anything else may mean cpu.
    bound: dict[str, list[Any]] = {}
    calls = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    bound.setdefault(target.id, []).append(node.value)
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Name) \
                and getattr(node.func, "id", getattr(node.func, "attr", None)) \
                == "instantiate_device_type_tests":
            calls.append(node)

    def device_names(values: list, depth: int = 0) -> list[str] | None:
        # Every string the values can be, or None where one may be anything.
        names: list[str] = []
        for value in values:
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                names.append(value.value)
                continue
            if isinstance(value, (ast.List, ast.Tuple)):
                found = device_names(value.elts, depth)
            elif isinstance(value, ast.Name) and value.id in bound and depth < 3:
                found = device_names(bound[value.id], depth + 1)
            else:
                found = None
            if found is None:
                return None
            names += found
        return names

    found, maybe_cpu = set(), set()
    for call in calls:
        only_for = next((k.value for k in call.keywords if k.arg == "only_for"), None)
        names = None if only_for is None else device_names([only_for])
        if names and "cpu" not in (name.lower() for name in names):
            found.add(call.args[0].id)
        else:
            maybe_cpu.add(call.args[0].id)
    return found - maybe_cpu


def _world_sized_by_accelerators(cls: Any, local_classes: dict[str, Any]) -> bool:
    # world_size = (or a property returning) a device count, or min() of one
    # and anything: 0 without an accelerator. The class's own, else the first
    # of its bases in this file that sets one.
    for owner in [cls, *(local_classes[ast.unparse(base)] for base in cls.bases
                         if ast.unparse(base) in local_classes)]:
        for item in owner.body:
            if isinstance(item, ast.FunctionDef) and item.name == "world_size":
                body = item.body  # read only where it is one return
                value = body[0].value if len(body) == 1 and isinstance(body[0], ast.Return) \
                    else None
            elif isinstance(item, ast.Assign) and any(
                    getattr(target, "id", None) == "world_size" for target in item.targets):
                value = item.value
            else:
                continue
            return value is not None and _counts_accelerators(value)
    return False


def _counts_accelerators(value: Any) -> bool:
    if not isinstance(value, ast.Call):
        return False
    name = ast.unparse(value.func)
    if name == "min":
        return any(_counts_accelerators(arg) for arg in value.args)
    owner = name.removesuffix("device_count")
    return owner != name and bool(_ACCELERATOR_WORDS.search(owner))


def _own_tests(cls: Any) -> list:
    return [item for item in cls.body
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
            and item.name.startswith("test")]


def _skips(decorator: Any, accelerator: bool) -> bool:
    # A skip decorator or mark that skips on this machine before ranks start.
    called = decorator.func if isinstance(decorator, ast.Call) else decorator
    name = ast.unparse(called)
    if _ALWAYS_SKIPS.search(name):
        return True
    if accelerator or not isinstance(decorator, ast.Call) or not decorator.args:
        return False
    condition = decorator.args[0]
    if _SKIPS_UNLESS.search(name):
        return bool(_ACCELERATOR_WORDS.search(ast.unparse(condition)))
    return bool(_SKIPS_IF.search(name)) and _holds_without_accelerator(condition)


def _holds_without_accelerator(condition: Any) -> bool:
    # "not <has one>", "<count> < n", "<count> <= n", "<count> == 0", and
    # either side of an "or".
    if not _ACCELERATOR_WORDS.search(ast.unparse(condition)):
        return False
    if isinstance(condition, ast.UnaryOp) and isinstance(condition.op, ast.Not):
        return True
    if isinstance(condition, ast.Compare):
        return all(isinstance(op, (ast.Lt, ast.LtE)) or (
            isinstance(op, ast.Eq) and isinstance(right, ast.Constant) and right.value == 0)
            for op, right in zip(condition.ops, condition.comparators))
    if isinstance(condition, ast.BoolOp) and isinstance(condition.op, ast.Or):
        return any(_holds_without_accelerator(value) for value in condition.values)
    return False


def _skips_the_module(statement: Any) -> bool:
    # pytest.skip(..., allow_module_level=True) or raise unittest.SkipTest(...).
    source = ast.unparse(statement)
    return (isinstance(statement, ast.Expr) and "skip(" in source
            and "allow_module_level" in source) \
        or (isinstance(statement, ast.Raise) and "SkipTest" in source)


def _start_rank_server_early() -> tuple[socket.socket, str] | None:
    # distspawn.engine.rank_server's hand-over, without importing torch.
    import multiprocessing

    import distspawn_rank_server

    if not sys.platform.startswith("linux") or "forkserver" not in \
            multiprocessing.get_all_start_methods():
        return None
    if os.environ.get("DISTSPAWN_START_METHOD", "forkserver") != "forkserver":
        return None
    try:
        return distspawn_rank_server.start_server(SERVER_PRELOAD)
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
        import distspawn_rank_server

        listening, environ_path = _early_server
        _early_server = None
        distspawn_rank_server.stop_server()
        listening.close()
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
