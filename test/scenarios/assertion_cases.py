"""Upstream TestCase assertions, each called once; prints what happened as JSON.

Usage: python assertion_cases.py [upstream]
With "upstream", the calls go to torch.testing._internal.common_utils.TestCase;
otherwise to distspawn.TestCase. Each case ends as "pass" or "raises <Type>".
A second mode, "methods", prints the public method names of the chosen TestCase.
"""

import json
import logging
import os
import pathlib
import sys
import tempfile
import warnings

import torch

if "upstream" in sys.argv[1:]:
    from torch.testing._internal.common_utils import TestCase
else:
    from distspawn import TestCase


class Probe(TestCase):
    def runTest(self):
        pass


def warn(text, category=UserWarning):
    warnings.warn(text, category, stacklevel=2)


class Unraisable:
    def __del__(self):
        raise ValueError("raised in __del__")


def make_unraisable():
    Unraisable()


def warns_once(t, category, regex, text=None):
    with t.assertWarnsOnceRegex(category, regex):
        if text is not None:
            warn(text)


def logs_on_torch(t):
    with t.assertLogs():
        logging.getLogger("torch.distspawn_probe").warning("hello")


def leaks_nothing(t):
    with t.assertLeaksNoCudaTensors():
        torch.ones(1)


def raise_value_error(text):
    raise ValueError(text)


INF = float("inf")


def one_rank_dtensor(value):
    """A replicated DTensor on a world of one (the group made on first use)."""
    import torch.distributed as dist
    from torch.distributed.tensor import Replicate, distribute_tensor, init_device_mesh

    if not dist.is_initialized():
        dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    return distribute_tensor(torch.tensor(value), init_device_mesh("cpu", (1,)), [Replicate()])


class NotLoadable:
    """Saved by reference to this script, which a fresh interpreter cannot import."""


def load_elsewhere(t, saved, imports, expected=None):
    # _attempt_load_from_subprocess: a weights_only load in a fresh interpreter.
    with tempfile.TemporaryDirectory() as folder:
        path = pathlib.Path(folder) / "saved.pt"
        torch.save(saved, path)
        t._attempt_load_from_subprocess(path, imports, expected)


def child_output(t):
    out, err = t.run_process_no_exception(
        "import os, sys; print(os.environ['PROBE']); print('e', file=sys.stderr); sys.exit(3)",
        env={**os.environ, "PROBE": "o"})
    t.assertEqual((out, err), (b"o\n", b"e\n"))


