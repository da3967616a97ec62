"""The assertions upstream's ``common_utils.TestCase`` adds to unittest's.

Distributed test files call these on ``self`` (``assertGreaterAlmostEqual`` in
the DistributedTest suite, ``assertExpectedInline`` in DTensor and FSDP
tests, ...), so a file moved to distspawn needs them with the same names,
signatures and meaning. Each is written here from upstream's documented
behaviour; ``test/test_testcase_parity.py`` lists the ones left out and why.
"""

from __future__ import annotations

import contextlib
import gc
import os
import re
import sys
import unittest.mock
import warnings
from collections.abc import Iterable
from typing import Any, Callable, Iterator

import torch

# How expecttest names the variable that makes the inline expectations accept
# new output; read on every call, so a test may set it in os.environ.
EXPECTTEST_ACCEPT_VAR = "EXPECTTEST_ACCEPT"

# Terminal colour and cursor sequences (ESC + Fe byte, or a CSI sequence).
_ANSI_ESCAPE = re.compile(r"\x1b(?:[@-Z\\-_]|\[[0-?]*[ -/]*[@-~])")
# Where torch appends a C++ stack to an error message.
_CPP_STACK_HEADER = "\nException raised from"


@contextlib.contextmanager
def _torch_warns_always() -> Iterator[None]:
    # TORCH_WARN_ONCE warnings fire once per process; a test that checks for
    # one must see it every time.
    before = torch.is_warn_always_enabled()
    torch.set_warn_always(True)
    try:
        yield
    finally:
        torch.set_warn_always(before)


class _CudaMemoryLeakCheck:
    """Fails the test when CUDA memory allocated inside the block is still held after it."""

    def __init__(self, testcase: unittest.TestCase, name: str) -> None:
        self.testcase = testcase
        self.name = name
        self.before: list[int] = []

    @staticmethod
    def _allocated() -> list[int]:
        if not torch.cuda.is_initialized():
            return []
        return [torch.cuda.memory_allocated(i) for i in range(torch.cuda.device_count())]

    def __enter__(self) -> "_CudaMemoryLeakCheck":
        gc.collect()
        self.before = self._allocated()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            return  # the test's own error says more than a leak would
        gc.collect()
        after = self._allocated()
        for device, (was, now) in enumerate(zip(self.before, after)):
            if now > was:
                self.testcase.fail(
                    f"{self.name} leaked {now - was} bytes of CUDA memory on device "
                    f"{device} ({was} allocated before, {now} after)")


