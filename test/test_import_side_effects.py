"""Importing distspawn changes no global state and pulls in no private torch harness."""

import json
import subprocess
import sys

SNAPSHOT = r"""
import json, logging, multiprocessing, os, signal, sys, warnings
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
        # Some projects' modules check this name to tell a rank from the test process.
        "process_name": multiprocessing.current_process().name,
        "environ_type": type(os.environ).__name__,
        "environ": dict(os.environ),
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



# As if NVML had answered "two GPUs" on a CUDA build. torch marks a forked child
# "in bad fork" (it refuses CUDA there) once the parent has asked the CUDA
# runtime anything, even on a machine with no GPU: so this runs anywhere a
# CUDA build of torch is installed.
FORK_AFTER_IMPORTS = r"""
import json, os
import torch

torch.cuda._device_count_nvml = lambda: 2
# What the rank server imports before it forks ranks (engine/preload.py).
import torch.distributed.tensor, torch.testing, torch._dynamo
import distspawn, distspawn.compat, distspawn.dtensor, distspawn.fsdp
from distspawn.fixtures import device_probe, environment

probes = [device_probe.accelerator_type(), device_probe.accelerator_device_count(),
          device_probe.cuda_available(), environment.TEST_CUDA]
pid = os.fork()
if pid == 0:
    os._exit(7 if torch._C._cuda_isInBadFork() else 0)
print(json.dumps({"probes": probes, "bad_fork": os.waitpid(pid, 0)[1] >> 8 == 7}))
"""


def test_importing_and_probing_leave_forked_ranks_able_to_use_cuda():
    # torch.cuda.is_available() asks the CUDA runtime; the rank server imports
    # distspawn before forking each rank, and on a GPU machine every rank
    # failed at its first CUDA call. device_count() asks NVML first.
    import pytest
    import torch

    if not hasattr(torch._C, "_cuda_isInBadFork"):
        pytest.skip("a CPU build of torch: there is no CUDA to refuse")
    out = subprocess.run([sys.executable, "-c", FORK_AFTER_IMPORTS], capture_output=True,
                         text=True, check=True).stdout
    result = json.loads(out.splitlines()[-1])
    assert result == {"probes": ["cuda", 2, True, True], "bad_fork": False}
