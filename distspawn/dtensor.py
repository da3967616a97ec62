"""Upstream's DTensor test module (``common_dtensor``, under
``torch/testing/_internal/distributed/_tensor/`` in the torch wheel).

    from distspawn.dtensor import DTensorTestBase, with_comms, MLPModule

The bases run on distspawn's engine (fast fresh rank processes, honest
verdicts); on a machine without enough GPUs, tests run on CPU with gloo.
"""

from __future__ import annotations

from .cases.dtensor import (
    DEVICE_COUNT,
    DEVICE_TYPE,
    NUM_DEVICES,
    PG_BACKEND,
    DTensorContinuousTestBase,
    DTensorOpTestBase,
    DTensorTestBase,
    DTensorTestMixin,
    TestFunc,
    skip_unless_torch_gpu,
    with_comms,
)
from .cases.local_dtensor import (
    LocalDTensorContinuousTestBase,
    LocalDTensorOpTestBase,
    LocalDTensorTestBase,
    create_local_tensor_test_class,
    make_wrapped,
    map_local_for_rank,
    map_local_tensor_for_rank,
    reduce_local_int,
)
from .fixtures.dtensor_converter import DTensorConverter
# What upstream's module imports from the rest of the harness, so that test
# files import from it too (pytorch's import skip_if_lt_x_gpu from there).
from .cases.continuous import MultiProcContinuousTest
from .cases.multiprocess import MultiProcessTestCase
from .cases.threaded import MultiThreadedTestCase
from .fake_pg import FakeStore
from .fixtures.accelerators import ACCELERATOR_DIST_BACKENDS
from .fixtures.environment import DEVICE_FLAGS, TEST_WITH_ROCM, device_flag
from .fixtures.helpers import run_subtests
from .fixtures.skips import TEST_SKIPS, skip_if_lt_x_gpu
from .fixtures.dtensor_plans import ExpertParallel, ExpertParallelWithTP, TensorParallelForExpert
from .fixtures.dtensor_models import (
    Attention,
    ExpertLayer,
    Experts,
    FeedForward,
    MLPModule,
    MLPStacked,
    ModelArgs,
    RMSNormPython,
    Transformer,
    TransformerBlock,
)

__all__ = [
    "DEVICE_COUNT", "DEVICE_TYPE", "NUM_DEVICES", "PG_BACKEND", "Attention",
    "DTensorContinuousTestBase", "DTensorConverter", "ExpertLayer", "ExpertParallel",
    "ExpertParallelWithTP", "Experts", "LocalDTensorContinuousTestBase", "LocalDTensorOpTestBase", "LocalDTensorTestBase",
    "TensorParallelForExpert", "create_local_tensor_test_class", "make_wrapped",
    "map_local_for_rank", "map_local_tensor_for_rank", "reduce_local_int", "DTensorOpTestBase", "DTensorTestBase", "DTensorTestMixin",
    "FeedForward", "MLPModule", "MLPStacked", "ModelArgs", "RMSNormPython", "TestFunc",
    "Transformer", "TransformerBlock", "skip_unless_torch_gpu", "with_comms",
    # from the rest of the harness, as upstream's module has them
    "ACCELERATOR_DIST_BACKENDS", "FakeStore", "MultiProcContinuousTest", "MultiProcessTestCase",
    "MultiThreadedTestCase", "TEST_SKIPS", "TEST_WITH_ROCM", "run_subtests", "skip_if_lt_x_gpu",
    *DEVICE_FLAGS,
]


def __getattr__(name: str):
    return device_flag(__name__, name)  # probed on first use
