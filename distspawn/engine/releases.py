"""What differs between the torch releases distspawn runs on, decided here.

Each answer comes from a check of what the installed torch has (never from
comparing version numbers), and each says what the other answer costs.
"""

from __future__ import annotations

import functools
import os
import re


def _harness_source(*path: str) -> str | None:
    """The text of one module of the installed torch's harness (under
    ``torch/testing/_internal``), read as data, never imported; None where
    this build ships none."""
    import torch

    source = os.path.join(os.path.dirname(torch.__file__), "testing", "_internal", *path)
    try:
        with open(source, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return None


@functools.lru_cache(maxsize=None)
def upstream_says_multi_device() -> bool:
    """Whether the installed torch's harness names its "needs N GPUs" skips
    ``multi-device-N`` ("Need at least N accelerator devices", 2.14 on) rather
    than ``multi-gpu-N`` ("Need at least N CUDA devices").

    Both spellings are in ``TEST_SKIPS`` either way (files written for either
    release run); this picks the words a skip with one of those codes is
    reported with, as the installed release would report it. Read from the
    harness's source text, which is data here: the module is not imported.
    """
    text = _harness_source("common_distributed.py")
    return text is not None and '"multi-device-' in text  # none shipped: the older words


@functools.lru_cache(maxsize=None)
def upstream_testcase_guards() -> frozenset:
    """Which global state the installed torch's ``common_utils.TestCase`` guards
    beyond what every release does (sparse invariant checks, grad mode):

    - "torch_function": a test that leaves a torch function mode pushed, or
      torch functions switched off, fails (2.13 on);
    - "fp32_precision": one that changes an fp32 precision flag fails (2.14 on);
    - "fp32_precision_generic": ``torch.get_float32_matmul_precision()`` is one
      of those flags (2.15 on).

    A test file whose imports are switched to distspawn's TestCase gets the
    verdicts it gets there. Read from the harness's source text (data here,
    not imported); with no harness shipped, none: leaks pass, as on the older
    releases.
    """
    text = _harness_source("common_utils.py")
    if text is None:
        return frozenset()
    markers = {"torch_function": "torch function mode stack was leaked",
               "fp32_precision": "fp32 precision flag leak detected",
               "fp32_precision_generic": '("torch.get_float32_matmul_precision()",'}
    return frozenset(guard for guard, marker in markers.items() if marker in text)


def fsdp_calls(collective: str) -> str:
    """The ``torch.distributed`` function FSDP2 calls for ``collective``
    ("all_gather" or "reduce_scatter"), which the harness's patch helpers swap.

    Newer torch has ``all_gather_single`` / ``reduce_scatter_single`` and FSDP2
    calls them; torch 2.8 has neither, and FSDP2 calls ``all_gather_into_tensor``
    / ``reduce_scatter_tensor``. Patching a name FSDP2 does not call would leave
    a test's replacement unused (its checks would see nothing).
    """
    import torch.distributed as dist

    single = f"{collective}_single"
    if hasattr(dist, single):
        return single
    return {"all_gather": "all_gather_into_tensor",
            "reduce_scatter": "reduce_scatter_tensor"}[collective]


@functools.lru_cache(maxsize=None)
def transformer_mesh_parameter() -> str:
    """What the installed torch's ``Transformer.parallelize`` (the DTensor
    fixture) calls its mesh: ``device_mesh`` on 2.8, ``tp_mesh`` on 2.13 and
    later. A file calls it by keyword as its release names it, so distspawn's
    takes the same name; the other name would be a TypeError there. Read from
    the harness's source text; with none shipped, the newer name.
    """
    text = _harness_source("distributed", "_tensor", "common_dtensor.py")
    if text is not None and re.search(
            r'def parallelize\(\s*module: "Transformer",\s*device_mesh\b', text):
        return "device_mesh"
    return "tp_mesh"
