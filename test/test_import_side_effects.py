"""Importing distspawn changes no global state and pulls in no private torch harness."""

import json
import subprocess
import sys

SNAPSHOT = r"""
import json, logging, multiprocessing, signal, sys, warnings
import numpy, torch

def snapshot():
    root = logging.getLogger()
    return {
        "start_method": multiprocessing.get_start_method(allow_none=True),
        "root_handlers": len(root.handlers),
        "root_level": root.level,
        "default_dtype": str(torch.get_default_dtype()),
        "threads": torch.get_num_threads(),
        "grad": torch.is_grad_enabled(),
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "flags_frozen": torch.backends.flags_frozen(),
        "cudnn": torch.backends.cudnn.enabled,
        "sigint": str(signal.getsignal(signal.SIGINT)),
        "sigterm": str(signal.getsignal(signal.SIGTERM)),
        "excepthook": repr(sys.excepthook),
        "warning_filters": len(warnings.filters),
        "cuda_initialized": torch.cuda.is_initialized(),
    }

def private_modules():
    # `import torch` itself loads a few torch.testing._internal modules; count only new ones.
    return {m for m in sys.modules if m.startswith("torch.testing._internal") or m == "expecttest"}

before, private_before = snapshot(), private_modules()
import distspawn, distspawn.compat
after, private_after = snapshot(), private_modules()
print(json.dumps({"before": before, "after": after,
                  "private": sorted(private_after - private_before),
                  "harness": sorted(m for m in private_after if m.endswith(
                      ("common_utils", "common_distributed", "expecttest")))}))
"""


def test_import_has_no_global_side_effects():
    out = subprocess.run([sys.executable, "-c", SNAPSHOT], capture_output=True, text=True,
                         check=True).stdout
    result = json.loads(out.splitlines()[-1])
    assert result["after"] == result["before"]
    assert result["private"] == []
    assert result["harness"] == []


# As if NVML had answered "two GPUs" on a CUDA build; every call that asks the
# CUDA runtime, and so poisons fork, is counted.
POISON_WATCH = r"""
import json
import torch
import torch.cuda

asked = []
real_count = torch._C._cuda_getDeviceCount

def counted():
    asked.append("torch._C._cuda_getDeviceCount")
    return real_count()

torch._C._cuda_getDeviceCount = counted
torch.cuda._device_count_nvml = lambda: 2

# What the rank server imports before it forks ranks (engine/preload.py).
import torch.distributed.tensor, torch.testing, torch._dynamo
import distspawn, distspawn.compat, distspawn.dtensor, distspawn.fsdp
from distspawn.fixtures import device_probe, environment
probes = [device_probe.accelerator_type(), device_probe.accelerator_device_count(),
          device_probe.cuda_available(), environment.TEST_CUDA]
print(json.dumps({"asked": asked, "probes": probes}))
"""


def test_importing_and_probing_leave_fork_safe_for_cuda():
    # torch.cuda.is_available() asks the CUDA runtime, and torch then refuses
    # CUDA in every process forked afterwards: the rank server imports
    # distspawn before forking each rank, and on a GPU machine every rank
    # failed at its first CUDA call. device_count() asks NVML first.
    import pytest
    import torch

    if not hasattr(torch._C, "_cuda_getDeviceCount"):
        pytest.skip("a CPU build of torch: nothing asks a CUDA runtime")
    out = subprocess.run([sys.executable, "-c", POISON_WATCH], capture_output=True, text=True,
                         check=True).stdout
    result = json.loads(out.splitlines()[-1])
    assert result["asked"] == []
    assert result["probes"] == ["cuda", 2, True, True]


def test_the_stand_in_preload_leaves_fork_safe_with_the_servers_setting():
    # In the stand-in mode `import distspawn` imports upstream's common_utils,
    # which calls torch.cuda.is_available() at import: with the variable the
    # rank server sets for itself, that asks NVML, and fork stays safe.
    import os

    import pytest
    import torch

    from harness import upstream_module_imports

    if not hasattr(torch._C, "_cuda_getDeviceCount"):
        pytest.skip("a CPU build of torch: nothing asks a CUDA runtime")
    if not upstream_module_imports("torch.testing._internal.common_distributed"):
        pytest.skip("upstream's harness does not import here")
    from distspawn_rank_server import SERVER_ONLY_VARIABLES

    env = {**os.environ, **SERVER_ONLY_VARIABLES, "DISTSPAWN_STAND_IN": "1"}
    out = subprocess.run([sys.executable, "-c", POISON_WATCH], capture_output=True, text=True,
                         check=True, env=env).stdout
    assert json.loads(out.splitlines()[-1])["asked"] == []
