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
]
