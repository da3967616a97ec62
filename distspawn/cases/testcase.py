"""The TestCase base class (tensor-aware assertEqual, seeding) and run_tests().

A small, dependency-free stand-in for the parts of upstream's
``common_utils.TestCase`` that distributed tests rely on.
"""

from __future__ import annotations

import argparse
import cmath
import functools
import inspect
import os
import random
import sys
import types
import unittest
from collections.abc import Mapping, Sequence
from typing import Any, Callable

import numpy as np
import torch

from ..fixtures.device_probe import has_accelerator
from .assertions import UpstreamAssertions, cuda_sync_failed
from .subprocess_checks import SubprocessChecks
from .global_state import GlobalState
from ..engine.verdict import SkipRule
from ..fixtures.environment import SEED
from ..fixtures.helpers import reset_dynamo

__all__ = ["TestCase", "run_tests", "set_rng_seed", "rerun_command"]


def set_rng_seed(seed: int | None = None) -> None:
    """Seed torch, random and numpy (default: upstream's seed, 1234)."""
    seed = SEED if seed is None else seed
    if has_accelerator():
        torch.manual_seed(seed)
    else:
        # torch.manual_seed would also queue seeding for every lazily initialised
        # device module, recording a stack each time (about 1 ms); with no
        # accelerator, the CPU generator is all there is to seed.
        torch.default_generator.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


_NUMBER_TYPES = (bool, int, float, complex, np.number, np.bool_)


def _is_number(value: Any) -> bool:
    return isinstance(value, _NUMBER_TYPES)


def _is_tensor_like(value: Any) -> bool:
    return isinstance(value, (torch.Tensor, np.ndarray))


def _is_dtensor(value: Any) -> bool:
    # Looked up only where torch.distributed.tensor is already imported.
    dtensor = getattr(sys.modules.get("torch.distributed.tensor"), "DTensor", None)
    return isinstance(dtensor, type) and isinstance(value, dtensor)


def _is_sequence(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes, bytearray))


class _Mismatch(AssertionError):
    pass


def _at(where: str) -> str:
    # A mismatch's message starts with where in the values it was found, if inside.
    return f"{where}: " if where else ""