class UpstreamAssertions:
    """Mixed into distspawn's ``TestCase``: upstream's extra assertions."""

    def assertGreaterAlmostEqual(self, first: Any, second: Any, places: int | None = None,  # noqa: N802
                                 msg: str | None = None, delta: float | None = None) -> None:
        """``first >= second``, or short of it by less than ``delta`` (or ``places``)."""
        if delta is not None and places is not None:
            raise TypeError("assertGreaterAlmostEqual: give delta or places, not both")
        if first >= second:
            return
        shortfall = second - first
        if delta is not None:
            if shortfall <= delta:
                return
            within = f"{delta} delta"
        else:
            places = 7 if places is None else places
            if round(shortfall, places) == 0:
                return
            within = f"{places} places"
        standard = f"{first} not greater than or equal to {second} within {within}"
        raise self.failureException(self._formatMessage(msg, standard))

    def assertEqualIgnoreType(self, *args: Any, **kwargs: Any) -> None:  # noqa: N802
        """``assertEqual`` that ignores dtype differences."""
        __tracebackhide__ = True
        self.assertEqual(*args, exact_dtype=False, **kwargs)

    def assertEqualBroadcasting(self, x: Any, y: Any, *args: Any, **kwargs: Any) -> None:  # noqa: N802
        """``assertEqual`` with ``y`` (a number or a nested list) broadcast to ``x``'s shape."""
        __tracebackhide__ = True
        if not isinstance(y, Iterable):
            y = torch.ones_like(x) * y
        elif not isinstance(y, torch.Tensor):
            y = torch.ones_like(x) * torch.tensor(y)
        self.assertEqual(x, y, *args, **kwargs)

    def assertEqualTypeString(self, x: torch.Tensor, y: torch.Tensor) -> None:  # noqa: N802
        """Same device, dtype and sparsity (what ``x.type() == y.type()`` checked)."""
        __tracebackhide__ = True
        self.assertEqual(x.device, y.device)
        self.assertEqual(x.dtype, y.dtype)
        self.assertEqual(x.is_sparse, y.is_sparse)

    def assertObjectIn(self, obj: Any, iterable: Iterable[Any]) -> None:  # noqa: N802
        """``obj`` itself (by identity, not equality) is an element of ``iterable``."""
        if not any(element is obj for element in iterable):
            raise AssertionError("object not found in iterable")

    def assertLogs(self, logger: Any = None, level: Any = None):  # noqa: N802
        """unittest's ``assertLogs``, on the ``torch`` logger when none is named."""
        return super().assertLogs("torch" if logger is None else logger, level)

    def assertNoLogs(self, logger: Any = None, level: Any = None):  # noqa: N802
        """unittest's ``assertNoLogs``, on the ``torch`` logger when none is named."""
        return super().assertNoLogs("torch" if logger is None else logger, level)

    def assertNotWarn(self, callable: Callable[[], Any], msg: str = "") -> None:  # noqa: N802, A002
        """Calling ``callable()`` raises no warning at all (torch's once-only ones included)."""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with _torch_warns_always():
                callable()
        self.assertTrue(len(caught) == 0, msg)

    @contextlib.contextmanager
    def assertWarnsOnceRegex(self, category: type[Warning], regex: str = "") -> Iterator[None]:  # noqa: N802
        """The block warns with ``category`` and a message matching ``regex`` at its start.

        Torch's once-per-process warnings are made to fire every time inside.
        """
        pattern = re.compile(regex)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with _torch_warns_always():
                yield
        if not caught:
            self.fail("no warning caught")
        self.assertTrue(any(type(w.message) is category for w in caught),
                        f"no {category.__name__} among {[w.message for w in caught]}")
        self.assertTrue(any(pattern.match(str(w.message)) for w in caught),
                        f"{pattern}, {[w.message for w in caught if type(w.message) is category]}")

    def assertNoUnraisable(self, callable: Callable[..., Any], *args: Any,  # noqa: N802, A002
                           **kwargs: Any) -> None:
        """Calling ``callable`` raises no "unraisable" exception (one Python can only print)."""
        raised = []
        gc_was_enabled = gc.isenabled()
        gc.disable()  # a collection inside would report someone else's
        try:
            with unittest.mock.patch("sys.unraisablehook", raised.append):
                callable(*args, **kwargs)
        finally:
            if gc_was_enabled:
                gc.enable()
        self.assertIsNone(raised[-1] if raised else None)

    def assertLeaksNoCudaTensors(self, name: str | None = None) -> _CudaMemoryLeakCheck:  # noqa: N802
        """A context manager failing the test when CUDA memory allocated inside is kept."""
        return _CudaMemoryLeakCheck(self, self.id() if name is None else name)

    # -- inline expectations (expecttest's contract) ---------------------------

    def substituteExpected(self, pattern: str, replacement: str) -> None:  # noqa: N802
        """Replace ``pattern`` by ``replacement`` in actual output before comparing."""
        filters = self.__dict__.setdefault("_expect_filters", {})
        if pattern in filters:
            raise RuntimeError(f"Cannot remap {pattern} to {replacement} "
                               f"(existing mapping is {filters[pattern]})")
        if len(filters) == 0:
            self.addCleanup(self.__dict__.pop, "_expect_filters", None)
        filters[pattern] = replacement

    def assertMultiLineEqualMaybeCppStack(self, expect: str, actual: str,  # noqa: N802
                                          *args: Any, **kwargs: Any) -> None:
        """``assertMultiLineEqual``, ignoring a C++ stack torch appended to ``actual``."""
        if _CPP_STACK_HEADER in actual:
            actual = actual.rsplit(_CPP_STACK_HEADER, 1)[0]
        self.assertMultiLineEqual(expect, actual, *args, **kwargs)

    def assertExpectedInline(self, actual: Any, expect: str, skip: int = 0,  # noqa: N802
                             ignore_comments: bool = False,
                             ignore_empty_lines: bool = False) -> None:
        """``str(actual)`` equals the string literal ``expect``.

        With ``EXPECTTEST_ACCEPT=1`` set and ``expecttest`` installed, a differing
        ``expect`` literal is rewritten in the test's source instead (``skip``
        says how many helper frames sit between the literal and this call).
        """
        __tracebackhide__ = True
        actual = _ANSI_ESCAPE.sub("", actual if isinstance(actual, str) else str(actual))
        expect = _ANSI_ESCAPE.sub("", expect)
        for wanted, clean in ((ignore_comments, self.remove_comment_lines),
                              (ignore_empty_lines, self.remove_empty_lines)):
            if wanted:
                actual, expect = clean(actual), clean(expect)
        for pattern, replacement in self.__dict__.get("_expect_filters", {}).items():
            actual = actual.replace(pattern, replacement)
        if not os.environ.get(EXPECTTEST_ACCEPT_VAR):
            self.assertMultiLineEqualMaybeCppStack(
                expect, actual,
                msg=f"To accept the new output, re-run the test with {EXPECTTEST_ACCEPT_VAR}=1 "
                    "(needs the expecttest package; commit your changes first)")
            return
        if actual == expect:
            return
        try:
            from expecttest import assert_expected_inline
        except ImportError:
            raise self.failureException(
                f"{EXPECTTEST_ACCEPT_VAR} is set, but the new output cannot be written into "
                "the test file: the expecttest package is not installed "
                "(pip install expecttest)") from None
        # expecttest finds the literal `skip + 1` frames above its own caller.
        assert_expected_inline(actual, expect, skip=skip + 1, debug_id=self.id(),
                               assert_eq=self.assertMultiLineEqualMaybeCppStack)

    def remove_comment_lines(self, input_string: str) -> str:
        """``input_string`` without its lines that start with ``#``."""
        return "\n".join(line for line in input_string.split("\n")
                         if not line.strip().startswith("#"))

    def remove_empty_lines(self, input_string: str) -> str:
        """``input_string`` without its blank lines."""
        return "\n".join(line for line in input_string.split("\n") if line.strip())

    def assertExpectedRaisesInline(self, exc_type: type[BaseException],  # noqa: N802
                                   callable: Callable[..., Any], expect: str,  # noqa: A002
                                   *args: Any, **kwargs: Any) -> None:
        """``callable(*args, **kwargs)`` raises ``exc_type`` whose text equals ``expect``."""
        __tracebackhide__ = True
        try:
            callable(*args, **kwargs)
        except exc_type as error:
            self.assertExpectedInline(str(error), expect, skip=1)
            return
        self.fail(msg="Did not raise when expected to")


def cuda_sync_failed() -> bool:
    """True when CUDA is in use and a device error makes every later test fail too."""
    if not torch.cuda.is_initialized():
        return False
    try:
        torch.cuda.synchronize()
    except RuntimeError as error:
        print(f"distspawn: stopping the test run: torch.cuda.synchronize() failed: {error}",
              file=sys.stderr)
        return True
    return False
