"""Upstream's FSDP test module (``common_fsdp``, under ``torch/testing/_internal/``
in the torch wheel): the FSDP2 parts.

    from distspawn.fsdp import FSDPTest, MLP, check_sharded_parity

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
    "DEVICE_COUNT", "DEVICE_TYPE", "DISTRIBUTED_BACKEND", "DEVICEInitMode", "DoubleLinear",
    "FSDPInitMode", "FSDPTest", "FSDPTestContinuous", "FSDPTestMixin", "FSDPTestMultiThread",
    "MLP", "MLPStack", "check_sharded_parity", "compiled_fsdp_test", "get_devtype", "patch_all_gather", "patch_all_reduce",
    "patch_foreach_all_gather", "patch_foreach_reduce", "patch_post_backward",
    "patch_reduce_scatter", "patch_register_post_backward_hook_backward", "patch_reshard",
    "patch_unshard", "reduce_scatter_with_assert",
]
