"""distspawn.TestCase has the methods of upstream's common_utils.TestCase that
distributed test files call, with upstream's results.

scenarios/assertion_cases.py calls each assertion once, in a subprocess, on
distspawn's TestCase and (where torch.testing._internal imports) on upstream's.
"""

import functools
import json
import re
import textwrap
from pathlib import Path

import pytest

import distspawn
from harness import run_python, run_python_on_upstream, upstream_module_imports

# Upstream TestCase methods distspawn leaves out, and why. Each must really be
# missing (the list stays honest), and every other upstream method must exist.
LEFT_OUT = {
    "assertAtenOp": "checks ONNX export graphs; not a distributed concern",
    "assertExpected": "reads expect files from pytorch's own test/expect folder, named "
                      "after pytorch's test layout (JIT tests)",
    "assertExpectedRaises": "the expect-file form of assertExpected (JIT tests)",
    "assertExpectedStripMangled": "assertExpected for TorchScript's mangled names",
    "assertExpectedInlineMunged": "needs torch._dynamo's exception munging (dynamo tests)",
    "check_nondeterministic_alert": "single-op determinism alerts (op tests)",
    "compare_with_numpy": "OpInfo op-versus-numpy tests",
    "compare_with_reference": "OpInfo op-versus-reference tests",
    "compile_fn": "pytorch CI's PYTORCH_TEST_WITH_DYNAMO rerun of every test",
    "_dynamo_test_key": "pytorch CI's dynamo expected-failure lists",
    "_run_custom": "pytorch CI's dynamo/inductor rerun machinery inside run()",
    "genSparseTensor": "sparse tensor generators (sparse op tests)",
    "genSparseCompressedTensor": "sparse tensor generators (sparse op tests)",
    "genSparseCSRTensor": "sparse tensor generators (sparse op tests)",
    "genSparseCSCTensor": "sparse tensor generators (sparse op tests)",
    "genSparseBSRTensor": "sparse tensor generators (sparse op tests)",
    "genSparseBSCTensor": "sparse tensor generators (sparse op tests)",
    "generate_simple_inputs": "sparse layout input generator (sparse op tests)",
    "safeToDense": "sparse helper (sparse op tests)",
    "_make_crow_indices": "sparse helper (sparse op tests)",
    "runWithPytorchAPIUsageStderr": "pytorch's own API-usage logging tests",
    "wrap_with_cuda_policy": "pytorch CI's automatic CUDA leak/stream checks "
                             "(PYTORCH_TEST_CUDA_MEM_LEAK_CHECK); use assertLeaksNoCudaTensors",
    "wrap_with_policy": "see wrap_with_cuda_policy",
    "wrap_method_with_policy": "see wrap_with_cuda_policy",
    "wrap_with_cuda_memory_check": "see wrap_with_cuda_policy",
    "before_cuda_memory_leak_check": "see wrap_with_cuda_policy",
    "enforceNonDefaultStream": "see wrap_with_cuda_policy",
    "_remove_ansi_escape": "private; assertExpectedInline strips colours itself",
}

# Where distspawn deliberately answers differently, and why.
KNOWN_DIFFERENCES = {
    "leaks_no_cuda_tensors": "without CUDA nothing can leak: distspawn passes, upstream raises "
                             "'CUDA must be available when calling initialize_cuda_context_rng'",
}

# Cases whose answer is the installed release's (torch.testing's rules for
# them changed: 2.8 compares a DTensor with a number or a plain tensor, 2.13
# and 2.15 refuse, "ambiguous"): distspawn's answer must be upstream's here.
AS_THE_RELEASE_SAYS = ("equal_dtensor_and_number", "equal_dtensor_and_tensor")