class _Comparison:
    """One assertEqual call: walks containers, compares leaves, says where they differ."""

    def __init__(self, *, atol, rtol, equal_nan, exact_dtype, exact_device, exact_layout,
                 exact_stride) -> None:
        if (atol is None) != (rtol is None):
            raise ValueError("assertEqual: give both atol and rtol, or neither")
        self.atol, self.rtol = atol, rtol
        self.equal_nan = equal_nan
        self.exact_dtype, self.exact_device = exact_dtype, exact_device
        self.exact_layout, self.exact_stride = exact_layout, exact_stride

    def compare(self, x: Any, y: Any, where: str = "") -> None:
        if _is_tensor_like(x) or _is_tensor_like(y):
            self._tensors(x, y, where)
        elif _is_number(x) and _is_number(y):
            self._numbers(x, y, where)
        elif isinstance(x, Mapping) and isinstance(y, Mapping):
            if set(x) != set(y):
                raise _Mismatch(f"{where or 'mappings'}: keys differ: {sorted(map(repr, x))} "
                                f"!= {sorted(map(repr, y))}")
            for key in x:
                self.compare(x[key], y[key], f"{where}[{key!r}]")
        elif _is_sequence(x) and _is_sequence(y):
            if len(x) != len(y):
                raise _Mismatch(f"{where or 'sequences'}: lengths differ: {len(x)} != {len(y)}")
            for index, (a, b) in enumerate(zip(x, y)):
                self.compare(a, b, f"{where}[{index}]")
        elif not (x == y):
            raise _Mismatch(f"{_at(where)}{x!r} != {y!r}")

    def _numbers(self, x, y, where) -> None:
        if all(isinstance(v, (int, np.integer, np.bool_)) for v in (x, y)):
            if int(x) != int(y):
                raise _Mismatch(f"{_at(where)}scalars are not equal: "
                                f"{x!r} != {y!r}")
            return
        x, y = complex(x), complex(y)
        # Equal infinities are equal (their difference is nan), and unequal
        # ones never are (inf is within a tolerance of rtol * inf).
        if x == y or (self.equal_nan and cmath.isnan(x) and cmath.isnan(y)):
            return
        atol = 1e-7 if self.atol is None else self.atol
        rtol = 1e-7 if self.rtol is None else self.rtol
        difference = abs(x - y)
        if not (cmath.isfinite(difference) and difference <= atol + rtol * abs(y)):
            xs, ys = (v.real if v.imag == 0 else v for v in (x, y))
            raise _Mismatch(f"{_at(where)}scalars are not close: "
                            f"{xs!r} != {ys!r} (atol={atol}, rtol={rtol})")

    def _tensors(self, x, y, where) -> None:
        x, y = self._as_tensors(x, y, where)
        y = self._of_related_type(x, y)
        if _is_number(x) and _is_number(y):
            self._numbers(x, y, where)
            return
        try:
            torch.testing.assert_close(
                x, y, atol=self.atol, rtol=self.rtol, equal_nan=self.equal_nan,
                check_dtype=self.exact_dtype, check_device=self.exact_device,
                check_layout=self.exact_layout, check_stride=self.exact_stride,
            )
        except AssertionError as exc:
            raise _Mismatch(f"{_at(where)}{exc}") from None
        except (TypeError, ValueError) as exc:
            # Values that cannot be compared (a DTensor against a plain tensor,
            # a tensor against a string): an error, as upstream's assertEqual
            # lets it through, not a failure.
            raise type(exc)(f"{_at(where)}{exc}") from None

    @staticmethod
    def _of_related_type(x, y):
        # assert_close refuses two tensors of unrelated subclasses (a LocalTensor
        # against the AsyncCollectiveTensor a functional collective returns);
        # upstream's assertEqual compares any two tensors. So y's values go into
        # a tensor of x's type with y's shape, strides, dtype and device, and
        # assert_close checks those as it would have checked y's own.
        if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)):
            return y
        if isinstance(x, type(y)) or isinstance(y, type(x)):
            return y
        try:
            return x.new_empty_strided(y.size(), y.stride(), dtype=y.dtype,
                                       device=y.device).copy_(y)
        except Exception:  # noqa: BLE001 - types that do not mix: assert_close says so
            return y

    @staticmethod
    def _as_tensors(x, y, where):
        x, y = (torch.from_numpy(v) if isinstance(v, np.ndarray) else v for v in (x, y))
        # A number against a one-element tensor compares values, not dtypes.
        for number_side in (0, 1):
            number, tensor = (x, y) if number_side == 0 else (y, x)
            if _is_number(number) and _is_dtensor(tensor):
                # Which rank's value? torch.testing decides, as it does under
                # upstream's assertEqual (2.13 and 2.15 refuse; 2.8 compares).
                number = torch.as_tensor(number)
                return (number, tensor) if number_side == 0 else (tensor, number)
            if _is_number(number) and isinstance(tensor, torch.Tensor):
                if tensor.numel() != 1:
                    raise _Mismatch(f"{_at(where)}cannot compare a "
                                    f"number with a tensor of {tensor.numel()} elements "
                                    f"(shape {tuple(tensor.shape)})")
                value = tensor.item()
                return (number, value) if number_side == 0 else (value, number)
        if isinstance(x, torch.Tensor) and _is_sequence(y):
            y = torch.as_tensor(y, dtype=x.dtype, device=x.device)
        elif isinstance(y, torch.Tensor) and _is_sequence(x):
            x = torch.as_tensor(x, dtype=y.dtype, device=y.device)
        return x, y


