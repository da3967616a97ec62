"""distspawn.dtensor: upstream's DTensor bases and fixtures, on distspawn's engine.

scenarios/dtensor_suite.py is written the way DTensor test files are (torchtitan,
torch_npu, ...); it runs once on distspawn and, where upstream's common_dtensor
imports, once on upstream's harness: same verdicts.
"""


import importlib.util

import pytest

from distspawn.fixtures.device_probe import accelerator_device_count

from harness import (
    needs_gpus,
    run_python,
    scenario_verdicts,
    skip_unless_upstream_runs,
    upstream_module_imports,
)

EXPECTED = {
    "DTensorBasics.test_2d_mesh": "pass",
    "DTensorBasics.test_checkpoint_into_one_shared_dir": "pass",
    "DTensorBasics.test_mlp_tensor_parallel_matches_local": "pass",
    "DTensorBasics.test_needs_gpus": ("skip: " + needs_gpus(4)),
    "DTensorBasics.test_op_on_every_sharding": "pass",
    "DTensorBasics.test_rank_1_fails_inside_with_comms": "fail",
    "DTensorBasics.test_shard_and_redistribute_on_a_1d_mesh": "pass",
    "DTensorBasics.test_transformer_under_tensor_parallelism": "pass",
    "DTensorBasics.test_world_size_is_num_devices": "pass",
    "DTensorOnReusedRanks.test_rank_3_fails_on_reused_ranks": "fail",
    "DTensorOnReusedRanks.test_shard_on_reused_ranks": "pass",
    "DTensorOnReusedRanks.test_the_group_is_still_there": "pass",
    "DTensorOnThreads.test_shard_on_threads": "pass",
    "EveryRankInOneProcess.test_local_tensor_mode_holds_every_rank": "pass",
    "EveryRankInOneProcessOpBase.test_op_base_in_one_process": "pass",
    "EveryRankInOneProcessReused.test_one_group_for_the_class": "pass",
    "EveryRankInOneProcessReused.test_the_group_is_still_there": "pass",
    "ExpertLayers.test_transformer_with_experts_under_tp_ep_and_both": "pass",
    "RedistributeTwoWays.test_shard_to_replicate": "pass",
    "RedistributeTwoWaysWithLocalTensor.test_shard_to_replicate": "pass",
    "RedistributeTwoWays.test_rowwise_linear_matches_the_unsharded_one": "pass",
    "RedistributeTwoWaysWithLocalTensor.test_rowwise_linear_matches_the_unsharded_one": "pass",
    "DTensorReusedDefaultSize.test_mesh_spans_every_rank": "pass",
    "DTensorOnThreads.test_with_comms_passes_through": "pass",
    "OwnInitPG.test_called_with_parentheses": "pass",
    "OwnInitPG.test_override_chose_the_backend": "pass",
}


# torch 2.8 has no LocalTensorMode: the bases that hold every rank in one
# process skip, saying so (a capability of the release, not a failure).
LOCAL_TENSOR_SKIP = "skip: this torch has no torch.distributed._local_tensor (LocalTensorMode)"
IN_ONE_PROCESS = ("EveryRankInOneProcess", "WithLocalTensor.")


# Expert parallelism with TP needs DeviceMesh._concatenate (not in torch 2.8):
# the fixture says so and the test fails, as on any harness.
EXPERTS = "ExpertLayers.test_transformer_with_experts_under_tp_ep_and_both"
EXPERTS_NEED = "ExpertParallelWithTP needs DeviceMesh._concatenate, which this torch lacks"


def expected() -> dict:
    from torch.distributed.device_mesh import DeviceMesh

    found = dict(EXPECTED)
    if importlib.util.find_spec("torch.distributed._local_tensor") is None:
        found.update({test: LOCAL_TENSOR_SKIP for test in EXPECTED
                      if any(part in test for part in IN_ONE_PROCESS)})
    if not hasattr(DeviceMesh, "_concatenate"):
        found[EXPERTS] = "fail"
    # With an accelerator, reused ranks each take a device: a world of 4 on
    # fewer devices skips, as on upstream's harness.
    if 0 < accelerator_device_count() < 4:
        found.update({test: "skip: " + needs_gpus(4) for test in EXPECTED
                      if test.startswith("DTensorOnReusedRanks.")})
    return found


def verdicts(env=None):
    return scenario_verdicts("dtensor_suite", env)


def test_dtensor_file_gets_the_expected_verdicts():
    found, run = verdicts()
    assert found == expected()
    if found[EXPERTS] == "fail":
        assert EXPERTS_NEED in run.output, run.output
    assert run.leftover_files == [] and run.leftover_pids == []


def upstream_dtensor_imports() -> bool:
    return upstream_module_imports("torch.testing._internal.distributed._tensor.common_dtensor")


@pytest.mark.skipif(not upstream_dtensor_imports(), reason="upstream's common_dtensor "
                    "does not import here")
def test_upstream_gives_the_same_verdicts():
    skip_unless_upstream_runs("dtensor_suite.py")  # its bases are newer than torch 2.8
    found, _ = verdicts({"UPSTREAM_HARNESS": "1"})
    # Upstream's reused ranks skip the rest of a class after a failure (its
    # "poison pill"); distspawn's run them on fresh workers, by design.
    after_failure = {"DTensorOnReusedRanks.test_shard_on_reused_ranks",
                     "DTensorOnReusedRanks.test_the_group_is_still_there"}
    for test in after_failure:
        assert found.pop(test).startswith("skip: Previous test failed")
    assert {t: {"error": "fail"}.get(v, v) for t, v in found.items()} == {
        t: v for t, v in EXPECTED.items() if t not in after_failure}


def test_failing_rank_inside_with_comms_is_named_first_with_its_traceback():
    run = run_python(["-m", "unittest", "-v",
                      "dtensor_suite.DTensorBasics.test_rank_1_fails_inside_with_comms"])
    report = run.report("test_rank_1_fails_inside_with_comms")
    rank_lines = [line for line in report.splitlines() if line.startswith("rank ")]
    assert rank_lines[0] == "rank 1: raised an exception", report
    assert 'raise RuntimeError("rank 1 broke inside with_comms")' in report
    # Its peers lost their connection to it: listed after it, with the time since,
    # or, on a loaded machine, one not failed yet when distspawn ended it.
    for line in rank_lines[1:]:
        assert ("after rank 1" in line
                or line.endswith("still running when the failure was known; ended by distspawn")
                ), report


def test_public_names_match_upstreams():
    import distspawn.dtensor as ours

    for name in ("DTensorTestBase", "DTensorOpTestBase", "with_comms", "DTensorConverter",
                 "MLPModule", "MLPStacked", "ModelArgs", "Attention", "FeedForward",
                 "TransformerBlock", "Transformer", "RMSNormPython", "NUM_DEVICES",
                 "DEVICE_TYPE", "PG_BACKEND", "skip_unless_torch_gpu"):
        assert hasattr(ours, name), name
    if ours.DEVICE_COUNT == 0:  # no accelerator: upstream's CPU defaults
        assert (ours.NUM_DEVICES, ours.DEVICE_TYPE, ours.PG_BACKEND) == (4, "cpu", "gloo")
