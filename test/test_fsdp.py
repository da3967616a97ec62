"""distspawn.fsdp: upstream's FSDP2 test bases and helpers, running on CPU too.

scenarios/fsdp_suite.py is written the way FSDP2 test files are. Upstream's
FSDPTest skips every test on a machine without a GPU ("Need at least 1 CUDA
device"); distspawn runs them on CPU with gloo, and only the test that asks
for GPUs skips.
"""


import pytest
import torch

from harness import (
    gloo_reduce_scatter_always_sums,
    needs_gpus,
    run_python,
    scenario_verdicts,
    skip_unless_upstream_runs,
    upstream_module_imports,
)

EXPECTED = {
    "CompiledOrNot.test_eager_run_always_happens": "pass",
    "FullyShardOnReusedRanks.test_fully_shard_matches_replicated_training_on_reused_ranks":
        "pass",
    "FullyShardOnRanks.test_fully_shard_matches_replicated_training": "pass",
    "FullyShardOnRanks.test_needs_two_gpus": ("skip: " + needs_gpus(2)),
    "FullyShardOnRanks.test_rank_1_fails": "fail",
    "FullyShardOnRanks.test_reduce_scatter_sees_the_unsharded_gradient": "pass",
    "FullyShardOnThreads.test_world_on_threads": "pass",
}
NO_GPU = not torch.cuda.is_available()


def verdicts(env=None):
    return scenario_verdicts("fsdp_suite", env)


@pytest.mark.skipif(not NO_GPU, reason="checks the CPU fallback")
def test_fsdp_tests_run_on_cpu_with_gloo():
    found, run = verdicts()
    expected = dict(EXPECTED)
    if gloo_reduce_scatter_always_sums():
        # torch 2.8: FSDP2 reduce-scatters gradients with ReduceOp.AVG, and
        # that release's gloo sums whatever the op: the sharded model trains on
        # gradients twice the replicated one's, and a parity test fails, as it
        # would on any harness that ran it.
        for test, verdict in EXPECTED.items():
            if "matches_replicated_training" in test:
                expected[test] = "fail"
        assert "Scalars are not close" in run.output, run.output
    assert found == expected
    assert run.leftover_files == [] and run.leftover_pids == []


def upstream_fsdp_imports() -> bool:
    return upstream_module_imports("torch.testing._internal.common_fsdp")


@pytest.mark.skipif(not (NO_GPU and upstream_fsdp_imports()),
                    reason="needs upstream's common_fsdp and no GPU")
def test_upstream_skips_what_distspawn_runs():
    skip_unless_upstream_runs("fsdp_suite.py")  # FSDPTestContinuous is newer than torch 2.8
    found, _ = verdicts({"UPSTREAM_HARNESS": "1"})
    assert found["FullyShardOnThreads.test_world_on_threads"] == "pass"
    ranks = {t: v for t, v in found.items() if t.startswith(
        ("FullyShardOnRanks.", "FullyShardOnReusedRanks.", "CompiledOrNot."))}
    assert set(ranks.values()) == {"skip: " + needs_gpus(1)}


@pytest.mark.skipif(not NO_GPU, reason="checks the CPU fallback")
def test_a_failing_rank_is_named_first():
    run = run_python(["-m", "unittest", "-v", "fsdp_suite.FullyShardOnRanks.test_rank_1_fails"])
    report = run.report("test_rank_1_fails")
    rank_lines = [line for line in report.splitlines() if line.startswith("rank ")]
    assert rank_lines[0] == "rank 1: raised an exception", report
    assert "rank 1 saw a wrong shard" in report


def test_public_names():
    import distspawn.fsdp as ours

    for name in ("FSDPTest", "FSDPTestContinuous", "compiled_fsdp_test", "FSDPTestMultiThread",
                 "FSDPInitMode", "DEVICEInitMode", "MLP", "MLPStack", "DoubleLinear",
                 "patch_all_gather", "patch_reduce_scatter", "reduce_scatter_with_assert",
                 "check_sharded_parity", "get_devtype", "FSDPTestModel",
                 "TransformerWithSharedParams", "NestedWrappedModule", "MixtureOfExperts"):
        assert hasattr(ours, name), name


@pytest.mark.skipif(not upstream_fsdp_imports(), reason="needs upstream's common_fsdp")
def test_every_name_upstreams_module_defines_is_here():
    import inspect

    import torch.testing._internal.common_fsdp as upstream

    import distspawn.fsdp as ours

    defined = [name for name, value in vars(upstream).items()
               if not name.startswith("__") and getattr(value, "__module__", None) == upstream.__name__]
    assert len(defined) > 30  # a sanity check: 2.8 defines 39, 2.13 more
    assert [name for name in defined if not hasattr(ours, name)] == []
    for name in defined:
        theirs = getattr(upstream, name)
        if inspect.isfunction(theirs):
            assert list(inspect.signature(getattr(ours, name)).parameters) == \
                list(inspect.signature(theirs).parameters), name
