"""The sharded-tensor base gives upstream's verdicts, on distspawn's engine."""

import pytest

from harness import needs_gpus, scenario_verdicts, upstream_module_imports

EXPECTED = {
    "ShardedTensors.test_a_chunked_tensor_holds_its_rows_on_each_rank": "pass",
    "ShardedTensors.test_nccl_needs_gpus": ("skip: " + needs_gpus(4)),
    "ShardedTensors.test_rank_2_fails": "fail",
}


def test_sharded_tensor_file_gets_the_expected_verdicts():
    found, run = scenario_verdicts("sharded_tensor_suite")
    assert found == EXPECTED, run.output
    assert run.leftover_files == [] and run.leftover_pids == []


@pytest.mark.skipif(not upstream_module_imports(
    "torch.testing._internal.distributed._shard.sharded_tensor"),
    reason="upstream's sharded-tensor base does not import here")
def test_upstream_gives_the_same_verdicts():
    found, run = scenario_verdicts("sharded_tensor_suite", {"UPSTREAM_HARNESS": "1"})
    # upstream reports a failing rank as an error of the test process
    assert {t: {"error": "fail"}.get(v, v) for t, v in found.items()} == EXPECTED, run.output