class TestCase(UpstreamAssertions, SubprocessChecks, unittest.TestCase):
    """``unittest.TestCase`` with upstream's tensor-aware ``assertEqual`` and seeding.

    ``assertEqual`` compares tensors, numpy arrays, numbers and nested
    containers with :func:`torch.testing.assert_close` semantics; a number is
    equal to a one-element tensor holding it. Every test starts from the same
    torch / random / numpy seed, and fails where it leaks the global state the
    installed release's upstream TestCase guards (:mod:`distspawn.cases.global_state`).
    The other assertions upstream's TestCase adds
    (``assertGreaterAlmostEqual``, ``assertExpectedInline``, ...) come from
    :class:`~distspawn.cases.assertions.UpstreamAssertions`, and its helpers
    that run Python in a fresh interpreter from
    :class:`~distspawn.cases.subprocess_checks.SubprocessChecks`.
    """

    # Upstream's class-level tolerance overrides (0 means "use the defaults").
    precision: float = 0.0
    rel_tol: float = 0.0
    # Upstream's switch: fail a test that starts or ends with a default dtype
    # other than torch.float (pytorch's own files turn it on).
    _default_dtype_check_enabled: bool = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        upstream = getattr(sys.modules.get(UPSTREAM_TESTCASE_MODULE), "TestCase", None)
        if isinstance(upstream, type) and issubclass(cls, upstream):
            derive_from_upstreams_testcase(upstream)

    def setUp(self) -> None:
        super().setUp()
        set_rng_seed()
        # Re-based on upstream's TestCase, its setUp guards the global state itself.
        if not on_upstreams_testcase():
            self._global_state = GlobalState(self._default_dtype_check_enabled)

    def tearDown(self) -> None:
        super().tearDown()
        state = self.__dict__.pop("_global_state", None)
        if state is not None:
            state.restore_and_check()

    @staticmethod
    def _reset_dynamo_if_imported() -> None:
        """Reset torch.compile's state where a test brought dynamo in (upstream's, 2.15)."""
        reset_dynamo()

    def _should_stop_test_suite(self) -> bool:
        """Whether the rest of a unittest run should be skipped after this test.

        As upstream: only when CUDA is in use and broken (a device-side error
        fails every later test too). Under pytest, ``-x`` is the way to stop.
        """
        return cuda_sync_failed()

    def run(self, result: unittest.TestResult | None = None):
        outcome = super().run(result)
        if isinstance(result, unittest.TestResult) and self._should_stop_test_suite():
            if result.wasSuccessful():
                # A run that stops must not look like a full, passing one.
                result.failures.append(
                    (self, "TestSuite execution was aborted early: "
                           f"{type(self).__name__}._should_stop_test_suite() returned True"))
            result.stop()
        return outcome

    def assertEqual(  # noqa: N802 - unittest naming
        self,
        x: Any,
        y: Any,
        msg: str | Callable[[str], str] | None = None,
        *,
        atol: float | None = None,
        rtol: float | None = None,
        equal_nan: bool = True,
        exact_dtype: bool = True,
        exact_device: bool = False,
        exact_layout: bool = False,
        exact_stride: bool = False,
        exact_is_coalesced: bool = False,
    ) -> None:
        __tracebackhide__ = True
        if on_upstreams_testcase():
            # Under upstream's harness these tests get its assertEqual, so its
            # rules decide, to the last edge case.
            return super().assertEqual(
                x, y, msg, atol=atol, rtol=rtol, equal_nan=equal_nan, exact_dtype=exact_dtype,
                exact_device=exact_device, exact_layout=exact_layout,
                exact_stride=exact_stride, exact_is_coalesced=exact_is_coalesced)
        if atol is None and rtol is None and (self.precision or self.rel_tol):
            atol, rtol = self.precision, self.rel_tol
        comparison = _Comparison(
            atol=atol, rtol=rtol, equal_nan=equal_nan, exact_dtype=exact_dtype,
            exact_device=exact_device, exact_layout=exact_layout, exact_stride=exact_stride,
        )
        try:
            comparison.compare(x, y)
        except _Mismatch as mismatch:
            generated = str(mismatch)
            if callable(msg):
                text = msg(generated)
            elif msg is not None:
                text = f"{generated}\n{msg}" if self.longMessage else str(msg)
            else:
                text = generated
            raise self.failureException(text) from None

    def assertNotEqual(self, x: Any, y: Any, msg: str | None = None, **kwargs: Any) -> None:  # noqa: N802
        __tracebackhide__ = True
        try:
            self.assertEqual(x, y, **kwargs)
        except self.failureException:
            return
        raise self.failureException(msg or f"{x!r} == {y!r}, expected them to differ")


UPSTREAM_TESTCASE_MODULE = "torch.testing._internal.common_utils"


def on_upstreams_testcase() -> bool:
    """Whether distspawn's TestCase has been re-based on upstream's (the stand-in
    mode, or a class that mixes upstream's in: see derive_from_upstreams_testcase)."""
    return unittest.TestCase not in TestCase.__bases__


def derive_from_upstreams_testcase(upstream: type) -> None:
    """Put upstream's ``common_utils.TestCase`` below distspawn's :class:`TestCase`.

    Test files mix upstream's TestCase with the harness classes
    (``instantiate_device_type_tests`` makes ``class XCPU(CPUTestBase, X)``,
    ``CPUTestBase`` being upstream's TestCase). Were distspawn's TestCase not
    one, upstream's would come first in such a class's MRO, and its setUp,
    which calls no super(), would hide distspawn's: the test would not know
    whether it runs in the parent or a rank. Re-based, distspawn's own
    methods still come first and upstream's TestCase runs below them, as
    under upstream's harness. Done when such a class is made (and by the
    stand-in mode up front); upstream's module is never imported for it.
    """
    if not issubclass(TestCase, upstream):
        TestCase.__bases__ = tuple(upstream if base is unittest.TestCase else base
                                   for base in TestCase.__bases__)


