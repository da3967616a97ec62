"""Platform and run-time flags, timeouts and world-size defaults.

Everything here is read from the environment once, at import, without touching
CUDA or any global torch state; values that would need a device probe are
computed on first access instead (see ``__getattr__``).
"""

from __future__ import annotations

import os
import sys

import torch

__all__ = [
    "IS_WINDOWS",
    "IS_MACOS",
    "IS_LINUX",
    "IS_SANDCASTLE",
    "TEST_WITH_ROCM",
    "TEST_WITH_TSAN",
    "TEST_WITH_ASAN",
    "NO_MULTIPROCESSING_SPAWN",
    "FILE_SCHEMA",
    "SEED",
    "TEST_ERROR_EXIT_CODE",
    "DEFAULT_WORLD_SIZE",
    "TIMEOUT_DEFAULT",
    "TIMEOUT_OVERRIDE",
    "get_timeout",
    "env_flag",
]


def env_flag(name: str) -> bool:
    """True when environment variable ``name`` is exactly ``"1"`` (upstream's rule)."""
    return os.environ.get(name) == "1"


IS_WINDOWS: bool = sys.platform == "win32"
IS_MACOS: bool = sys.platform == "darwin"
IS_LINUX: bool = sys.platform.startswith("linux")

IS_SANDCASTLE: bool = env_flag("SANDCASTLE") or os.environ.get("TW_JOB_USER") == "sandcastle"
TEST_WITH_ROCM: bool = env_flag("PYTORCH_TEST_WITH_ROCM") or torch.version.hip is not None
TEST_WITH_TSAN: bool = env_flag("PYTORCH_TEST_WITH_TSAN")
TEST_WITH_ASAN: bool = env_flag("PYTORCH_TEST_WITH_ASAN")
# Kept for upstream compatibility: every supported platform can spawn.
NO_MULTIPROCESSING_SPAWN: bool = False

FILE_SCHEMA: str = "file:///" if IS_WINDOWS else "file://"

# Seed given to torch, random and numpy before every test (upstream's value).
SEED: int = 1234

# Exit code of a rank whose test raised; skips use the TEST_SKIPS codes.
TEST_ERROR_EXIT_CODE: int = 10


def _default_timeout() -> int:
    if TEST_WITH_TSAN:
        return 500  # sanitised builds run several times slower
    raw = os.environ.get("DISTRIBUTED_TESTS_DEFAULT_TIMEOUT", "300")
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(
            f"DISTRIBUTED_TESTS_DEFAULT_TIMEOUT={raw!r} is not an integer number of "
            "seconds; set it to a positive integer such as 300, or unset it"
        ) from None
    if value <= 0:
        raise ValueError(
            f"DISTRIBUTED_TESTS_DEFAULT_TIMEOUT={raw!r} must be a positive number of seconds"
        )
    return value


TIMEOUT_DEFAULT: int = _default_timeout()

# Per-test deadlines, keyed by the bare test method name.
TIMEOUT_OVERRIDE: dict[str, int] = {
    "test_ddp_uneven_inputs": 400,
    "test_DistributedDataParallel": 500,
}
if TEST_WITH_ROCM:
    TIMEOUT_OVERRIDE["test_join_kwargs"] = 200


def get_timeout(test_id: str) -> int:
    """Deadline in seconds for a test id such as ``"mod.Cls.test_x"``.

    >>> get_timeout("pkg.TestX.test_ddp_uneven_inputs")
    400
    """
    return TIMEOUT_OVERRIDE.get(test_id.split(".")[-1], TIMEOUT_DEFAULT)


def _default_world_size() -> int:
    if TEST_WITH_ROCM:
        return min(4, max(2, torch.cuda.device_count()))
    return 4


DEFAULT_WORLD_SIZE: int = _default_world_size()


def restore_environ(saved: dict[str, str | None]) -> None:
    """Put variables back as ``saved`` recorded them (None: it was unset)."""
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def __getattr__(name: str):
    # Device probes stay lazy: touching CUDA at import would make every later
    # fork of this process unsafe.
    if name == "TEST_CUDA":
        return torch.cuda.is_available()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
