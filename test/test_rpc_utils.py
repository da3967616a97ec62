"""RPC classes made by distspawn's generate_tests run on distspawn's ranks, with
upstream's verdicts; bad arguments are one clear error at import."""

import json
import re

import pytest

from harness import needs_gpus, run_python, scenario_verdicts, upstream_module_imports

EXPECTED = {
    "FaultyFaultySuiteSample.test_no_faulty_messages": "pass",
    "FaultyFaultySuiteSample.test_verify_backend_options": "pass",
    "TensorPipeSmallRpcSuite.test_needs_four_gpus_by_upstreams_decorator":
        "skip: " + needs_gpus(4),
    "TensorPipeSmallRpcSuite.test_needs_two_gpus": "skip: " + needs_gpus(2),
    "TensorPipeSmallRpcSuite.test_rank_1_fails": "fail",
    "TensorPipeSmallRpcSuite.test_rpc_sync_reaches_the_next_rank": "pass",
}
UPSTREAM_RPC_UTILS = "torch.testing._internal.distributed.rpc_utils"
needs_upstreams_rpc_suites = pytest.mark.skipif(
    not upstream_module_imports(UPSTREAM_RPC_UTILS),
    reason="upstream's RPC suites do not import here")


def upstream_words(verdicts):
    # upstream reports a failing rank as an error of the test process
    return {test: {"error": "fail"}.get(v, v) for test, v in verdicts.items()}


@needs_upstreams_rpc_suites
def test_generated_rpc_classes_get_the_expected_verdicts_on_distspawns_ranks():
    found, run = scenario_verdicts("rpc_generated")
    assert found == EXPECTED, run.output
    # distspawn's report names the rank that failed: the classes ran on its engine
    assert "1 of 4 ranks failed (rank 1)" in run.output, run.output
    assert run.leftover_files == [] and run.leftover_pids == []


@needs_upstreams_rpc_suites
def test_upstream_and_the_stand_in_mode_give_the_same_verdicts():
    upstream, run = scenario_verdicts("rpc_generated", {"UPSTREAM_HARNESS": "1"})
    assert upstream_words(upstream) == EXPECTED, run.output
    stand_in = run_python(["-m", "distspawn.stand_in", "verdicts_json.py", "rpc_generated"],
                          env={"UPSTREAM_HARNESS": "1"})
    assert "1 of 4 ranks failed (rank 1)" in stand_in.output, stand_in.output
    last = stand_in.output.splitlines()[-1]
    assert last.startswith("VERDICTS ") and json.loads(last[9:]) == EXPECTED, stand_in.output
    assert stand_in.leftover_files == [] and stand_in.leftover_pids == []


@pytest.mark.parametrize("arguments, words", [
    ("None, Fixture, [Suite], __name__", "prefix=None must be a str"),
    ("'X', 'TensorPipe', [Suite], __name__", "mixin='TensorPipe' must be a class"),
    ("'X', Fixture, Suite, __name__", "must be a list of test suite classes"),
    ("'X', Fixture, ['RpcTest'], __name__", "tests=['RpcTest'] must be a list"),
    ("'X', Fixture, [Suite], None", "module_name=None must be the calling module's name"),
])
def test_bad_arguments_are_one_error_naming_the_argument(arguments, words):
    from distspawn.rpc_utils import generate_tests

    class Fixture:
        pass

    class Suite:
        pass

    with pytest.raises(TypeError, match=re.escape(words)) as raised:
        eval(f"generate_tests({arguments})", {"generate_tests": generate_tests,
                                             "Fixture": Fixture, "Suite": Suite,
                                             "__name__": "caller"})
    assert str(raised.value).startswith("generate_tests: ")


def test_each_class_is_the_suite_on_the_fixture_on_distspawns_ranks():
    from distspawn import MultiProcessTestCase
    from distspawn.rpc_utils import SpawnHelper, generate_tests

    class Fixture:
        pass

    class RpcSuite:
        def test_a(self):
            pass

    made = generate_tests("Agent", Fixture, [RpcSuite], "callers_module")
    assert list(made) == ["AgentRpcSuite"]
    cls = made["AgentRpcSuite"]
    assert cls.__mro__[1:4] == (RpcSuite, Fixture, SpawnHelper)
    assert issubclass(cls, MultiProcessTestCase) and cls.__module__ == "callers_module"


PROBE = """
import unittest
from distspawn.rpc_utils import generate_tests

class Fixture:
    pass

class Suite:
    def test_a(self):
        raise AssertionError("no rank may start under dev-asan")

made = generate_tests("Agent", Fixture, [Suite], "__main__")
print("MADE", sorted(made))
globals().update(made)
unittest.main(argv=["probe", "-v"], exit=False)
"""


@pytest.mark.parametrize("sandcastle", [False, True])
def test_under_dev_asan_no_rank_starts_as_on_upstream(sandcastle):
    env = {"PYTORCH_TEST_WITH_DEV_DBG_ASAN": "1", **({"SANDCASTLE": "1"} if sandcastle else {})}
    run = run_python(["-c", PROBE], env=env, timeout=120)
    if sandcastle:  # upstream makes no class there, and says so
        assert "MADE []" in run.output, run.output
        assert "no AgentSuite on sandcastle under dev-asan" in run.output, run.output
    else:  # the class is made, and its tests skip with upstream's reason
        assert "MADE ['AgentSuite']" in run.output, run.output
        assert ("skipped 'Skip ASAN as torch + multiprocessing spawn have known issues'"
                in run.output), run.output
    assert run.leftover_files == [] and run.leftover_pids == []
