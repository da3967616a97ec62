"""FSDP1 parity tests in the shapes pytorch's and downstream FSDP1 files use them
(``_test_fsdp_parity`` over the model family, with subtests over configs).

Runs on distspawn's FSDPTest, which runs on CPU with gloo. UPSTREAM_FIXTURES=1
takes the models and the parity helpers from upstream's ``common_fsdp``
instead (upstream's own FSDPTest would skip every test here without a GPU),
so the two sets of fixtures can be compared on the same ranks.
"""

import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.fsdp import BackwardPrefetch, CPUOffload, ShardingStrategy
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

from distspawn import run_tests
from distspawn.fsdp import FSDPTest, FSDPTestContinuous

if os.environ.get("UPSTREAM_FIXTURES") == "1":
    from torch.testing._internal import common_fsdp as fixtures

    class FSDPOnTheCPU(FSDP):
        # Upstream's fixtures build FSDP without device_id, which FSDP1 refuses
        # on a machine without an accelerator; distspawn's pass the CPU there.
        def __init__(self, *args, **kwargs):
            if kwargs.get("device_id") is None:
                kwargs["device_id"] = torch.device("cpu")
            super().__init__(*args, **kwargs)

    if not torch.accelerator.is_available():
        fixtures.FSDP = FSDPOnTheCPU
else:
    from distspawn import fsdp as fixtures

DEVICEInitMode = fixtures.DEVICEInitMode
FSDPInitMode = fixtures.FSDPInitMode


class FixtureBase(FSDPTest):
    _train_for_several_steps = fixtures.FSDPTestMixin._train_for_several_steps
    _test_fsdp_parity = fixtures.FSDPTestMixin._test_fsdp_parity


class ParityWithDDP(FixtureBase):
    def test_nested_wrapped_over_configs(self):
        self.run_subtests(
            {"backward_prefetch": [None, BackwardPrefetch.BACKWARD_PRE],
             "sharding_strategy": [ShardingStrategy.FULL_SHARD,
                                   ShardingStrategy.SHARD_GRAD_OP]},
            self._test_fsdp_parity, fixtures.NestedWrappedModule, FSDPInitMode.RECURSIVE,
            DEVICEInitMode.DEVICE_BEFORE)

    def test_cpu_offload(self):
        # Offloaded shards live in pinned memory, which needs an accelerator.
        self._test_fsdp_parity(fixtures.NestedWrappedModule, FSDPInitMode.RECURSIVE,
                               DEVICEInitMode.DEVICE_BEFORE,
                               cpu_offload=CPUOffload(offload_params=True))

    def test_transformer_with_shared_params(self):
        self._test_fsdp_parity(fixtures.TransformerWithSharedParams, FSDPInitMode.RECURSIVE,
                               DEVICEInitMode.DEVICE_BEFORE, use_orig_params=True)

    def test_always_wrap(self):
        self._test_fsdp_parity(fixtures.AlwaysWrapNestedWrappedModule, FSDPInitMode.RECURSIVE,
                               DEVICEInitMode.DEVICE_BEFORE)

    def test_mixture_of_experts(self):
        self._test_fsdp_parity(fixtures.MixtureOfExperts, FSDPInitMode.RECURSIVE,
                               DEVICEInitMode.DEVICE_BEFORE,
                               ref_init_fn=fixtures.DummyDDP)

    def test_nonuniform_requires_grad_with_grad_scaler(self):
        self._test_fsdp_parity(fixtures.NonUniformReqGradNWM, FSDPInitMode.RECURSIVE,
                               DEVICEInitMode.DEVICE_BEFORE, use_orig_params=True,
                               enable_sharded_grad_scaler=True,
                               sharded_grad_scaler_kwargs={"init_scale": 2.0})

    def test_with_delays(self):
        self._test_fsdp_parity(fixtures.NestedWrappedModuleWithDelay, FSDPInitMode.RECURSIVE,
                               DEVICEInitMode.DEVICE_BEFORE,
                               init_kwargs={"delay_after_loss_ms": 1,
                                            "delay_before_reduction_ms": 1})

    def test_a_wrong_reference_is_caught(self):
        # A reference that scales every gradient differs from FSDP after a step.
        def scaled_ddp(model):
            for param in model.parameters():
                param.register_hook(lambda grad: grad * 3)
            return torch.nn.parallel.DistributedDataParallel(model)

        self._test_fsdp_parity(fixtures.NestedWrappedModule, FSDPInitMode.RECURSIVE,
                               DEVICEInitMode.DEVICE_BEFORE, ref_init_fn=scaled_ddp)


