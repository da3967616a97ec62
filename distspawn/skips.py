"""Skip codes and every skip / requires decorator upstream test files use.

A rank ends a skipped test by exiting with a ``TEST_SKIPS`` code, exactly as
upstream does, so code that reads exit codes keeps working. Inside a distspawn
rank the reason is also reported to the parent first, so the user sees the real
reason instead of a generic one. Outside a rank process (a plain single-process
test) the decorators raise ``unittest.SkipTest`` instead of killing the runner.
"""

from __future__ import annotations

import os
import sys
import unittest
from contextlib import contextmanager
from functools import wraps
from typing import Any, Callable, Iterator, NamedTuple, NoReturn, Sequence

import torch
import torch.distributed as c10d

from . import worker
from .environment import IS_SANDCASTLE, IS_WINDOWS, TEST_WITH_ROCM


class TestSkip(NamedTuple):
    """A reason a test was skipped and the exit code a rank uses to say so."""

    exit_code: int
    message: str


# (name, exit code, message): the codes and texts are upstream's contract.
_NAMED_SKIPS = (
    ("backend_unavailable", 72, "Skipped because distributed backend is not available."),
    ("small_worldsize", 73, "Skipped due to small world size."),
    ("odd_worldsize", 87, "Skipped due to odd world size."),
    ("no_cuda", 74, "CUDA is not available."),
    ("nccl", 76, "c10d not compiled with NCCL support"),
    ("skipIfRocm", 78, "Test skipped for ROCm"),
    ("no_peer_access", 79, "Test skipped because no GPU peer access"),
    ("generic", 86, "Test skipped at subprocess level, look at subprocess log for skip reason"),
    ("importerror", 88, "Test skipped due to missing import"),
    ("no_accelerator", 89, "accelerator is not available."),
)
# Exit codes for "needs N GPUs", N = 1..8 (76, 78 and 79 were already taken).
_GPU_COUNT_CODES = (75, 77, 80, 81, 82, 83, 84, 85)

TEST_SKIPS: dict[str, TestSkip] = {
    name: TestSkip(code, message) for name, code, message in _NAMED_SKIPS
}
TEST_SKIPS.update(
    (f"multi-gpu-{count}",
     TestSkip(code, f"Need at least {count} CUDA device{'s' if count > 1 else ''}"))
    for count, code in enumerate(_GPU_COUNT_CODES, start=1)
)

SKIP_MESSAGE_BY_EXIT_CODE: dict[int, str] = {s.exit_code: s.message for s in TEST_SKIPS.values()}


def gpu_count_skip(count: int) -> TestSkip:
    """The skip for "needs ``count`` GPUs"; counts above 8 reuse code 85 with the right text."""
    known = TEST_SKIPS.get(f"multi-gpu-{count}")
    if known is not None:
        return known
    return TestSkip(_GPU_COUNT_CODES[-1], f"Need at least {count} CUDA devices")


def skip_rank(test_skip: TestSkip, args: Sequence[Any] = ()) -> NoReturn | None:
    """End the running test as skipped, the way the current context expects.

    ``args`` are the decorated call's arguments: a test instance with a
    ``_handle_test_skip`` hook (as upstream's DTensor bases have) handles it.
    """
    if _maybe_handle_skip_if_lt_x_gpu(args, test_skip.message):
        return None
    if worker.in_rank_process():
        worker.report_skip(test_skip.message)
        sys.exit(test_skip.exit_code)
    raise unittest.SkipTest(test_skip.message)


def _maybe_handle_skip_if_lt_x_gpu(args: Sequence[Any], msg: str) -> bool:
    """Hand ``msg`` to the test instance's ``_handle_test_skip`` hook, if it has one."""
    handler = getattr(args[0], "_handle_test_skip", None) if args else None
    if handler is None:
        return False
    handler(msg)
    return True


def _world_size_from(args: Sequence[Any]) -> int:
    raw = os.environ.get("WORLD_SIZE")
    if raw is None and args and hasattr(args[0], "world_size"):
        raw = args[0].world_size
    if raw is None:
        raise RuntimeError(
            "this skip decorator needs the world size: set WORLD_SIZE (an integer >= 1) "
            "or use it on a test class with a world_size property"
        )
    try:
        return int(raw)
    except (TypeError, ValueError):
        raise ValueError(f"WORLD_SIZE={raw!r} is not an integer >= 1") from None


