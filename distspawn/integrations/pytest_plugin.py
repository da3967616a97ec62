"""The parts of the pytest plugin that need torch (see ``distspawn.early.plugin``).

``distspawn.early.plugin`` is the registered plugin and stays light, so pytest runs
that never touch distspawn do not import torch; it hands over to the hooks here
once a test module has imported distspawn.
"""

from __future__ import annotations

from typing import Any

import pytest

from ..cases.testcase import RankDispatchingTestCase
from ..engine.verdict import RANK_FAILURES
from ..cases.empty_world import world_has_no_ranks
from ..cases.sized_variants import sized_class
from .world_sizes import machine_max_world_size, parse_world_sizes

# pytest has no public API for items of unittest classes: world-size items
# extend its private unittest collector and item (checked on pytest 7.0 and the
# newest). Where a pytest moves them, sized tests fail to collect with a
# message naming that pytest; every other test runs as pytest collects it.
try:
    from _pytest.unittest import TestCaseFunction, UnitTestCase
except ImportError as _error:  # pragma: no cover - depends on the pytest installed
    _PRIVATE_PYTEST_PROBLEM: str | None = f"{type(_error).__name__}: {_error}"
    TestCaseFunction = UnitTestCase = object  # type: ignore[misc,assignment]
else:
    _PRIVATE_PYTEST_PROBLEM = None


# -- one item per world size ------------------------------------------------------------


def make_class_collector(collector: Any, name: str, obj: Any) -> Any:
    """Our collector for a distspawn TestCase class, None for anything else."""
    if not (isinstance(obj, type) and issubclass(obj, RankDispatchingTestCase)):
        return None
    if not collector.config.option.collectonly:
        _start_rank_server_early(obj)
    if _PRIVATE_PYTEST_PROBLEM is not None:
        return UncollectableSizedClass.from_parent(collector, name=name, obj=obj) \
            if _asks_for_sizes(obj) else None
    return DistspawnTestClass.from_parent(collector, name=name, obj=obj)


class UncollectableSizedClass(pytest.Class):
    """A class asking for world sizes on a pytest we cannot make sized items for."""

    def collect(self):
        raise self.CollectError(
            f"{self.obj.__qualname__} asks for world sizes, and distspawn cannot make "
            f"world-size items on pytest {pytest.__version__}: its unittest items "
            f"moved ({_PRIVATE_PYTEST_PROBLEM}). Run at the class's world_size "
            "by removing the world_size markers, or use a pytest this distspawn "
            "was tested on (see README, Supported releases).")


def _asks_for_sizes(cls: type) -> bool:
    def marked(obj: Any) -> bool:
        return any(getattr(mark, "name", None) == "world_size"
                   for mark in getattr(obj, "pytestmark", ()))

    return (getattr(cls, "world_sizes", None) is not None or marked(cls)
            or any(marked(getattr(cls, attr)) for attr in dir(cls) if attr.startswith("test")))


class DistspawnTestClass(UnitTestCase):
    """A distspawn TestCase class; expands world-size markers into items."""

    def collect(self):
        for item in super().collect():
            if not isinstance(item, TestCaseFunction):
                yield item
                continue
            spec = self._requested_sizes(item)
            if spec is None:
                yield item
                continue
            sizes, per_device = spec
            try:
                cap, why = machine_max_world_size(per_device)
            except ValueError as exc:
                raise self.CollectError(str(exc)) from None
            for size in sizes:
                name = item.name if len(sizes) == 1 else f"{item.name}[ws{size}]"
                sized = _checked_sized_item(self, name, item.name, size)
                if size > cap:
                    sized.add_marker(pytest.mark.skip(
                        reason=f"world size {size} is more than this machine can give "
                               f"({why})"))
                yield sized

    def _requested_sizes(self, item: TestCaseFunction) -> tuple[list[int], bool] | None:
        marker = item.get_closest_marker("world_size")
        where = f"{self.obj.__qualname__}.{item.name}"
        if marker is not None:
            values = marker.args
            if len(values) == 1 and isinstance(values[0], (list, tuple, range)):
                values = tuple(values[0])
            unknown = set(marker.kwargs) - {"per_device"}
            if unknown:
                raise self.CollectError(
                    f"@pytest.mark.world_size on {where}: unknown option(s) "
                    f"{', '.join(sorted(unknown))}; accepted: per_device=True/False")
            try:
                sizes = parse_world_sizes(values, f"@pytest.mark.world_size on {where}")
            except ValueError as exc:
                raise self.CollectError(str(exc)) from None
            return sizes, bool(marker.kwargs.get("per_device", False))
        declared = getattr(self.obj, "world_sizes", None)
        if declared is None:
            return None
        if isinstance(declared, int):
            declared = (declared,)
        try:
            sizes = parse_world_sizes(declared, f"{self.obj.__qualname__}.world_sizes")
        except (TypeError, ValueError) as exc:
            raise self.CollectError(str(exc)) from None
        return sizes, bool(getattr(self.obj, "world_sizes_per_device", False))


