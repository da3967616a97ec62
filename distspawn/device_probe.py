"""The one place that asks torch whether this machine has an accelerator.

A CUDA build of torch on a machine without a GPU (the usual CI runner) still
names ``cuda`` as its accelerator type; it has no device, so here it counts as
no accelerator, and nothing sets a device index or starts CUDA because of it.
None of these calls initialises a device runtime, so they are safe in a parent
that will fork ranks.
"""

from __future__ import annotations

import torch


def accelerator_type() -> str | None:
    """The device type ranks can use here ("cuda", "xpu", "mps", ...), or None."""
    accelerator = getattr(torch, "accelerator", None)  # torch >= 2.6
    if accelerator is not None:
        if accelerator.is_available():
            current = accelerator.current_accelerator()
            if current is not None:
                return current.type
    elif torch.cuda.is_available():
        return "cuda"
    elif hasattr(torch, "xpu") and torch.xpu.is_available():
        return "xpu"
    elif torch.backends.mps.is_available():
        return "mps"
    # Habana registers itself outside torch.accelerator on some releases.
    if hasattr(torch, "hpu") and torch.hpu.is_available():
        return "hpu"
    return None


def has_accelerator() -> bool:
    """True when a usable accelerator device exists (not merely a build for one)."""
    return accelerator_type() is not None


def accelerator_device_count() -> int:
    """How many accelerator devices ranks can use (0 on a GPU build without a GPU)."""
    device_type = accelerator_type()
    if device_type is None:
        return 0
    return torch.get_device_module(device_type).device_count()