def _accelerator_count() -> int:
    if torch.cuda.is_available():
        return torch.cuda.device_count()
    for name in ("hpu", "xpu"):
        module = getattr(torch, name, None)
        if module is not None and module.is_available():
            return module.device_count()
    return 0


def at_least_x_gpu(x: int) -> bool:
    """True when at least ``x`` accelerator devices (CUDA, HPU or XPU) are visible."""
    return _accelerator_count() >= x


def requires_ddp_rank(device: str) -> bool:
    """True for device types where DDP places one rank per device."""
    return device in ("cuda", "xpu")


def skip_if_no_gpu(func: Callable) -> Callable:
    """Skip unless there is an accelerator and at least one per rank (WORLD_SIZE)."""

    @wraps(func)
    def wrapper(*args, **kwargs):
        available = _accelerator_count()
        if available == 0:
            return skip_rank(TEST_SKIPS["no_cuda"], args)
        world_size = _world_size_from(args)
        if available < world_size:
            return skip_rank(gpu_count_skip(world_size), args)
        return func(*args, **kwargs)

    return wrapper


def skip_if_small_worldsize(func: Callable) -> Callable:
    """Skip when WORLD_SIZE < 8, except on MPI (upstream's current threshold)."""

    @wraps(func)
    def wrapper(*args, **kwargs):
        if os.environ.get("BACKEND") != "mpi" and _world_size_from(args) < 8:
            return skip_rank(TEST_SKIPS["small_worldsize"], args)
        return func(*args, **kwargs)

    return wrapper


def skip_if_odd_worldsize(func: Callable) -> Callable:
    """Skip when WORLD_SIZE is odd, except on MPI."""

    @wraps(func)
    def wrapper(*args, **kwargs):
        if os.environ.get("BACKEND") != "mpi" and _world_size_from(args) % 2 == 1:
            return skip_rank(TEST_SKIPS["odd_worldsize"], args)
        return func(*args, **kwargs)

    return wrapper


def require_n_gpus_for_nccl_backend(n: int, backend: str) -> Callable:
    """Skip when ``backend`` is nccl and fewer than ``n`` CUDA devices exist."""

    def decorator(func):
        @wraps(func)
        def wrapper(*args, **kwargs):
            if backend == "nccl" and torch.cuda.device_count() < n:
                return skip_rank(gpu_count_skip(n), args)
            return func(*args, **kwargs)

        return wrapper

    return decorator


def import_transformers_or_skip() -> Callable:
    """Skip when ``transformers`` cannot be imported."""

    def decorator(func):
        @wraps(func)
        def wrapper(*args, **kwargs):
            try:
                import transformers  # noqa: F401
            except ImportError:
                return skip_rank(TEST_SKIPS["importerror"], args)
            return func(*args, **kwargs)

        return wrapper

    return decorator


def skip_if_lt_x_gpu(x: int, *, allow_cpu: bool = False) -> Callable:
    """Skip when fewer than ``x`` accelerators are visible.

    ``allow_cpu=True`` runs the test anyway on a machine with no accelerator.
    """

    def decorator(func):
        @wraps(func)
        def wrapper(*args, **kwargs):
            available = _accelerator_count()
            if available >= x or (allow_cpu and available == 0):
                return func(*args, **kwargs)
            return skip_rank(gpu_count_skip(x), args)

        return wrapper

    return decorator


def nccl_skip_if_lt_x_gpu(backend: str, x: int) -> Callable:
    """Like :func:`skip_if_lt_x_gpu`, but only for nccl, so other backends never touch CUDA."""

    def decorator(func):
        @wraps(func)
        def wrapper(*args, **kwargs):
            if backend != "nccl":
                return func(*args, **kwargs)
            if torch.cuda.is_available() and torch.cuda.device_count() >= x:
                return func(*args, **kwargs)
            return skip_rank(gpu_count_skip(x), args)

        return wrapper

    return decorator


def requires_world_size(n: int) -> Callable:
    """Mark a test as needing ``n`` ranks (and ``n`` GPUs, as upstream requires)."""

    def decorator(func):
        func._required_world_size = n
        available = torch.cuda.device_count()
        return unittest.skipUnless(available >= n, f"requires {n} GPUs, found {available}")(func)

    return decorator


