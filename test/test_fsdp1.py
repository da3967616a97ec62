"""distspawn.fsdp's FSDP1 family: upstream's test models and its DDP parity check.

Two checks against upstream's ``common_fsdp`` where it imports:
- each model, built the same way, has upstream's parameter and buffer names,
  shapes and values, takes the same input and gives the same output and loss;
- scenarios/fsdp1_suite.py gives the same verdicts with upstream's models and
  parity helpers as with distspawn's, on the same ranks.
Without a GPU, FSDP1 runs on CPU here (distspawn's fixtures pass FSDP the CPU
as its device); a test that needs an accelerator skips and says what it
reached for, where upstream's FSDPTest skips every test.
"""


import pytest
import torch

from harness import (
    needs_gpus,
    run_python,
    scenario_verdicts,
    upstream_lacks,
    upstream_module_imports,
)

NO_GPU = not torch.cuda.is_available()
ACCELERATOR_SKIP = ("skip: " + needs_gpus(2) + " (the test needs an accelerator, and "
                   "this machine has none: ")
EXPECTED = {
    # torch's words differ by build (and, on a CUDA build, by what the
    # process the rank was forked from asked CUDA).
    "ModelHelpers.test_a_cuda_call_needs_an_accelerator": ACCELERATOR_SKIP,
    "ModelHelpers.test_an_nccl_group_needs_an_accelerator": ACCELERATOR_SKIP,
    "ModelHelpers.test_broadcast_state_dict": "pass",
    "ModelHelpers.test_expert_weights_differ_across_ranks": "pass",
    "ModelHelpers.test_fsdp_without_device_id_needs_an_accelerator":
        ACCELERATOR_SKIP + "FSDP needs a non-CPU accelerator device, but no accelerator "
                           "device is detected.)",
    "ModelHelpers.test_full_params_and_zeroing": "pass",
    "ModelHelpers.test_module_states_agree_across_ranks": "pass",
    "ModelHelpers.test_rank_1_fails_in_a_parity_check": "fail",
    # Pinned memory for offloaded shards: torch's words differ by build.
    "ParityOnReusedRanks.test_cpu_offload": ACCELERATOR_SKIP,
    "ParityOnReusedRanks.test_nested_wrapped": "pass",
    "ParityWithDDP.test_a_wrong_reference_is_caught": "fail",
    "ParityWithDDP.test_always_wrap": "pass",
    "ParityWithDDP.test_cpu_offload": ACCELERATOR_SKIP,
    "ParityWithDDP.test_mixture_of_experts": "pass",
    "ParityWithDDP.test_nested_wrapped_over_configs": "pass",
    "ParityWithDDP.test_nonuniform_requires_grad_with_grad_scaler": "pass",
    "ParityWithDDP.test_transformer_with_shared_params": "pass",
    "ParityWithDDP.test_with_delays": "pass",
}


def upstream_fsdp_imports() -> bool:
    return upstream_module_imports("torch.testing._internal.common_fsdp")


UPSTREAM = upstream_fsdp_imports()


def verdicts(env=None):
    found, run = scenario_verdicts("fsdp1_suite", env)
    for test, verdict in found.items():  # where EXPECTED gives only the start
        if EXPECTED.get(test) == ACCELERATOR_SKIP and verdict.startswith(ACCELERATOR_SKIP):
            found[test] = ACCELERATOR_SKIP
    return found, run


@pytest.mark.skipif(not NO_GPU, reason="checks the CPU fallback")
def test_fsdp1_parity_runs_on_cpu_and_matches_upstreams_fixtures():
    ours, run = verdicts()
    assert ours == EXPECTED, run.output[-3000:]
    assert run.leftover_files == [] and run.leftover_pids == []
    # torch 2.8's common_fsdp has the fixtures on FSDPTest, with no FSDPTestMixin.
    if UPSTREAM and not upstream_lacks("torch.testing._internal.common_fsdp", ("FSDPTestMixin",)):
        theirs, _ = verdicts({"UPSTREAM_FIXTURES": "1"})
        assert theirs == ours


@pytest.mark.skipif(not NO_GPU, reason="checks the CPU fallback")
def test_a_wrong_reference_is_reported_with_the_losses():
    run = run_python(["-m", "unittest", "fsdp1_suite.ParityWithDDP.test_a_wrong_reference_is_caught"])
    report = run.report("test_a_wrong_reference_is_caught")
    assert "2 of 2 ranks failed" in report
    assert "Scalars are not close!" in report


def build(module, name, **kwargs):
    from distspawn.fsdp import DummyProcessGroup

    model_class = getattr(module, name)
    init_kwargs = {"deterministic": True, **kwargs}
    return model_class.init(DummyProcessGroup(rank=1, size=2), module.FSDPInitMode.NO_FSDP,
                            module.DEVICEInitMode.DEVICE_BEFORE, **init_kwargs)


MODELS = ["TransformerWithSharedParams", "NestedWrappedModule", "AlwaysWrapNestedWrappedModule",
          "NonUniformReqGradNWM", "MixtureOfExperts", "NestedWrappedModuleWithDelay"]


@pytest.mark.skipif(not UPSTREAM, reason="needs upstream's common_fsdp")
# nn.Transformer (batch-second, as upstream's fixture builds it) warns that it
# cannot use nested tensors; both fixtures build it the same way.
@pytest.mark.filterwarnings("ignore:enable_nested_tensor is True")
@pytest.mark.parametrize("name", MODELS)
def test_models_match_upstreams(name):
    import torch.testing._internal.common_fsdp as upstream

    import distspawn.fsdp as ours

    theirs_model, ours_model = build(upstream, name), build(ours, name)
    theirs_state = dict(theirs_model.named_parameters())
    ours_state = dict(ours_model.named_parameters())
    assert list(ours_state) == list(theirs_state)
    for key, value in theirs_state.items():
        assert torch.equal(ours_state[key], value), key
        assert ours_state[key].requires_grad == value.requires_grad, key
        assert getattr(ours_state[key], "expert", False) == getattr(value, "expert", False), key
    assert [n for n, _ in ours_model.named_buffers()] == \
        [n for n, _ in theirs_model.named_buffers()]
    assert ours_model.training == theirs_model.training
    # DEVICE_BEFORE put both on the accelerator where there is one.
    device = next(theirs_model.parameters()).device
    inputs = ours_model.get_input(device)
    for mine, upstream_input in zip(inputs, theirs_model.get_input(device)):
        assert torch.equal(mine, upstream_input)
    ours_out, theirs_out = ours_model(*inputs), theirs_model(*inputs)
    assert torch.equal(ours_out, theirs_out)
    assert torch.equal(ours_model.get_loss(inputs, ours_out),
                       theirs_model.get_loss(inputs, theirs_out))


def test_bad_init_mode_is_refused_by_name():
    import distspawn.fsdp as ours

    with pytest.raises(ValueError, match="Unsupported FSDP init mode: nonsense"):
        ours.NestedWrappedModule.init(ours.DummyProcessGroup(0, 1), "nonsense",
                                      ours.DEVICEInitMode.DEVICE_BEFORE)


def test_dummy_process_group_answers_like_a_group():
    from distspawn.fsdp import DummyProcessGroup

    group = DummyProcessGroup(rank=3, size=4)
    assert (group.rank(), group.size()) == (3, 4)
    work = group.allreduce(torch.ones(1))
    assert work.get_future().wait() == 1
    work.wait()  # any other call on the work succeeds, as on upstream's


def test_subtest_name():
    from distspawn.fsdp import subtest_name

    assert subtest_name({"True": "on", "False": "off"}, True, None, False) == "on_none_off"
