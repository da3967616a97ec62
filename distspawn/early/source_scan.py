"""What a test file's source says before pytest imports it.

The pytest plugin (``distspawn.early.plugin``) starts the rank server while pytest
imports the first test file that may start rank processes, so that the server
imports torch meanwhile. It decides from the file's text, before the test
process imports torch or the file: these helpers read that text. Each guess
errs towards "ranks may start": a wrong one only costs a later start.
"""

from __future__ import annotations

import ast
import builtins
import functools
import glob
import os
import re
import sys
from typing import Any

# Names that show a file runs its ranks as threads of the test process, and
# the classes that start rank processes (test/test_pytest_plugin.py checks
# that these name every such class distspawn exports), with rpc_utils'
# generate_tests, which makes such classes. The local DTensor bases
# (LocalDTensorTestBase, ...) run every rank in the test process: neither.
THREAD_RANK_NAMES = re.compile(
    rb"\b(?:MultiThreadedTestCase|spawn_threads_and_init_comms|threaded_world"
    rb"|FSDPTestMultiThread|(?:Local)?DTensorOpTestBase)\b")
PROCESS_RANK_NAMES = re.compile(
    rb"\b(?:MultiProcessTestCase|MultiProcContinu?ousTest|DynamoDistributedMultiProcTestCase"
    rb"|DTensor(?:Continuous)?TestBase|FSDPTest(?:Continuous)?|DistributedTestBase"
    rb"|DistributedTest|TestDistBackend|C10dTorchCommsTestBase|ShardedTensorTestBase"
    rb"|SpawnHelper|generate_tests)\b")