class ParityOnReusedRanks(FSDPTestContinuous):
    _train_for_several_steps = fixtures.FSDPTestMixin._train_for_several_steps
    _test_fsdp_parity = fixtures.FSDPTestMixin._test_fsdp_parity

    def test_nested_wrapped(self):
        self._test_fsdp_parity(fixtures.NestedWrappedModule, FSDPInitMode.RECURSIVE,
                               DEVICEInitMode.DEVICE_BEFORE)

    def test_cpu_offload(self):
        self._test_fsdp_parity(fixtures.NestedWrappedModule, FSDPInitMode.RECURSIVE,
                               DEVICEInitMode.DEVICE_BEFORE,
                               cpu_offload=CPUOffload(offload_params=True))


class ModelHelpers(FixtureBase):
    def test_module_states_agree_across_ranks(self):
        model = fixtures.NestedWrappedModule.init(
            self.process_group, FSDPInitMode.NO_FSDP, DEVICEInitMode.DEVICE_BEFORE,
            deterministic=True)
        fixtures._assert_module_states(model, self.process_group, self.assertEqual)

    def test_expert_weights_differ_across_ranks(self):
        model = fixtures.MixtureOfExperts.init(
            self.process_group, FSDPInitMode.NO_FSDP, DEVICEInitMode.DEVICE_BEFORE,
            deterministic=True)
        with self.assertRaises(AssertionError):
            fixtures._assert_module_states(model, self.process_group, self.assertEqual)

    def test_full_params_and_zeroing(self):
        model = FSDP(fixtures.NestedWrappedModule.init(
            self.process_group, FSDPInitMode.RECURSIVE, DEVICEInitMode.DEVICE_BEFORE,
            deterministic=True), device_id=fixtures.get_devtype())
        full = fixtures.get_full_params(model)
        self.assertEqual(sum(p.numel() for p in full), 8 * 4 + 4 + 4 * 16 + 16 + 16 * 16 + 16
                         + 16 * 4 + 4 + 4 * 8 + 8)
        fixtures._zero_model(model)
        self.assertTrue(all(p.count_nonzero() == 0 for p in fixtures.get_full_params(model)))

    def test_broadcast_state_dict(self):
        state = {"w": torch.full((2,), float(self.rank))}
        got = fixtures._broadcast_state_dict(self.rank, state)
        self.assertEqual(got["w"], torch.zeros(2))

    def test_fsdp_without_device_id_needs_an_accelerator(self):
        # FSDP1 refuses to start without an accelerator unless given device_id:
        # on a CPU-only machine this test skips, saying so, as upstream's would.
        model = FSDP(torch.nn.Linear(4, 4))
        model(torch.ones(2, 4)).sum().backward()

    def test_a_cuda_call_needs_an_accelerator(self):
        # On a CUDA build without a driver, asking torch for the GPU count in
        # the process ranks are forked from (distspawn's probe does, as
        # upstream's common_utils does) makes torch refuse CUDA in the ranks
        # in other words ("Cannot re-initialize CUDA in forked subprocess"):
        # it still skips, as upstream's would.
        torch.nn.Linear(4, 4).cuda()

    def test_an_nccl_group_needs_an_accelerator(self):
        # A CPU build has no nccl; 2.15's CUDA build refuses an nccl group
        # without a GPU. Either way it skips.
        group = dist.new_group(backend="nccl")
        dist.all_reduce(torch.ones(1), group=group)

    def test_rank_1_fails_in_a_parity_check(self):
        if self.rank == 1:
            dist.barrier()
            raise AssertionError("rank 1's FSDP parameters drifted")
        dist.barrier()


if __name__ == "__main__":
    sys.exit(run_tests())