# pytest >= 8.2 keeps one unittest instance per item (made by _getinstance).
_PYTEST_KEEPS_INSTANCE = hasattr(TestCaseFunction, "_getinstance")


class SizedTestCaseFunction(TestCaseFunction):
    """A test method run on a class variant fixed to one world size.

    The item's name carries the size (``test_x[ws2]``) and pytest derives the
    node id from the name; ``method_name`` is the method the item runs.
    """

    def __init__(self, *args: Any, world_size: int, method_name: str, **kwargs: Any) -> None:
        self.world_size = world_size
        self.method_name = method_name
        super().__init__(*args, **kwargs)

    def _getobj(self) -> Any:
        # The item's name is not an attribute of the class; pytest documents
        # _getobj as the hook a subclass overrides to say what it runs. Bound
        # to the item's test case where pytest keeps one (>= 8.2), as its own is.
        owner = self.instance if _PYTEST_KEEPS_INSTANCE else self.parent.obj
        return getattr(owner, self.method_name)

    def _make_testcase(self) -> Any:
        return sized_class(self.parent.obj, self.world_size)(self.method_name)

    # pytest >= 8.2 makes the unittest instance here ...
    def _getinstance(self) -> Any:
        return self._make_testcase()

    if not _PYTEST_KEEPS_INSTANCE:
        # ... older pytest in setup(), by the item's name, which carries [wsN].
        def setup(self) -> None:
            self._explicit_tearDown = None
            self._testcase = self._make_testcase()
            self._obj = getattr(self._testcase, self.method_name)
            if hasattr(self, "_request"):
                self._request._fillfixtures()


def _checked_sized_item(parent: Any, name: str, method_name: str, size: int) -> Any:
    item = SizedTestCaseFunction.from_parent(
        parent, name=name, world_size=size, method_name=method_name)
    if item.name != name or not item.nodeid.endswith(f"::{name}"):
        # Items built through pytest internals: say so rather than run tests
        # under ids nobody can select or rerun.
        raise parent.CollectError(
            f"distspawn's world-size items do not work with pytest {pytest.__version__}: "
            f"the item for {method_name} at world size {size} got node id {item.nodeid!r}, "
            f"expected one ending in '::{name}'. Please report this with your pytest version.")
    return item


# -- rank-labelled failure reports --------------------------------------------------------


def label_rank_failures(item: pytest.Item, call: pytest.CallInfo, report: Any) -> None:
    """Give each failing rank of a distributed test its own report section."""
    if report.when != "call" or not report.failed or call.excinfo is None:
        return
    failure = call.excinfo.value
    if not isinstance(failure, RANK_FAILURES) or not failure.failed_ranks:
        return
    if not item.config.getoption("xmlpath", None):
        # JUnit XML keeps only the main report, so there the whole text stays in it.
        report.longrepr = failure.summary
    for detail in failure.failed_ranks:
        report.sections.append(
            (f"rank {detail.rank}: {detail.problem}", detail.details or "(nothing recorded)"))


# -- a warm rank server -------------------------------------------------------------------

