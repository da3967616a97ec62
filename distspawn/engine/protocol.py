"""Messages between the parent and its rank processes.

Two channels per rank:

* the *control* pipe, duplex, shaped as upstream's (``parent_pipe`` in
  ``_run``/``run_test``): the parent may send :class:`Event` requests on it and a
  rank answers a stack request with plain text;
* the *result* pipe, owned by distspawn: each rank sends exactly one
  :class:`RankReport` saying how its test ended. It is separate so that user
  overrides of ``run_test`` (which close the control pipe) cannot lose the
  result. Ranks that are to leave together also send :data:`DEPARTING` on it
  when done with their test, and wait for the parent's :data:`LEAVE`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Event(enum.Enum):
    """Requests the parent sends a rank over the control pipe."""

    GET_TRACEBACK = 1


# A rank is done with its test and waits to leave with the others; the parent
# answers LEAVE once every rank is done, one has exited, or the verdict is known.
DEPARTING = "departing"
LEAVE = "leave"


class ReportStatus(str, enum.Enum):
    PASSED = "passed"
    FAILED = "failed"    # the test raised; ``traceback`` holds it
    SKIPPED = "skipped"  # the test skipped itself; ``reason`` says why
    EXITED = "exited"    # the test called sys.exit(); ``exit_code`` holds the code


@dataclass(frozen=True)
class RankReport:
    """How one rank's run of one test ended, sent before the rank exits."""

    rank: int
    test_name: str
    status: ReportStatus
    traceback: str | None = None
    reason: str | None = None
    exit_code: int | None = None
    # (group, description, number, function, reduce op) of each call that took
    # a reduce op (engine.reduce_ops), compared across ranks by the parent.
    reduce_ops: tuple = ()
