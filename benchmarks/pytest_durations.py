"""A pytest plugin for the benchmarks: each test's duration at full precision.

pytest's JUnit XML rounds durations to the millisecond, too coarse for a
threaded test that takes a few. ``-p pytest_durations`` (run from this folder)
writes ``{nodeid: seconds}`` (setup + call + teardown, as JUnit sums them), in
run order, to the file named by ``DISTSPAWN_BENCH_DURATIONS``.
"""

from __future__ import annotations

import json
import os
from typing import Any

_durations: dict[str, float] = {}


def pytest_runtest_logreport(report: Any) -> None:
    _durations[report.nodeid] = _durations.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session: Any) -> None:
    path = os.environ.get("DISTSPAWN_BENCH_DURATIONS")
    if path:
        with open(path, "w") as f:
            json.dump(_durations, f)