EXPECTED = {
    "equal_atol_rtol_outside": "raises AssertionError",
    "equal_atol_rtol_within": "pass",
    "equal_broadcasting_differs": "raises AssertionError",
    "equal_broadcasting_list": "pass",
    "equal_broadcasting_number": "pass",
    "equal_dtypes_differ": "raises AssertionError",
    "equal_exact_device": "pass",
    "equal_exact_dtype_false": "pass",
    "equal_ignore_type": "pass",
    "equal_ignore_type_values_differ": "raises AssertionError",
    "equal_msg": "raises AssertionError",
    "equal_nested": "pass",
    "equal_number_and_tensor": "pass",
    "equal_infinities": "pass",
    "equal_infinity_and_tensor": "pass",
    "equal_opposite_infinities": "raises AssertionError",
    "equal_infinity_and_number": "raises AssertionError",
    "equal_tensor_and_string": "raises TypeError",
    "equal_only_atol": "raises ValueError",
    "equal_type_string": "pass",
    "equal_type_string_dtype": "raises AssertionError",
    "expected_inline_ansi": "pass",
    "expected_inline_cpp_stack": "pass",
    "expected_inline_differs": "raises AssertionError",
    "expected_inline_equal": "pass",
    "expected_inline_ignore_comments": "pass",
    "expected_inline_ignore_empty_lines": "pass",
    "expected_inline_not_a_string": "pass",
    "expected_raises_inline": "pass",
    "expected_raises_inline_no_raise": "raises AssertionError",
    "expected_raises_inline_other_text": "raises AssertionError",
    "greater_almost_equal_both_given": "raises TypeError",
    "greater_almost_equal_delta_ok": "pass",
    "greater_almost_equal_delta_short": "raises AssertionError",
    "greater_almost_equal_greater": "pass",
    "greater_almost_equal_places_1": "pass",
    "greater_almost_equal_short": "raises AssertionError",
    "greater_almost_equal_within_places": "pass",
    "leaks_no_cuda_tensors": "pass",
    "load_elsewhere_fails": "raises RuntimeError",
    "load_elsewhere_fails_as_expected": "pass",
    "load_elsewhere_fails_otherwise": "raises AssertionError",
    "load_elsewhere_loads": "pass",
    "load_elsewhere_loads_unexpectedly": "raises AssertionError",
    "logs_default_torch_logger": "pass",
    "multiline_cpp_stack": "pass",
    "no_unraisable_quiet": "pass",
    "no_unraisable_raised": "raises AssertionError",
    "not_equal_outside_atol": "pass",
    "not_equal_within_atol": "raises AssertionError",
    "not_warn_quiet": "pass",
    "not_warn_warns": "raises AssertionError",
    "object_in": "pass",
    "object_in_equal_but_other": "raises AssertionError",
    "process_no_exception_output": "pass",
    "remove_comment_lines": "pass",
    "remove_empty_lines": "pass",
    "warns_once_match": "pass",
    "warns_once_no_warning": "raises AssertionError",
    "warns_once_not_at_start": "raises AssertionError",
    "warns_once_other_category": "raises AssertionError",
}


def upstream_imports() -> bool:
    return upstream_module_imports("torch.testing._internal.common_utils")


needs_upstream = pytest.mark.skipif(
    not upstream_imports(), reason="torch.testing._internal does not import here")


def cases(*args: str):
    run = run_python(["assertion_cases.py", *args])
    line = [text for text in run.output.splitlines() if text.startswith("RESULT ")]
    assert line, run.output
    return json.loads(line[-1][len("RESULT "):])


def test_each_assertion_gives_upstreams_result():
    ours = cases()
    assert {name: ours.pop(name, None) for name in AS_THE_RELEASE_SAYS} == release_answers()
    assert ours == EXPECTED


def release_answers() -> dict[str, str]:
    answer = "raises TypeError" if release_refuses_dtensor_comparisons() else "pass"
    return {name: answer for name in AS_THE_RELEASE_SAYS}


@functools.cache
def release_refuses_dtensor_comparisons() -> bool:
    """Whether this release's torch.testing refuses a DTensor against a plain tensor."""
    run = run_python(["-c", (
        "import torch, torch.distributed as dist\n"
        "from assertion_cases import one_rank_dtensor\n"
        "try:\n"
        "    torch.testing.assert_close(one_rank_dtensor([1.0]), torch.tensor([1.0]))\n"
        "    print('COMPARES')\n"
        "except TypeError:\n"
        "    print('REFUSES')\n"
        "dist.destroy_process_group()\n")])
    assert "COMPARES" in run.output or "REFUSES" in run.output, run.output
    return "REFUSES" in run.output


@needs_upstream
def test_upstream_gives_the_same_results_where_no_difference_is_documented():
    upstream = cases("upstream")
    import torch

    known = set() if torch.cuda.is_available() else set(KNOWN_DIFFERENCES)
    differing = {name for name in EXPECTED if upstream.get(name) != EXPECTED[name]}
    assert differing == known, {name: upstream.get(name) for name in differing}
    assert {name: upstream.get(name) for name in AS_THE_RELEASE_SAYS} == release_answers()