# Where a file makes its test classes as it runs (so its source shows none).
MAKES_CLASSES_AT_RUN_TIME = re.compile(rb"\bgenerate_tests\b|\btype\(|\bglobals\(\)")


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
    globals(), only_for=...)`` where ``only_for`` names no ``"cpu"`` (or
    ``except_for`` names it) gives no test
    (pytest never sees the generic class), and so does a class whose world size
    is the accelerator count (``min(torch.cuda.device_count(), 4)``): 0 ranks,
    no rank to start. A rank class's tests are
    its own and those of the file's classes it derives from. Whatever it
    cannot see (a test inherited from an imported class, a class made at run
    time) counts as a test that runs: the guess only ever costs a later start.
    """
    tree = parsed(text)
    if tree is None:
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
    # names no "cpu", or an except_for that names it (pytorch's
    # tensor/parallel/test_tp_style.py): each a string, a list or tuple of
    # them, or a module name bound only to such values (pytorch's
    # test_functional_api.py: DEVICE = "cuda", or "hpu" / "xpu" under an if).
    # Anything else may mean cpu.
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

    def named(call: Any, keyword: str) -> set[str] | None:
        value = next((k.value for k in call.keywords if k.arg == keyword), None)
        names = None if value is None else device_names([value])
        return None if names is None else {name.lower() for name in names}

    found, maybe_cpu = set(), set()
    for call in calls:
        only_for, except_for = named(call, "only_for"), named(call, "except_for")
        if (only_for and "cpu" not in only_for) or (except_for and "cpu" in except_for):
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


# Where a test class's bases lead. A file may take its rank class from a
# module of its own project (torchao's tests subclass
# torchao.testing.utils.TorchAOTensorParallelTestCase), or name distspawn only
# for helpers (TestCase, the fake backend): the file's text alone cannot tell
# whether a rank process starts. These follow each base, without importing
# anything, through the project's own files.
_HARNESS_MODULES = ("distspawn",)
_UPSTREAM_HARNESS = "torch.testing._internal"
_MAX_HOPS = 6  # modules followed from the test file, through re-exports


def derives_from_rank_processes(text: bytes, path: str, stand_in: bool,
                                search_path: list[str]) -> bool | None:
    """Whether a class of the file derives from a class that starts rank processes.

    Each class's bases are followed through the file's own classes and those
    of the project's modules it imports (files found upwards of the test file
    or on ``search_path``, not installed packages) to a name of distspawn's
    (or, where ``stand_in``, upstream's harness) that starts rank processes:
    True. False where every base ends in a name that starts none (the
    standard library's, torch's, the harness's other classes); None where a
    base leads where this cannot read (an installed package, a star import, a
    class made at run time).
    """
    if not _names_a_base_to_follow(text):
        return False
    module = parsed(text)
    if module is None:
        return None
    roots = _search_roots(path, search_path)
    return _any_of([_class_starts_ranks(node, module, path, roots, stand_in, 0)
                    for node in _module_level_classes(module.body)])


def imports_a_rank_class(text: bytes, path: str, stand_in: bool,
                         search_path: list[str]) -> bool | None:
    """Whether the file imports, from a module of the project, a class that starts ranks.

    pytest collects a test class imported into a test file as one of the
    file's own. The harness's own classes hold no tests and are not counted.
    True, False, or None where a name leads where this cannot read (an
    installed package, a star import).
    """
    module = parsed(text)
    if module is None:
        return None
    roots = _search_roots(path, search_path)
    verdicts: list[bool | None] = []
    for node in _module_level(module.body):
        if not isinstance(node, ast.ImportFrom):
            continue
        source = node.module or ""
        if node.level == 0 and (_is_distspawn(source) or _is_upstream_harness(source)):
            continue
        for alias in node.names:
            verdicts.append(None if alias.name == "*" else _imported_starts_ranks(
                source, alias.name, node.level, path, roots, stand_in, 0))
    return _any_of(verdicts)


# Bases that are no rank class wherever they come from in practice: a file
# whose classes derive from these alone (or that has no class with a base:
# pytest's test functions and plain classes) is not parsed. pytest asks about
# each file it collects until the rank server starts, so in a suite that
# starts none, every file: reading the class lines costs far less than
# parsing (about 3 ms a file).
_CLASS_BASES = re.compile(rb"^[ \t]*class[ \t]+\w+[ \t]*\(([^)]*)\)", re.MULTILINE)
_PLAIN_BASES = frozenset({
    b"object", b"TestCase", b"unittest.TestCase", b"IsolatedAsyncioTestCase",
    b"unittest.IsolatedAsyncioTestCase", b"nn.Module", b"torch.nn.Module", b"Module",
    b"Exception", b"RuntimeError", b"ValueError", b"Enum", b"enum.Enum", b"NamedTuple"})


def _names_a_base_to_follow(text: bytes) -> bool:
    for bases in _CLASS_BASES.findall(text):
        for base in bases.split(b","):
            base = base.strip()
            if base and b"=" not in base and base not in _PLAIN_BASES:
                return True  # (keywords such as metaclass= are no base)
    return False


def _module_level(body: list) -> list:
    # The statements run when the module is imported: its own, also under an
    # if or a try (not those of a function's body).
    found = []
    for node in body:
        found.append(node)
        if isinstance(node, (ast.If, ast.Try)):
            found += _module_level(node.body + node.orelse + getattr(node, "finalbody", [])
                                   + [item for handler in getattr(node, "handlers", [])
                                      for item in handler.body])
    return found


def _module_level_classes(body: list) -> list:
    # The classes pytest can collect (not those made inside a function).
    return [node for node in _module_level(body) if isinstance(node, ast.ClassDef)]


@functools.lru_cache(maxsize=1)
def parsed(text: bytes) -> Any:
    """The file's syntax tree, None if it does not parse; kept for the next question.

    The plugin asks :func:`derives_from_rank_processes`, then
    :func:`rank_tests_all_skip`, about the same text: it is parsed once.
    """
    return _tree_or_none(text)


def _tree_or_none(text: bytes) -> Any:
    try:
        return ast.parse(text)
    except (SyntaxError, ValueError):
        return None


@functools.lru_cache(maxsize=256)
def _module_at(file: str) -> Any:
    try:
        with open(file, "rb") as f:
            return _tree_or_none(f.read(1 << 20))
    except OSError:
        return None


def _search_roots(path: str, search_path: list[str]) -> tuple[str, ...]:
    # The folders upwards of the test file (where its project's packages sit,
    # whatever pytest's rootdir), then the interpreter's path less the
    # installed packages and the standard library.
    return _roots_from(os.path.dirname(os.path.abspath(path)), tuple(search_path))


@functools.lru_cache(maxsize=64)
def _roots_from(folder: str, search_path: tuple[str, ...]) -> tuple[str, ...]:
    roots = []
    while True:
        roots.append(folder)
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    installed = _installed_folders()
    for entry in search_path:
        real = os.path.realpath(entry or ".")
        if real not in installed and "site-packages" not in real and "dist-packages" not in real \
                and real not in roots and os.path.isdir(real):
            roots.append(real)
    return tuple(roots)


@functools.lru_cache(maxsize=1)
def _installed_folders() -> frozenset[str]:
    import sysconfig  # not loaded by a plain pytest run: only when bases are followed

    return frozenset(os.path.realpath(sysconfig.get_paths()[key])
                     for key in ("stdlib", "platstdlib", "purelib", "platlib"))


def _class_starts_ranks(node: Any, module: Any, path: str, roots: tuple[str, ...],
                        stand_in: bool, hops: int) -> bool | None:
    return _any_of([_base_starts_ranks(base, module, path, roots, stand_in, hops)
                    for base in node.bases])


def _any_of(verdicts: list[bool | None]) -> bool | None:
    # True if one is; else None if one cannot tell; else False.
    if any(verdicts):
        return True
    return None if None in verdicts else False


def _base_starts_ranks(base: Any, module: Any, path: str, roots: tuple[str, ...],
                       stand_in: bool, hops: int) -> bool | None:
    if isinstance(base, ast.Subscript):  # Generic[T], ...
        base = base.value
    parts = []
    while isinstance(base, ast.Attribute):
        parts.insert(0, base.attr)
        base = base.value
    if not isinstance(base, ast.Name):
        return None  # a call, or anything else computed
    head, name = base.id, (parts[-1] if parts else base.id)
    imports = _imports_of(module)
    if not parts:
        local = next((node for node in _module_level_classes(module.body)
                      if node.name == head), None)
        if local is not None:
            if hops > _MAX_HOPS:
                return None
            return _class_starts_ranks(local, module, path, roots, stand_in, hops + 1)
        if any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == head
               for node in _module_level(module.body)):
            return False  # a function: no class (an import of one is asked about)
        if head in imports and imports[head][1] is not None:
            source, original, level = imports[head]
            return _imported_starts_ranks(source, original, level, path, roots, stand_in, hops)
        if hasattr(builtins, head):  # object, Exception, ...
            return False
        # Not bound here: a star import, or made at run time. A harness's name
        # counts, as the text's own search would count it.
        return True if PROCESS_RANK_NAMES.fullmatch(head.encode()) else None
    if head not in imports:
        return None
    source, original, level = imports[head]
    dotted = ".".join(filter(None, [source, original, *parts[:-1]]))
    return _imported_starts_ranks(dotted, name, level, path, roots, stand_in, hops)


def _imports_of(module: Any) -> dict[str, tuple[str, str | None, int]]:
    # name bound -> (module, name in it or None for a module, relative level);
    # kept on the tree, which each class of the module asks again.
    bound = getattr(module, "distspawn_imports", None)
    if bound is not None:
        return bound
    bound = {}
    for node in _module_level(module.body):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if alias.name != "*":
                    bound[alias.asname or alias.name] = (node.module or "", alias.name, node.level)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    bound[alias.asname] = (alias.name, None, 0)
                else:  # "import a.b" binds a
                    top = alias.name.split(".")[0]
                    bound[top] = (top, None, 0)
    module.distspawn_imports = bound
    return bound


def _imported_starts_ranks(source: str, name: str, level: int, path: str,
                           roots: tuple[str, ...], stand_in: bool,
                           hops: int) -> bool | None:
    if level == 0:
        top = source.split(".")[0]
        if _is_distspawn(source):
            return PROCESS_RANK_NAMES.fullmatch(name.encode()) is not None
        if _is_upstream_harness(source):
            return stand_in and PROCESS_RANK_NAMES.fullmatch(name.encode()) is not None
        if top == "torch" or top in sys.stdlib_module_names:
            return False
    if hops >= _MAX_HOPS:
        return None
    file = _module_file(source, level, path, roots)
    module = None if file is None else _module_at(file)
    if module is None:
        return None
    return _base_starts_ranks(ast.Name(id=name), module, file, roots, stand_in, hops + 1)


def _is_distspawn(dotted: str) -> bool:
    return dotted.split(".")[0] in _HARNESS_MODULES


def _is_upstream_harness(dotted: str) -> bool:
    return dotted == _UPSTREAM_HARNESS or dotted.startswith(_UPSTREAM_HARNESS + ".")


@functools.lru_cache(maxsize=1024)
def _module_file(dotted: str, level: int, path: str, roots: tuple[str, ...]) -> str | None:
    parts = [part for part in dotted.split(".") if part]
    if level:
        folder = os.path.dirname(os.path.abspath(path))
        for _ in range(level - 1):
            folder = os.path.dirname(folder)
        candidates = [folder]
    else:
        candidates = list(roots)
    for folder in candidates:
        base = os.path.join(folder, *parts)
        for file in (base + ".py", os.path.join(base, "__init__.py")):
            if os.path.isfile(file):
                return file
    return None