def get_required_world_size(obj: Any, default: int) -> int:
    """The world size a test asked for with :func:`requires_world_size`, else ``default``."""
    name_of = getattr(obj, "_current_test_name", None)
    test_name = name_of() if callable(name_of) else getattr(obj, "_testMethodName", None)
    method = getattr(obj, test_name, None) if test_name else None
    required = getattr(method, "_required_world_size", None)
    if required is None:
        # join_or_run wraps the method; the mark sits on the original.
        required = getattr(getattr(method, "__wrapped__", None), "_required_world_size", None)
    return default if required is None else int(required)


@contextmanager
def environ_overrides(changes: dict[str, str | None]) -> Iterator[None]:
    """Set (or with ``None`` unset) variables for a block, then restore each exactly."""
    saved = {name: os.environ.get(name) for name in changes}

    def apply(values):
        for name, value in values.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

    apply(changes)
    try:
        yield
    finally:
        apply(saved)


def with_nccl_blocking_wait(func: Callable) -> Callable:
    """Run with TORCH_NCCL_BLOCKING_WAIT=1 and TORCH_NCCL_ASYNC_ERROR_HANDLING unset.

    Both variables are restored afterwards exactly as they were (unset stays unset).
    """

    @wraps(func)
    def wrapper(*args, **kwargs):
        overrides = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": None, "TORCH_NCCL_BLOCKING_WAIT": "1"}
        with environ_overrides(overrides):
            return func(*args, **kwargs)

    return wrapper


def with_dist_debug_levels(levels: Sequence[str]) -> Callable:
    """Run the test once per TORCH_DISTRIBUTED_DEBUG level, with a barrier after each."""

    def decorator(func):
        @wraps(func)
        def wrapper(*args, **kwargs):
            result = None
            try:
                for level in levels:
                    with environ_overrides({"TORCH_DISTRIBUTED_DEBUG": level}):
                        c10d.set_debug_level_from_env()
                        result = func(*args, **kwargs)
                        c10d.barrier()
            finally:
                c10d.set_debug_level_from_env()
            return result

        return wrapper

    return decorator


def skip_but_pass_in_sandcastle(reason: str) -> Callable:
    """``unittest.skip``, except under Sandcastle where the test passes with a note."""

    def decorator(func):
        if not IS_SANDCASTLE:
            func.__unittest_skip__ = True
            func.__unittest_skip_why__ = reason
            return func

        @wraps(func)
        def wrapper(*args, **kwargs):
            print(f"Skipping {func.__name__} on sandcastle for following reason: {reason}",
                  file=sys.stderr)

        return wrapper

    return decorator


def skip_but_pass_in_sandcastle_if(condition: bool, reason: str) -> Callable:
    """``unittest.skipIf``, except under Sandcastle where the test passes with a note."""

    def decorator(func):
        if not condition:
            return func
        return skip_but_pass_in_sandcastle(reason)(func)

    return decorator


def requires_gloo() -> Callable:
    return skip_but_pass_in_sandcastle_if(
        not c10d.is_gloo_available(), "c10d was not compiled with the Gloo backend")


def requires_nccl() -> Callable:
    return skip_but_pass_in_sandcastle_if(
        not c10d.is_nccl_available(), "c10d was not compiled with the NCCL backend")


def requires_ucc() -> Callable:
    return skip_but_pass_in_sandcastle_if(
        not c10d.is_ucc_available(), "c10d was not compiled with the UCC backend")


def requires_xccl() -> Callable:
    # is_xccl_available is newer than the oldest torch we support.
    available = getattr(c10d, "is_xccl_available", lambda: False)()
    return skip_but_pass_in_sandcastle_if(
        not available, "c10d was not compiled with the XCCL backend")


def requires_mpi() -> Callable:
    return skip_but_pass_in_sandcastle_if(
        not c10d.is_mpi_available(), "c10d was not compiled with the MPI backend")


