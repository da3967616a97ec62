"""The parts of the pytest plugin that need torch (see ``distspawn_pytest``).

``distspawn_pytest`` is the registered plugin and stays light, so pytest runs
that never touch distspawn do not import torch; it hands over to the hooks here
once a test module has imported distspawn.
"""

from __future__ import annotations

from typing import Any

import pytest
from _pytest.unittest import TestCaseFunction, UnitTestCase

from .testcase import RankDispatchingTestCase
from .verdict import RankFailure
from .world_sizes import machine_max_world_size, parse_world_sizes, sized_class


# -- one item per world size ------------------------------------------------------------


def make_class_collector(collector: Any, name: str, obj: Any) -> Any:
    """Our collector for a distspawn TestCase class, None for anything else."""
    if isinstance(obj, type) and issubclass(obj, RankDispatchingTestCase):
        return DistspawnTestClass.from_parent(collector, name=name, obj=obj)
    return None


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
                sized = SizedTestCaseFunction.from_parent(
                    self, name=name, originalname=item.name, world_size=size)
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


class SizedTestCaseFunction(TestCaseFunction):
    """A test method run on a class variant fixed to one world size."""

    def __init__(self, *args: Any, world_size: int, **kwargs: Any) -> None:
        self.world_size = world_size
        super().__init__(*args, **kwargs)

    def _make_testcase(self) -> Any:
        return sized_class(self.parent.obj, self.world_size)(self.originalname)

    # pytest >= 8.2 makes the unittest instance here ...
    def _getinstance(self) -> Any:
        return self._make_testcase()

    if not hasattr(TestCaseFunction, "_getinstance"):
        # ... older pytest in setup(), by the item's name, which now carries [wsN].
        def setup(self) -> None:
            self._explicit_tearDown = None
            self._testcase = self._make_testcase()
            self._obj = getattr(self._testcase, self.originalname)
            if hasattr(self, "_request"):
                self._request._fillfixtures()


# -- rank-labelled failure reports --------------------------------------------------------


def label_rank_failures(item: pytest.Item, call: pytest.CallInfo, report: Any) -> None:
    """Give each failing rank of a distributed test its own report section."""
    if report.when != "call" or not report.failed or call.excinfo is None:
        return
    failure = call.excinfo.value
    if not isinstance(failure, RankFailure) or not failure.failed_ranks:
        return
    if not item.config.getoption("xmlpath", None):
        # JUnit XML keeps only the main report, so there the whole text stays in it.
        report.longrepr = failure.summary
    for detail in failure.failed_ranks:
        report.sections.append(
            (f"rank {detail.rank}: {detail.problem}", detail.details or "(nothing recorded)"))