def _forkserver_class(cls: Any) -> bool:
    from ..cases.continuous import MultiProcContinuousTest
    from ..cases.local_dtensor import runs_every_rank_here
    from ..cases.multiprocess import MultiProcessTestCase
    from ..engine import launch

    if not (isinstance(cls, type)
            and issubclass(cls, (MultiProcessTestCase, MultiProcContinuousTest))) \
            or runs_every_rank_here(cls):
        return False
    try:
        return launch.resolve_start_method(getattr(cls, "start_method", None)) == "forkserver"
    except ValueError:
        return False  # the test itself reports the bad value


def adopt_early_rank_server(channel: Any, environ_path: str) -> None:
    """Hand a server the light plugin started (before torch was imported) to the launcher."""
    from ..engine import rank_server

    rank_server.adopt_rank_server(channel, environ_path)


def _start_rank_server_early(cls: type) -> None:
    # The first multi-process test class collected: the server starts
    # importing torch now, while pytest collects the rest.
    # (A world sized from the accelerators, on a machine without: no rank starts.)
    if _forkserver_class(cls) and _class_may_run_a_test(cls) and not world_has_no_ranks(cls):
        # No module yet: the list is the kept tests' modules, once collection
        # is over (a module whose tests -k or -m deselect is not preloaded: a
        # rank's own import would not have imported it).
        _start_quietly([], more_to_come=True)


# -- tests skipped before they run ---------------------------------------------------------
# A module whose rank tests all skip by decorator is not preloaded into the
# rank server: importing it there would only compete with this process for
# the CPUs. A condition pytest evaluates from a string counts as "may run".


def _mark_skips(mark: Any) -> bool:
    name = getattr(mark, "name", None)
    if name == "skip":
        return True
    if name != "skipif":
        return False
    kwargs = getattr(mark, "kwargs", {})
    conditions = [*getattr(mark, "args", ()),
                  *([kwargs["condition"]] if "condition" in kwargs else [])]
    for condition in conditions:
        if isinstance(condition, str):
            continue
        try:
            if bool(condition):
                return True
        except Exception:  # noqa: BLE001 - a condition with no truth value: may run
            continue
    return False


def _skipped_by_decorator(obj: Any) -> bool:
    if getattr(obj, "__unittest_skip__", False):
        return True
    marks = getattr(obj, "pytestmark", ())
    return any(_mark_skips(mark) for mark in
               (marks if isinstance(marks, (list, tuple)) else [marks]))


def _class_may_run_a_test(cls: type) -> bool:
    if _skipped_by_decorator(cls):
        return False
    tests = [getattr(cls, name, None) for name in dir(cls) if name.startswith("test")]
    return any(callable(test) and not _skipped_by_decorator(test) for test in tests)


def _item_may_run(item: pytest.Item) -> bool:
    # iter_markers covers the test's, its class's and its module's pytest marks.
    if any(_mark_skips(mark) for mark in item.iter_markers()):
        return False
    return not any(getattr(getattr(item, attr, None), "__unittest_skip__", False)
                   for attr in ("obj", "cls"))


def start_rank_server_for(items: list[pytest.Item]) -> None:
    """Start the forkserver with the modules of the collected multi-process tests in it.

    Called once collection is over: the server imports torch, distspawn and
    those modules while the first test sets up, and ranks of every later test
    are forked with all of it loaded (``engine.warm_modules`` says which
    modules it leaves out and why).
    """
    from ..engine import rank_server

    modules = []
    for item in items:
        cls = getattr(item, "cls", None)
        if _forkserver_class(cls) and cls.__module__ not in modules and _item_may_run(item) \
                and not world_has_no_ranks(cls):
            modules.append(cls.__module__)
    if modules:
        _start_quietly(modules)  # also tells an early-started server the list
    else:
        # Started early on a guess (a file naming a rank class), yet no
        # collected test starts ranks: a run that starts none pays for none.
        rank_server.stop_rank_server()


def _start_quietly(modules: list[str], more_to_come: bool = False) -> None:
    # At collection a server that cannot start (a TMPDIR too long for its
    # socket) is no error yet: the first test that starts ranks says why.
    from ..engine import rank_server

    try:
        rank_server.start_rank_server(modules, more_to_come=more_to_come)
    except ValueError:
        pass
