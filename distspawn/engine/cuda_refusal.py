"""A rank's CUDA call that torch refuses because the rank was forked.

torch refuses CUDA in any process forked after the CUDA runtime was asked
anything, in the words below, advising the 'spawn' start method. A GPU count
asks the runtime wherever NVML cannot answer, and that includes every machine
without an NVIDIA driver (a CUDA build on a CPU-only runner): there, every
rank forked from a process that counted GPUs (upstream's ``common_utils``
does at import) gets these words for a CUDA call, where a spawned rank gets
"Found no NVIDIA driver". Spawning would give such a test no device either,
so the rank's report says what is really missing.
"""

from __future__ import annotations

import ctypes

BAD_FORK_WORDS = "Cannot re-initialize CUDA in forked subprocess"

NO_DRIVER_NOTE = (
    "distspawn: this machine has no NVIDIA driver, so no CUDA device, and the test "
    "needs one. torch refuses CUDA in these words in any process forked after a GPU "
    "count where no driver answers; upstream's harness, which spawns its ranks, gets "
    "\"Found no NVIDIA driver on your system\".\n")


def nvidia_driver_present() -> bool:
    """Whether this machine has an NVIDIA driver (its CUDA library loads).

    Asks no CUDA API, so it can be called anywhere, a forked rank included.
    """
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def note_for(formatted: str) -> str:
    """What to add to a rank's formatted traceback: the note above where the
    refusal is in it and there is no driver, else nothing."""
    if BAD_FORK_WORDS in formatted and not nvidia_driver_present():
        return NO_DRIVER_NOTE
    return ""
