"""distspawn: PyTorch's distributed test harness as a real library.

Import here what upstream test files import from PyTorch's private
``common_distributed`` module::

    from distspawn import MultiProcessTestCase, run_tests, skip_if_lt_x_gpu

The package is lazy (PEP 562): ``import distspawn`` imports neither torch nor
any of its subpackages; a name is imported from its home module the first
time it is asked for. That lets the pytest plugin and the rank server's first
preload (``distspawn.early``) live inside the package and still run on the
standard library alone.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from typing import Any

# The one place the version is set (setup.cfg reads it; CHANGELOG.rst says what changed).
__version__ = "0.2.0"

# Every public name, by the module it lives in (relative to this package).
_HOMES: dict[str, tuple[str, ...]] = {
    "fixtures.environment": (
        "DEFAULT_WORLD_SIZE", "FILE_SCHEMA", "IS_MACOS", "IS_SANDCASTLE", "IS_WINDOWS",
        "NO_MULTIPROCESSING_SPAWN", "SEED", "TEST_ERROR_EXIT_CODE", "TEST_WITH_ASAN",
        "TEST_WITH_ROCM", "TEST_WITH_TSAN", "TIMEOUT_DEFAULT", "TIMEOUT_OVERRIDE",
        "get_timeout"
    ),
    "fixtures.accelerators": (
        "ACCELERATOR_DIST_BACKENDS", "DDP_RANK_DEVICES", "HAS_ACCELERATOR",
        "PLATFORM_SUPPORTS_SYMM_MEM", "TORCHCOMM_HAS_GLOO", "TORCHCOMM_HAS_NCCL",
        "TORCHCOMM_HAS_NCCLX", "TORCHCOMM_HAS_RCCL", "TORCHCOMM_HAS_RCCLX",
        "TORCHCOMM_HAS_XCCL", "LazyFlag", "evaluate_platform_supports_symm_mem",
        "requires_multicast_support", "setup_torchcomms_pg"
    ),
    "fixtures.barrier": (
        "Barrier",
    ),
    "cases.dist_backend": (
        "CUSTOM_PG_TIMEOUT", "MASTER_ADDR", "DistEnv", "DistEnvError", "DistTestCases",
        "TestDistBackend", "default_pg_timeout", "read_dist_env",
        "require_backend_feature", "require_backend_is_available",
        "require_exact_world_size", "require_world_size"
    ),
    "cases.continuous": (
        "C10dTorchCommsTestBase", "MultiProcContinousTest", "MultiProcContinuousTest"
    ),
    "cases.distributed_base": (
        "DistributedTestBase", "DynamoDistributedMultiProcTestCase",
        "DynamoDistributedSingleProcTestCase"
    ),
    "fixtures.helpers": (
        "CUDA_PROFILING_SUPPORTED_BACKENDS", "PROFILING_SUPPORTED_BACKENDS",
        "SEND_RECV_PROFILING_SUPPORTED_BACKENDS", "captured_output",
        "get_profiler_nccl_meta", "get_profiling_event", "has_efa",
        "init_multigpu_helper", "retrieve_result_from_completion_queue", "run_subtests",
        "simple_sparse_reduce_tests", "tp_transports", "verify_ddp_error_logged"
    ),
    "fixtures.models": (
        "SaveForwardInputsModel", "SaveForwardInputsModule"
    ),
    "cases.multiprocess": (
        "MultiProcessTestCase",
    ),
    "engine.verdict": (
        "RankFailure",
    ),
    "fixtures.optional": (
        "HAS_TORCHVISION", "skipIfNoTorchVision"
    ),
    "fixtures.stores": (
        "ADDRESS_IN_USE", "CONNECT_TIMEOUT", "create_device", "create_tcp_store",
        "find_free_port", "retry_on_connect_failures"
    ),
    "fixtures.tempdirs": (
        "cleanup_temp_dir", "initialize_temp_directories", "rank_temp_file"
    ),
    "fixtures.skips": (
        "TEST_SKIPS", "TestSkip", "at_least_x_gpu", "get_required_world_size",
        "import_transformers_or_skip", "nccl_skip_if_lt_x_gpu",
        "require_n_gpus_for_nccl_backend", "requires_accelerator_dist_backend",
        "requires_ddp_rank", "requires_gloo", "requires_mpi", "requires_nccl",
        "requires_nccl_shrink", "requires_nccl_version", "requires_ucc",
        "requires_xccl", "requires_world_size", "skip_but_pass_in_sandcastle",
        "skip_but_pass_in_sandcastle_if", "skip_if_lt_x_gpu", "skip_if_no_gpu",
        "skip_if_odd_worldsize", "skip_if_rocm", "skip_if_rocm_arch_multiprocess",
        "skip_if_rocm_multiprocess", "skip_if_rocm_ver_atleast_multiprocess",
        "skip_if_rocm_ver_lessthan_multiprocess", "skip_if_small_worldsize",
        "skip_if_win32", "sm_is_or_higher_than", "with_dist_debug_levels",
        "with_nccl_blocking_wait"
    ),
    "cases.testcase": (
        "TestCase", "run_tests", "set_rng_seed"
    ),
    "cases.threaded": (
        "MultiThreadedTestCase", "spawn_threads_and_init_comms"
    ),
    "backends.threaded_pg": (
        "threaded_world",
    ),
}

__all__ = [name for names in _HOMES.values() for name in names]
_HOME_OF = {name: home for home, names in _HOMES.items() for name in names}

# Modules that lived at the top of the package before it took its folders keep
# answering to their old names (``import distspawn.models``, ``from distspawn
# import tempdirs``): the same module objects, not copies.
_FORMER_NAMES = {
    "accelerators": "fixtures", "barrier": "fixtures", "device_probe": "fixtures",
    "environment": "fixtures", "helpers": "fixtures", "models": "fixtures",
    "optional": "fixtures", "skips": "fixtures", "stores": "fixtures", "tempdirs": "fixtures",
    "continuous": "cases", "dist_backend": "cases", "distributed_base": "cases",
    "multiprocess": "cases", "testcase": "cases", "threaded": "cases",
    "thread_rng": "backends", "threaded_ops": "backends", "threaded_pg": "backends",
    "capacity": "engine", "launch": "engine", "protocol": "engine", "supervisor": "engine",
    "verdict": "engine", "worker": "engine",
    "matrix": "integrations", "pytest_plugin": "integrations", "world_sizes": "integrations",
}


def __getattr__(name: str) -> Any:
    home = _HOME_OF.get(name)
    if home is not None:
        value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
        globals()[name] = value  # asked once: later lookups are plain attribute reads
        return value
    if name in _FORMER_NAMES:
        return importlib.import_module(f"{__name__}.{_FORMER_NAMES[name]}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def _import_everything() -> None:
    """Import every home module, as an eager package would (the rank server's
    preload does, so that ranks find all of it imported)."""
    for home in _HOMES:
        importlib.import_module(f"{__name__}.{home}")


class _FormerNameFinder:
    """``import distspawn.models`` and the like: the module at its new home,
    the same object, with its own ``__spec__`` kept."""

    @staticmethod
    def find_spec(fullname: str, path: Any = None, target: Any = None) -> Any:
        prefix, _, old = fullname.partition(".")
        if prefix != __name__ or old not in _FORMER_NAMES:
            return None
        return importlib.util.spec_from_loader(fullname, _FormerNameFinder())

    @staticmethod
    def create_module(spec: Any) -> Any:
        old = spec.name.partition(".")[2]
        module = importlib.import_module(f"{__name__}.{_FORMER_NAMES[old]}.{old}")
        spec.loader_state = module.__spec__  # importlib sets the alias's spec on it next
        return module

    @staticmethod
    def exec_module(module: Any) -> None:
        module.__spec__ = module.__spec__.loader_state  # already executed: its own spec back


if not any(isinstance(finder, _FormerNameFinder) for finder in sys.meta_path):
    sys.meta_path.append(_FormerNameFinder())


_stand_in_checked = False


def _stand_in_if_requested() -> None:
    """``DISTSPAWN_STAND_IN=1``: put distspawn's names into upstream's harness
    modules before any test module is imported, in every process that uses
    distspawn (the test process, the rank server, a spawned rank).

    Called by each subpackage that needs torch, as it is first imported (not
    by ``import distspawn``, which must stay light for ``distspawn.early``);
    once per process.
    """
    global _stand_in_checked
    if _stand_in_checked:
        return
    _stand_in_checked = True
    if os.environ.get("DISTSPAWN_STAND_IN"):
        from .integrations import stand_in

        stand_in.install_if_requested("import distspawn")