class RankDispatchingTestCase(TestCase):
    """Base of the process and thread test cases.

    Each test method is wrapped (upstream's ``join_or_run``): in the main
    process or thread it starts nothing itself but waits for the ranks
    (``_join_ranks``); in a rank it runs the real test body.
    """

    _MAIN_DESCRIPTION = "the main process"
    # Upstream's rule, on this kind of rank, for ranks that disagree about
    # skipping: what ``lenient_skips`` and the stand-in mode (``upstream_verdicts``),
    # both defined by each subclass, ask for.
    _UPSTREAM_SKIP_RULE = SkipRule.RANK_ZERO

    @classmethod
    def _skip_rule(cls) -> SkipRule:
        if cls.lenient_skips or cls.upstream_verdicts:
            return cls._UPSTREAM_SKIP_RULE
        return SkipRule.AGREE

    def _is_main(self, rank: int) -> bool:
        raise NotImplementedError

    def _join_ranks(self, fn: Callable) -> None:
        raise NotImplementedError

    def run(self, result: unittest.TestResult | None = None):
        try:
            return super().run(result)
        except KeyboardInterrupt:
            # unittest leaves a test's clean-ups undone after Ctrl-C (and after
            # SIGTERM, which distspawn raises as KeyboardInterrupt). Ours end
            # the ranks and remove their files, wherever the interrupt landed:
            # in setUp after the ranks started, in the join, or in tearDown.
            self.doCleanups()
            raise

    def join_or_run(self, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(self):
            rank = getattr(self, "rank", None)
            if rank is None:
                raise RuntimeError(
                    f"{type(self).__name__}.setUp did not call super().setUp(): the test "
                    f"does not know whether it is {self._MAIN_DESCRIPTION} or a rank")
            if self._is_main(rank):
                self._join_ranks(fn)
            else:
                fn()

        return types.MethodType(wrapper, self)

    def __init__(self, method_name: str = "runTest", methodName: str = "runTest") -> None:
        # unittest passes methodName; some runners pass method_name. Accept both.
        if methodName != "runTest":
            method_name = methodName
        super().__init__(method_name)
        try:
            fn = getattr(self, method_name)
        except AttributeError:
            return  # a bare instance with no test method, as unittest allows
        setattr(self, method_name, self.join_or_run(fn))


def rerun_command(test: unittest.TestCase) -> str:
    """A shell command that runs just ``test`` again, the way it was run now."""
    cls = type(test)
    name = test._testMethodName
    try:
        path = inspect.getsourcefile(cls) or ""
    except TypeError:
        path = ""
    if path:
        relative = os.path.relpath(path)
        path = relative if not relative.startswith("..") else path
    # pytest names the running test here ("path::Cls::test_x[ws2] (call)"); a child
    # of a pytest run inherits a stale value, hence the name check.
    node = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]
    item = node.rsplit("::", 1)[-1]
    if path and (item == name or item.startswith(name + "[")):
        return f"python -m pytest '{path}::{cls.__qualname__.replace('.', '::')}::{item}'"
    if cls.__module__ in ("__main__", "__mp_main__") and path:
        return f"python {path} {cls.__qualname__}.{name}"
    return f"python -m unittest {cls.__module__}.{cls.__qualname__}.{name}"


def _upstream_flag_parser() -> argparse.ArgumentParser:
    # Flags upstream's run_tests() takes: accepted so that existing command lines
    # keep working; those with no meaning here are ignored.
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for flag in ("--subprocess", "--accept", "--test-bailouts", "--test_bailouts",
                 "--use-pytest", "--discover-tests", "--rerun-disabled-tests"):
        parser.add_argument(flag, action="store_true")
    parser.add_argument("--jit-executor", "--jit_executor", type=str)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--save-xml", nargs="?", const="test-reports", default=None)
    parser.add_argument("--log-suffix", type=str, default="")
    parser.add_argument("--run-parallel", type=int, default=1)
    parser.add_argument("--import-slow-tests", nargs="?", const="")
    parser.add_argument("--import-disabled-tests", nargs="?", const="")
    parser.add_argument("--pytest-single-test", type=str, nargs=1)
    parser.add_argument("--showlocals", action=argparse.BooleanOptionalAction, default=False)
    return parser


def run_tests(argv: list[str] | None = None) -> None:
    """Run the tests of ``__main__`` like upstream's ``run_tests`` and exit.

    Upstream's own flags (``--repeat``, ``--use-pytest``, ``--save-xml``, ...)
    are accepted; everything else goes to ``unittest`` (test names, ``-k``,
    ``-v``, ...). Exits non-zero when any test failed or errored.
    """
    argv = list(sys.argv if argv is None else argv)
    args, remaining = _upstream_flag_parser().parse_known_args(argv[1:])
    if args.save_xml is not None:
        print("distspawn: --save-xml is not supported by run_tests(); ignoring it",
              file=sys.stderr)
    if args.repeat < 1:
        raise SystemExit(f"--repeat={args.repeat}: expected an integer >= 1")
    if args.use_pytest:
        import pytest

        main_file = inspect.getsourcefile(sys.modules["__main__"])
        raise SystemExit(pytest.main([main_file, *remaining]))
    ok = True
    for _ in range(args.repeat):
        program = unittest.main(module="__main__", argv=[argv[0], *remaining], exit=False)
        result = program.result
        ok = ok and result.wasSuccessful()
    raise SystemExit(0 if ok else 1)