def requires_nccl_version(version: tuple[int, ...], msg: str) -> Callable:
    """Skip unless NCCL is at least ``version``; a no-op without CUDA, as upstream."""
    if not torch.cuda.is_available():
        return lambda func: func
    if not c10d.is_nccl_available():
        return skip_but_pass_in_sandcastle("c10d was not compiled with the NCCL backend")
    found = torch.cuda.nccl.version()
    return skip_but_pass_in_sandcastle_if(
        found < version,
        f"Requires NCCL version greater than or equal to: {version}, found: {found}, reason: {msg}",
    )


def requires_nccl_shrink() -> Callable:
    return requires_nccl_version((2, 27), "Need NCCL 2.27+ for shrink_group")


def requires_accelerator_dist_backend(backends: Sequence[str] | None = None) -> Callable:
    """Skip unless one of ``backends`` (default nccl, xccl, hccl) is available."""
    backends = list(backends) if backends is not None else ["nccl", "xccl", "hccl"]
    probes = {
        "nccl": c10d.is_nccl_available,
        "xccl": getattr(c10d, "is_xccl_available", lambda: False),
        "hccl": lambda: hasattr(torch, "hpu") and torch.hpu.is_available(),
    }
    available = any(probes.get(name, lambda: False)() for name in backends)
    return skip_but_pass_in_sandcastle_if(
        not available, f"No accelerator communication backend available among {backends}")


def skip_if_rocm(func: Callable) -> Callable:
    """Skip a test on ROCm builds (exit-code style, for rank processes)."""
    func.skip_if_rocm = True

    @wraps(func)
    def wrapper(*args, **kwargs):
        if not TEST_WITH_ROCM:
            return func(*args, **kwargs)
        return skip_rank(TEST_SKIPS["skipIfRocm"], args)

    return wrapper


def skip_if_rocm_multiprocess(func: Callable) -> Callable:
    """Skip a multi-process test on ROCm builds."""
    return unittest.skipIf(TEST_WITH_ROCM, TEST_SKIPS["skipIfRocm"].message)(func)


def skip_if_rocm_arch_multiprocess(arch: tuple[str, ...]) -> Callable:
    """Skip on the given ROCm GPU architectures."""

    def decorator(func):
        reason = None
        if TEST_WITH_ROCM:
            found = torch.cuda.get_device_properties(0).gcnArchName.split(":")[0]
            if found in arch:
                reason = f"skip_if_rocm_arch_multiprocess: test skipped on {arch}"
        return unittest.skipIf(reason is not None, reason)(func)

    return decorator


def _rocm_version() -> tuple[int, ...]:
    # torch.version.hip reads like "6.2.41133-dd7f95766": drop the git part.
    return tuple(int(part) for part in str(torch.version.hip).split("-", 1)[0].split("."))


def skip_if_rocm_ver_lessthan_multiprocess(version: Sequence[int] | None = None) -> Callable:
    """Skip on ROCm builds older than ``version``."""

    def decorator(func):
        reason = None
        if TEST_WITH_ROCM:
            found = _rocm_version()
            if version is None or found < tuple(version):
                reason = (f"skip_if_rocm_ver_lessthan_multiprocess: ROCm {found} "
                          f"is available but {version} required")
        return unittest.skipIf(reason is not None, reason)(func)

    return decorator


def skip_if_rocm_ver_atleast_multiprocess(version: Sequence[int] | None = None) -> Callable:
    """Skip on ROCm builds at ``version`` or newer (known failures there)."""

    def decorator(func):
        reason = None
        if TEST_WITH_ROCM and version is not None:
            found = _rocm_version()
            if found >= tuple(version):
                reason = (f"skip_if_rocm_ver_atleast_multiprocess: known failure on "
                          f"ROCm {found} (>= {tuple(version)})")
        return unittest.skipIf(reason is not None, reason)(func)

    return decorator


def skip_if_win32() -> Callable:
    return skip_but_pass_in_sandcastle_if(
        IS_WINDOWS, "This unit test case is not supported on Windows platform")


def sm_is_or_higher_than(device: torch.device, major: int, minor: int) -> bool:
    """True if a CUDA device's compute capability is at least ``(major, minor)``.

    Non-CUDA devices count as new enough; ROCm devices never do.
    """
    if device.type != "cuda":
        return True
    if torch.version.hip is not None:
        return False
    return torch.cuda.get_device_capability(device) >= (major, minor)