F32, I64 = torch.float32, torch.int64
CASES = {
    "greater_almost_equal_greater": lambda t: t.assertGreaterAlmostEqual(2.0, 1.0),
    "greater_almost_equal_within_places": lambda t: t.assertGreaterAlmostEqual(1.0, 1.00000001),
    "greater_almost_equal_short": lambda t: t.assertGreaterAlmostEqual(1.0, 1.1),
    "greater_almost_equal_places_1": lambda t: t.assertGreaterAlmostEqual(1.0, 1.04, places=1),
    "greater_almost_equal_delta_ok": lambda t: t.assertGreaterAlmostEqual(1.0, 1.05, delta=0.1),
    "greater_almost_equal_delta_short": lambda t: t.assertGreaterAlmostEqual(1.0, 1.2, delta=0.1),
    "greater_almost_equal_both_given": lambda t: t.assertGreaterAlmostEqual(
        1, 2, places=1, delta=1),
    "equal_ignore_type": lambda t: t.assertEqualIgnoreType(
        torch.ones(2), torch.ones(2, dtype=I64)),
    "equal_ignore_type_values_differ": lambda t: t.assertEqualIgnoreType(
        torch.ones(2), torch.zeros(2, dtype=I64)),
    "equal_dtypes_differ": lambda t: t.assertEqual(torch.ones(2), torch.ones(2, dtype=I64)),
    "equal_exact_dtype_false": lambda t: t.assertEqual(
        torch.ones(2), torch.ones(2, dtype=I64), exact_dtype=False),
    "equal_atol_rtol_within": lambda t: t.assertEqual(
        torch.tensor(1.0), torch.tensor(1.05), atol=0.1, rtol=0),
    "equal_atol_rtol_outside": lambda t: t.assertEqual(
        torch.tensor(1.0), torch.tensor(1.05), atol=0.01, rtol=0),
    "equal_only_atol": lambda t: t.assertEqual(torch.tensor(1.0), torch.tensor(1.0), atol=0.1),
    "equal_msg": lambda t: t.assertEqual(1, 2, msg="custom message"),
    "equal_exact_device": lambda t: t.assertEqual(torch.ones(1), torch.ones(1),
                                                  exact_device=True),
    "equal_nested": lambda t: t.assertEqual({"a": [torch.ones(1), 2]}, {"a": [torch.ones(1), 2]}),
    "equal_number_and_tensor": lambda t: t.assertEqual(3, torch.tensor(3)),
    # pytorch's test_op_strategy.py: a redistribute cost of inf, as expected.
    "equal_infinities": lambda t: t.assertEqual(float("inf"), float("inf")),
    "equal_infinity_and_tensor": lambda t: t.assertEqual(torch.tensor(-INF), -INF),
    "equal_opposite_infinities": lambda t: t.assertEqual(float("inf"), float("-inf")),
    "equal_infinity_and_number": lambda t: t.assertEqual(float("inf"), 1e308),
    # Values that cannot be compared are an error, not a failure.
    "equal_dtensor_and_number": lambda t: t.assertEqual(one_rank_dtensor(2.0), 2.0),
    "equal_dtensor_and_tensor": lambda t: t.assertEqual(one_rank_dtensor([1.0]),
                                                        torch.tensor([1.0])),
    "equal_tensor_and_string": lambda t: t.assertEqual(torch.tensor(1.0), "1"),
    "not_equal_within_atol": lambda t: t.assertNotEqual(
        torch.tensor(1.0), torch.tensor(1.05), atol=0.1, rtol=0),
    "not_equal_outside_atol": lambda t: t.assertNotEqual(
        torch.tensor(1.0), torch.tensor(1.05), atol=0.01, rtol=0),
    "equal_broadcasting_number": lambda t: t.assertEqualBroadcasting(torch.full((2, 2), 3.0), 3),
    "equal_broadcasting_list": lambda t: t.assertEqualBroadcasting(torch.ones(2, 2), [1.0, 1.0]),
    "equal_broadcasting_differs": lambda t: t.assertEqualBroadcasting(torch.ones(2), 2),
    "equal_type_string": lambda t: t.assertEqualTypeString(torch.ones(1), torch.zeros(3)),
    "equal_type_string_dtype": lambda t: t.assertEqualTypeString(
        torch.ones(1), torch.ones(1, dtype=I64)),
    "object_in": lambda t: t.assertObjectIn(CASES, [1, CASES]),
    "object_in_equal_but_other": lambda t: t.assertObjectIn([1], [[1]]),
    "not_warn_quiet": lambda t: t.assertNotWarn(lambda: None),
    "not_warn_warns": lambda t: t.assertNotWarn(lambda: warn("loud")),
    "warns_once_match": lambda t: warns_once(t, UserWarning, "hello", "hello world"),
    "warns_once_not_at_start": lambda t: warns_once(t, UserWarning, "world", "hello world"),
    "warns_once_other_category": lambda t: warns_once(t, DeprecationWarning, "hello",
                                                      "hello world"),
    "warns_once_no_warning": lambda t: warns_once(t, UserWarning, "hello"),
    "no_unraisable_quiet": lambda t: t.assertNoUnraisable(lambda: None),
    "no_unraisable_raised": lambda t: t.assertNoUnraisable(make_unraisable),
    "expected_inline_equal": lambda t: t.assertExpectedInline("a\nb", """a\nb"""),
    "expected_inline_differs": lambda t: t.assertExpectedInline("a\nc", """a\nb"""),
    "expected_inline_not_a_string": lambda t: t.assertExpectedInline(12, """12"""),
    "expected_inline_ignore_comments": lambda t: t.assertExpectedInline(
        "a\n# note\nb", """a\nb""", ignore_comments=True),
    "expected_inline_ignore_empty_lines": lambda t: t.assertExpectedInline(
        "a\n\nb", """a\nb""", ignore_empty_lines=True),
    "expected_inline_ansi": lambda t: t.assertExpectedInline("\x1b[31mred\x1b[0m", """red"""),
    "expected_inline_cpp_stack": lambda t: t.assertExpectedInline(
        "boom\nException raised from f at x.cpp:1", """boom"""),
    "expected_raises_inline": lambda t: t.assertExpectedRaisesInline(
        ValueError, lambda: raise_value_error("boom"), """boom"""),
    "expected_raises_inline_other_text": lambda t: t.assertExpectedRaisesInline(
        ValueError, lambda: raise_value_error("bang"), """boom"""),
    "expected_raises_inline_no_raise": lambda t: t.assertExpectedRaisesInline(
        ValueError, lambda: None, """boom"""),
    "multiline_cpp_stack": lambda t: t.assertMultiLineEqualMaybeCppStack(
        "x", "x\nException raised from f at y.cpp:2"),
    "leaks_no_cuda_tensors": leaks_nothing,
    "logs_default_torch_logger": logs_on_torch,
    "remove_comment_lines": lambda t: t.assertEqual(t.remove_comment_lines("a\n # b\nc"), "a\nc"),
    "remove_empty_lines": lambda t: t.assertEqual(t.remove_empty_lines("a\n \n\nc"), "a\nc"),
    "load_elsewhere_loads": lambda t: load_elsewhere(t, torch.ones(2), "import torch.nn;"),
    "load_elsewhere_fails": lambda t: load_elsewhere(t, NotLoadable(), ""),
    "load_elsewhere_fails_as_expected": lambda t: load_elsewhere(
        t, NotLoadable(), "", "Weights only load failed"),
    "load_elsewhere_fails_otherwise": lambda t: load_elsewhere(
        t, NotLoadable(), "", "no such message"),
    "load_elsewhere_loads_unexpectedly": lambda t: load_elsewhere(
        t, torch.ones(2), "", "Weights only load failed"),
    "process_no_exception_output": child_output,
}


def run_cases():
    results = {}
    for name, case in CASES.items():
        probe = Probe()
        try:
            case(probe)
            results[name] = "pass"
        except Exception as error:  # noqa: BLE001 - the type is the result
            kind = "AssertionError" if isinstance(error, AssertionError) else type(error).__name__
            results[name] = f"raises {kind}"
    return results


def public_methods():
    names = set()
    for klass in TestCase.__mro__:
        if klass.__module__.startswith(("unittest", "builtins")):
            continue
        names.update(n for n, v in vars(klass).items()
                     if not n.startswith("__") and callable(getattr(TestCase, n, None)))
    return sorted(names)


if __name__ == "__main__":
    payload = public_methods() if "methods" in sys.argv[1:] else run_cases()
    print("RESULT " + json.dumps(payload, sort_keys=True))
