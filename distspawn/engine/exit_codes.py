"""Exit codes a rank ends with, as upstream defines them.

A rank exits 0 (passed), ``TEST_ERROR_EXIT_CODE`` (the test raised) or one of
the ``TEST_SKIPS`` codes (skipped, and why). The table is upstream's contract;
it is read where it is needed, never copied, so an entry a test file adds or
changes is honoured.
"""

from __future__ import annotations

from typing import NamedTuple

from .releases import upstream_says_multi_device

TEST_ERROR_EXIT_CODE: int = 10


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
GPU_COUNT_CODES = (75, 77, 80, 81, 82, 83, 84, 85)

TEST_SKIPS: dict[str, TestSkip] = {
    name: TestSkip(code, message) for name, code, message in _NAMED_SKIPS
}


def _device_count_skips(key: str, devices: str) -> dict[str, TestSkip]:
    return {f"{key}-{count}": TestSkip(
        code, f"Need at least {count} {devices}{'s' if count > 1 else ''}")
        for count, code in enumerate(GPU_COUNT_CODES, start=1)}


# Both spellings, so that files written for torch 2.13 and for 2.14 on run
# alike; the installed release's comes first, so that its words report a skip
# by code (skip_message_for) and name the skips distspawn's own decorators take.
# "needs N devices" by release: the name's stem and what it calls a device.
DEVICE_COUNT_SPELLINGS = {"multi-gpu": "CUDA device", "multi-device": "accelerator device"}
_SPELLINGS = [_device_count_skips(key, devices) for key, devices in DEVICE_COUNT_SPELLINGS.items()]
if upstream_says_multi_device():
    _SPELLINGS.reverse()
for _spelling in _SPELLINGS:
    TEST_SKIPS.update(_spelling)
DEVICE_COUNT_KEY = "multi-device" if upstream_says_multi_device() else "multi-gpu"


def skip_message_for(exit_code: int | None) -> str | None:
    """The skip reason ``exit_code`` stands for in ``TEST_SKIPS`` now, or None."""
    for skip in TEST_SKIPS.values():
        if skip.exit_code == exit_code:
            return skip.message
    return None
