"""What a saved benchmark result says about how it was made.

Every benchmark's ``--save`` file carries a ``"measured_on"`` record: the
command as typed, the date, the torch and Python releases, the CPU count and
load, and distspawn's commit. ``docs/figures.py`` prints it under each figure,
so a figure always says which run drew it.
"""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def _commit() -> str | None:
    try:
        found = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return found.stdout.strip() or None


def measured_on(argv: list[str] | None = None) -> dict[str, Any]:
    """The record of this run: put it under ``"measured_on"`` in a saved result."""
    import torch  # the benchmarks need it anyway; imported late so --help stays quick

    args = sys.argv if argv is None else argv
    script = os.path.relpath(os.path.abspath(args[0]), REPO) if args else "?"
    return {
        "command": " ".join(["python", script, *args[1:]]),
        "date": datetime.date.today().isoformat(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_average_at_end": round(os.getloadavg()[0], 2),
        "distspawn_commit": _commit(),
    }
