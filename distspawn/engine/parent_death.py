"""Ask the kernel to end this process when its parent ends (Linux's PDEATHSIG).

A process forked by distspawn (a rank, the rank server's successor) must not
outlive the process that forked it, even when that one is killed outright and
can run no clean-up of its own.
"""

from __future__ import annotations

import signal
import sys


def end_with_parent() -> bool:
    """SIGKILL this process when its parent ends; False where that cannot be asked.

    The kernel watches the parent from now on only: a caller that must not
    have missed its parent's end checks, after this, that it is still there.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        return libc.prctl(pr_set_pdeathsig, signal.SIGKILL) == 0
    except (OSError, AttributeError):
        return False
