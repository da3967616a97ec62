"""Small helpers that distributed test bodies call: test data, sub-tests, profiling."""

from __future__ import annotations

import functools
import itertools
import json
import os
import queue
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import contextmanager
from io import StringIO
from multiprocessing.connection import wait
from typing import Any, Iterator

import torch
import torch.distributed as c10d

from .skips import gpu_count_skip, skip_rank

# Backends whose collectives show up in the profiler (and with use_cuda, and for p2p).
PROFILING_SUPPORTED_BACKENDS = [
    c10d.Backend.NCCL, c10d.Backend.GLOO, c10d.Backend.MPI, c10d.Backend.UCC]
CUDA_PROFILING_SUPPORTED_BACKENDS = [
    c10d.Backend.GLOO, c10d.Backend.MPI, c10d.Backend.NCCL, c10d.Backend.UCC]
SEND_RECV_PROFILING_SUPPORTED_BACKENDS = [
    c10d.Backend.MPI, c10d.Backend.GLOO, c10d.Backend.NCCL, c10d.Backend.UCC]


@contextmanager
def captured_output() -> Iterator[tuple[StringIO, StringIO]]:
    """Swap ``sys.stdout`` / ``sys.stderr`` for buffers; yields the two buffers."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = StringIO(), StringIO()
    try:
        yield sys.stdout, sys.stderr
    finally:
        sys.stdout, sys.stderr = saved


def _sparse_input(rank: int, world_size: int, sparse_dims: int = 1,
                  dense_dims: int = 0) -> torch.Tensor:
    # Rank r holds rows 0..r of the first sparse dimension and zeros in the
    # others, so every pair of ranks overlaps and sums are non-trivial.
    rows = torch.arange(rank + 1).reshape(1, rank + 1)
    extra = [torch.zeros(1, rank + 1, dtype=rows.dtype)] * (sparse_dims - 1)
    indices = torch.cat([rows, *extra]) if extra else rows
    shape = [world_size] + [world_size] * (sparse_dims - 1) + [2] * dense_dims
    values = torch.ones([rank + 1] + [2] * dense_dims)
    return torch.sparse_coo_tensor(indices, values, shape, check_invariants=True)


def simple_sparse_reduce_tests(rank: int, world_size: int,
                               num_inputs: int = 1) -> list[tuple[list, list]]:
    """(inputs, expected sums) pairs for sparse all_reduce, over six tensor layouts.

    Covers one to three sparse dimensions and one to three dense ones; the only
    reduction sparse tensors support is SUM.
    """
    layouts = [dict(sparse_dims=n) for n in (1, 2, 3)] + [dict(dense_dims=n) for n in (1, 2, 3)]
    total = num_inputs * world_size
    cases = []
    for layout in layouts:
        expected = _sparse_input(0, total, **layout)
        for other in range(1, total):
            expected = expected + _sparse_input(other, total, **layout)
        inputs = [_sparse_input(num_inputs * rank + i, total, **layout) for i in range(num_inputs)]
        cases.append((inputs, [expected for _ in range(num_inputs)]))
    return cases


def _visible_gpu_count() -> int:
    if hasattr(torch, "hpu") and torch.hpu.is_available():
        return torch.hpu.device_count()
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        return torch.xpu.device_count()
    return torch.cuda.device_count()


def init_multigpu_helper(world_size: int, backend: str) -> dict[int, list[int]]:
    """Split the visible GPUs evenly across ranks: ``{rank: [device indices]}``.

    With fewer GPUs than ranks upstream hands every rank an empty list and the
    test fails somewhere later; here the test is skipped with the GPU count it needs.
    """
    available = _visible_gpu_count()
    if available < world_size:
        skip_rank(gpu_count_skip(world_size))
    per_rank = 1
    return {rank: list(range(rank * per_rank, (rank + 1) * per_rank))
            for rank in range(world_size)}


def verify_ddp_error_logged(model_DDP: Any, err_substr: str) -> None:
    """Assert DDP recorded ``err_substr`` (C++ stack trace trimmed) in its logging data."""
    data = model_DDP._get_ddp_logging_data()
    for key in ("iteration", "has_error", "error"):
        if key not in data:
            raise AssertionError(f"Expected {key!r} in ddp_logging_data, got keys {sorted(data)}")
    expected = err_substr.split("\nException raised from ")[0]
    if expected not in data["error"]:
        raise AssertionError(
            f"Did not find expected {expected} in ddp logging data error: {data['error']}")


def reset_dynamo(clear_counters: bool = False) -> None:
    """Reset torch.compile state, if a test already brought dynamo in (importing it costs seconds)."""
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None:
        dynamo.reset()
        if clear_counters:
            dynamo.utils.counters.clear()


def run_subtests(
    cls_inst: Any,
    subtest_config: dict[str, list[Any]],
    test_fn: Callable,
    *test_args: Any,
    **test_kwargs: Any,
) -> None:
    """Run ``test_fn`` once per combination of ``subtest_config`` values, each as a subTest.

    Spreads the cost of starting ranks and a process group over many cases;
    ranks meet at a barrier after each one.
    """
    keys = list(subtest_config)
    for values in itertools.product(*(subtest_config[key] for key in keys)):
        kwargs = dict(zip(keys, values))
        with cls_inst.subTest(**kwargs):
            reset_dynamo()
            test_fn(*test_args, **test_kwargs, **kwargs)
            reset_dynamo()
        if c10d.is_available() and c10d.is_initialized():
            c10d.barrier()


@functools.lru_cache(maxsize=None)
def has_efa() -> bool:
    """True if libfabric reports an EFA provider (``fi_info -p efa -t FI_EP_RDM``)."""
    try:
        result = subprocess.run(
            ["fi_info", "-p", "efa", "-t", "FI_EP_RDM"],
            check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except (FileNotFoundError, PermissionError):
        return False
    return result.returncode == 0


def tp_transports() -> list[str] | None:
    """TensorPipe transports to use: without InfiniBand where EFA would break it."""
    return ["shm", "uv"] if has_efa() else None


def _build_tensor(size: int, value: Any = None, dtype: torch.dtype = torch.float,
                  device_id: int | None = None) -> torch.Tensor:
    """A ``size``^3 tensor filled with ``value`` (default: ``size``), on GPU ``device_id``."""
    tensor = torch.empty(size, size, size, dtype=dtype).fill_(size if value is None else value)
    return tensor if device_id is None else tensor.cuda(device_id)


def _build_multidim_tensor(dim: int, dim_size: int, value: Any = None,
                           dtype: torch.dtype = torch.float) -> torch.Tensor:
    """A ``dim``-dimensional tensor of side ``dim_size`` filled with ``value`` (default ``dim``)."""
    return torch.empty([dim_size] * dim, dtype=dtype).fill_(dim if value is None else value)


def _create_autograd_profiler() -> Any:
    return torch.autograd.profiler.profile(record_shapes=True)


def _create_torch_profiler() -> Any:
    return torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True)


def get_profiling_event(event_name: str, profiler: Any,
                        dedup_gpu_user_annotation: bool = False) -> list:
    """Profiler events whose name starts or ends with ``event_name``."""
    events = (profiler.events() if isinstance(profiler, torch.profiler.profile)
              else profiler.function_events)
    device_annotations = {torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.XPU}
    return [
        event for event in events
        if (event.name.startswith(event_name) or event.name.endswith(event_name))
        and not (dedup_gpu_user_annotation and event.device_type in device_annotations)
    ]


def get_profiler_nccl_meta(prof: Any) -> list[dict]:
    """The ``record_param_comms`` events (collective metadata) of a torch profiler trace."""
    fd, path = tempfile.mkstemp(suffix=".json", prefix="distspawn-trace-")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as handle:
            events = json.load(handle)["traceEvents"]
    finally:
        os.remove(path)
    return [event for event in events if event.get("name") == "record_param_comms"]


def retrieve_result_from_completion_queue(
    process: Any,
    completion_queue: Any,
    timeout: int | None = None,
) -> Any:
    """The item ``process`` put on ``completion_queue``, or a RuntimeError instance.

    Returns (not raises) the error when the process ended without a result or
    ``timeout`` seconds passed, as upstream does; but it wakes as soon as data
    arrives or the process ends, where upstream checks every 10 to 120 seconds.
    """
    started = time.monotonic()
    reader = getattr(completion_queue, "_reader", None)  # the queue's pipe, to wait on
    while True:
        elapsed = time.monotonic() - started
        if timeout is not None and elapsed > timeout:
            return RuntimeError(f"Process timed out after {elapsed}s")
        budget = 120.0 if timeout is None else timeout - elapsed
        if reader is not None:
            wait([reader, process.sentinel], budget)
            budget = min(budget, 0.1)  # data is there, or the process is gone, or time is up
        try:
            return completion_queue.get(timeout=budget)
        except queue.Empty:
            if not process.is_alive() and completion_queue.empty():
                return RuntimeError(f"Exited with {process.exitcode}")
