"""Upstream's FSDP test module (``common_fsdp``, under ``torch/testing/_internal/``
in the torch wheel): the bases, the FSDP2 models and patches, and the FSDP1
model family with its DDP parity check.

    from distspawn.fsdp import FSDPTest, MLP, check_sharded_parity
    from distspawn.fsdp import FSDPInitMode, DEVICEInitMode, NestedWrappedModule

Without an accelerator, ``FSDPTest`` runs its ranks on CPU with gloo instead
of skipping every test.
"""

from __future__ import annotations

from .cases.fsdp import (
    DEVICE_COUNT,
    DEVICE_TYPE,
    DISTRIBUTED_BACKEND,
    FSDPTest,
    FSDPTestMixin,
    FSDPTestContinuous,
    FSDPTestMultiThread,
    compiled_fsdp_test,
    get_devtype,
    patch_all_gather,
    patch_all_reduce,
    patch_foreach_all_gather,
    patch_foreach_reduce,
    patch_post_backward,
    patch_reduce_scatter,
    patch_register_post_backward_hook_backward,
    patch_reshard,
    patch_unshard,
)
# What upstream's module imports from the rest of the harness, so that test
# files import from it too.
from .cases.continuous import MultiProcContinuousTest
from .cases.multiprocess import MultiProcessTestCase
from .cases.testcase import set_rng_seed
from .cases.threaded import MultiThreadedTestCase
from .fixtures.environment import DEVICE_FLAGS, FILE_SCHEMA, TEST_WITH_ROCM, device_flag
from .fixtures.helpers import run_subtests
from .fixtures.skips import TEST_SKIPS
from .fixtures.fsdp1_models import (
    AlwaysWrapNestedWrappedModule,
    DummyDDP,
    FSDPTestModel,
    MixtureOfExperts,
    ModuleWithDelay,
    NestedLinear,
    NestedWrappedModule,
    NestedWrappedModuleWithDelay,
    NonUniformReqGradNWM,
    SkipModel,
    SkipModule,
    TransformerWithSharedParams,
)
from .fixtures.fsdp1_state import (
    DummyProcessGroup,
    _assert_module_states,
    _broadcast_state_dict,
    _get_state_dict,
    _maybe_wrap_fsdp,
    _move_to_device,
    _zero_model,
    get_full_params,
    subtest_name,
)
from .fixtures.fsdp_models import (
    MLP,
    DEVICEInitMode,
    DoubleLinear,
    FSDPInitMode,
    MLPStack,
    check_sharded_parity,
    reduce_scatter_with_assert,
)

__all__ = [
    "AlwaysWrapNestedWrappedModule", "DEVICE_COUNT", "DEVICE_TYPE", "DEVICEInitMode",
    "DISTRIBUTED_BACKEND", "DoubleLinear", "DummyDDP", "DummyProcessGroup", "FSDPInitMode",
    "FSDPTest", "FSDPTestContinuous", "FSDPTestMixin", "FSDPTestModel", "FSDPTestMultiThread",
    "MLP", "MLPStack", "MixtureOfExperts", "ModuleWithDelay", "NestedLinear",
    "NestedWrappedModule", "NestedWrappedModuleWithDelay", "NonUniformReqGradNWM", "SkipModel",
    "SkipModule", "TransformerWithSharedParams", "check_sharded_parity", "compiled_fsdp_test",
    "get_devtype", "get_full_params", "patch_all_gather", "patch_all_reduce",
    "patch_foreach_all_gather", "patch_foreach_reduce", "patch_post_backward",
    "patch_reduce_scatter", "patch_register_post_backward_hook_backward", "patch_reshard",
    "patch_unshard", "reduce_scatter_with_assert", "subtest_name",
    # underscored, as upstream names them; test files import them
    "_assert_module_states", "_broadcast_state_dict", "_get_state_dict", "_maybe_wrap_fsdp",
    "_move_to_device", "_zero_model",
    # from the rest of the harness, as upstream's module has them
    "FILE_SCHEMA", "MultiProcContinuousTest", "MultiProcessTestCase", "MultiThreadedTestCase",
    "TEST_SKIPS", "TEST_WITH_ROCM", "run_subtests", "set_rng_seed", *DEVICE_FLAGS,
]


def __getattr__(name: str):
    return device_flag(__name__, name)  # probed on first use
