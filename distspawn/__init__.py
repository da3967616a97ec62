"""distspawn: PyTorch's distributed test harness as a real library.

Import here what upstream test files import from PyTorch's private
``common_distributed`` module::

    from distspawn import MultiProcessTestCase, run_tests, skip_if_lt_x_gpu
"""

from .environment import (
    DEFAULT_WORLD_SIZE,
    FILE_SCHEMA,
    IS_MACOS,
    IS_SANDCASTLE,
    IS_WINDOWS,
    NO_MULTIPROCESSING_SPAWN,
    SEED,
    TEST_ERROR_EXIT_CODE,
    TEST_WITH_ASAN,
    TEST_WITH_ROCM,
    TEST_WITH_TSAN,
    TIMEOUT_DEFAULT,
    TIMEOUT_OVERRIDE,
    get_timeout,
)
from .multiprocess import MultiProcessTestCase
from .skips import (
    TEST_SKIPS,
    TestSkip,
    at_least_x_gpu,
    get_required_world_size,
    import_transformers_or_skip,
    nccl_skip_if_lt_x_gpu,
    require_n_gpus_for_nccl_backend,
    requires_accelerator_dist_backend,
    requires_ddp_rank,
    requires_gloo,
    requires_mpi,
    requires_nccl,
    requires_nccl_shrink,
    requires_nccl_version,
    requires_ucc,
    requires_world_size,
    skip_but_pass_in_sandcastle,
    skip_but_pass_in_sandcastle_if,
    skip_if_lt_x_gpu,
    skip_if_no_gpu,
    skip_if_odd_worldsize,
    skip_if_rocm,
    skip_if_rocm_arch_multiprocess,
    skip_if_rocm_multiprocess,
    skip_if_rocm_ver_lessthan_multiprocess,
    skip_if_small_worldsize,
    skip_if_win32,
    sm_is_or_higher_than,
    with_dist_debug_levels,
    with_nccl_blocking_wait,
)
from .testcase import TestCase, run_tests, set_rng_seed

__version__ = "0.1.0"

import types as _types

__all__ = [
    _name for _name, _value in list(globals().items())
    if not _name.startswith("_") and not isinstance(_value, _types.ModuleType)
]