@needs_upstream
def test_every_upstream_method_is_there_or_left_out_with_a_reason():
    upstream = set(cases("methods", "upstream"))
    missing = {name for name in upstream if not hasattr(distspawn.TestCase, name)}
    assert missing - set(LEFT_OUT) == set(), "add these to distspawn.TestCase or LEFT_OUT"
    # Judged against distspawn, not this release's upstream: a name a release lacks
    # stays listed for the releases that have it.
    assert {name for name in LEFT_OUT if hasattr(distspawn.TestCase, name)} == set(), \
        "LEFT_OUT names a method distspawn has"


def test_assertequal_keywords_match_upstreams():
    import inspect

    keywords = set(inspect.signature(distspawn.TestCase.assertEqual).parameters)
    assert {"msg", "atol", "rtol", "equal_nan", "exact_dtype", "exact_device",
            "exact_layout", "exact_stride", "exact_is_coalesced"} <= keywords


EXPECT_FILE = '''
    import unittest
    from distspawn import TestCase

    class Inline(TestCase):
        def test_inline(self):
            self.assertExpectedInline("new\\ntext", """old""")

    if __name__ == "__main__":
        unittest.main()
'''


def write_expect_file(tmp_path: Path) -> Path:
    path = tmp_path / "test_inline.py"
    path.write_text(textwrap.dedent(EXPECT_FILE))
    return path


def test_inline_expectation_fails_and_says_how_to_accept(tmp_path):
    path = write_expect_file(tmp_path)
    run = run_python([str(path)], cwd=tmp_path)
    assert run.returncode == 1
    assert "EXPECTTEST_ACCEPT=1" in run.output and "new" in run.output


def test_accept_without_expecttest_is_one_clear_error(tmp_path):
    path = write_expect_file(tmp_path)
    hide = "import sys; sys.modules['expecttest'] = None; import runpy; " \
           f"runpy.run_path({str(path)!r}, run_name='__main__')"
    run = run_python(["-c", hide], env={"EXPECTTEST_ACCEPT": "1"}, cwd=tmp_path)
    assert run.returncode == 1
    assert "expecttest package is not installed" in run.output
    assert '"""old"""' in path.read_text()  # nothing written


def test_accept_with_expecttest_rewrites_the_literal(tmp_path):
    pytest.importorskip("expecttest")
    path = write_expect_file(tmp_path)
    run = run_python([str(path)], env={"EXPECTTEST_ACCEPT": "1"}, cwd=tmp_path)
    assert run.returncode == 0, run.output
    assert '"""old"""' not in path.read_text() and "new" in path.read_text()
    again = run_python([str(path)], cwd=tmp_path)
    assert again.returncode == 0, again.output


@pytest.mark.parametrize("harness", ["distspawn", "upstream"])
def test_a_test_that_leaks_global_state_fails_as_on_this_releases_upstream(harness):
    # Upstream's TestCase guards more state in later releases (2.13: torch
    # function modes such as a leaked default device; 2.14: fp32 precision
    # flags); distspawn's checks what the installed release's does.
    from distspawn.engine.releases import upstream_testcase_guards

    if harness == "upstream" and not upstream_imports():
        pytest.skip("torch.testing._internal does not import here")
    runner = run_python_on_upstream if harness == "upstream" else run_python
    run = runner(["global_state_leaks.py", "-v"],
                 env={"UPSTREAM_HARNESS": "1" if harness == "upstream" else "0"})
    failed = set(re.findall(r"^(?:FAIL|ERROR): (test_\w+)", run.output, re.M))
    guards = upstream_testcase_guards()
    flags = "skipped" not in run.verdict_line("test_c_precision")
    expected = {"test_a_default_device" if "torch_function" in guards
                else "test_a_default_device_after"}
    if flags:
        expected.add("test_c_precision" if "fp32_precision" in guards
                     else "test_c_precision_after")
    assert failed == expected, run.output
    if "torch_function" in guards:
        assert ("torch function mode stack was leaked: length changed from 0 to 1"
                in run.output), run.output
    if flags and "fp32_precision" in guards:
        assert re.search(r"fp32 precision flag leak detected:\n(  .*\n)*"
                         r"  torch\.backends\.mkldnn\.matmul\.fp32_precision: was '\w+', "
                         r"became 'bf16'", run.output), run.output
