"""Upstream's harness, run once per release and scenario, replayed from a record.

Every comparison with upstream's harness runs a scenario file on it
(``harness.run_python_on_upstream``): 5-10 s a run, most of the suite's time.
Upstream's verdict on a scenario file depends only on the file (and the
scenario modules it imports), the arguments and variables it is run with, and
the torch release. So each such run is recorded once, as data in
``test/data/upstream_runs/torch-<release>/``, and the default run compares
with the record of the installed release:

- ``DISTSPAWN_TEST_UPSTREAM=replay`` (the default): a run whose record exists
  is replayed from it; a run with none, or on a release with no records (CI's
  newest and oldest rows), runs live;
- ``live``: every run is live (CI runs the release rows this way);
- ``record``: every run is live, and written down (``python
  test/record_upstream.py`` does this for the whole suite).

A record names the release, the commit it was made at and a digest of the
scenario files the run reads; where those files changed since, the test fails
loudly, saying how to refresh it. A run given a path of this test run's own
(a ``tmp_path`` in its arguments or variables) is always live: its record
could not be found again, and the test may read what it wrote there.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

RECORDS = Path(__file__).parent / "data" / "upstream_runs"
MODE_VAR = "DISTSPAWN_TEST_UPSTREAM"
MODES = ("replay", "live", "record")
TESTS = Path(__file__).parent
_IMPORTED = re.compile(r"^\s*(?:from|import)\s+([A-Za-z_]\w*)", re.M)


class StaleRecord(AssertionError):
    """A record of upstream's run whose scenario files have changed since."""


def mode() -> str:
    value = os.environ.get(MODE_VAR, "replay")
    if value not in MODES:
        raise ValueError(f"{MODE_VAR}={value!r}: expected one of {', '.join(MODES)}")
    return value


def release() -> str:
    """The installed torch release, without its local part (2.13.0, not 2.13.0+cpu)."""
    return importlib.metadata.version("torch").split("+")[0]


def release_folder() -> Path:
    return RECORDS / f"torch-{release()}"


def key(args: list[str], env: dict[str, str] | None, cwd: Path) -> str | None:
    """What names a run's record (None: the run has a path of its own and is
    always live)."""
    given = json.dumps({"args": list(args), "env": dict(sorted((env or {}).items()))},
                       sort_keys=True)
    temp_roots = {tempfile.gettempdir(), "/tmp", os.path.realpath(tempfile.gettempdir())}
    if any(root in given for root in temp_roots):
        return None
    where = os.path.relpath(cwd, TESTS) if cwd.is_relative_to(TESTS) else cwd.name
    return hashlib.sha256(f"{given}\0{where}".encode()).hexdigest()[:20]


def scenario_files(args: list[str], cwd: Path) -> list[Path]:
    """The files a run reads from the scenario folders: each argument that
    names one (``x.py``, ``x``, ``pkg/x.py``), and the local modules those
    import, transitively."""
    found: list[Path] = []
    pending = [word for arg in args for word in (arg, arg.replace(".", "/"))]
    seen: set[Path] = set()
    while pending:
        name = pending.pop()
        for candidate in (cwd / name, cwd / f"{name}.py", cwd / name / "__init__.py"):
            if candidate.is_file() and candidate not in seen:
                seen.add(candidate)
                found.append(candidate)
                folder = candidate.parent
                # pytest reads the conftest.py files from there up to cwd
                for above in [folder, *folder.parents]:
                    if above == cwd.parent or not above.is_relative_to(cwd):
                        break
                    pending.append(str((above / "conftest.py").relative_to(cwd)))
                # A local import is found beside the file or in cwd (both are
                # first in sys.path: pytest's rootdir insertion, python -m).
                imported = _IMPORTED.findall(candidate.read_text(errors="replace"))
                pending += imported
                if folder != cwd:
                    pending += [str(folder.relative_to(cwd) / n) for n in imported]
    return sorted(found)


def digest(files: list[Path]) -> str:
    total = hashlib.sha256()
    for path in files:
        total.update(os.path.relpath(path, TESTS).encode() + b"\0")
        total.update(path.read_bytes() + b"\0")
    return total.hexdigest()[:20]


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=TESTS,
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def replayed(args: list[str], env: dict[str, str] | None, cwd: Path) -> dict[str, Any] | None:
    """The recorded run, where replaying is on and there is one (None: run live).

    Raises :class:`StaleRecord` where the scenario files changed since."""
    run_key = key(args, env, cwd)
    if mode() != "replay" or run_key is None:
        return None
    path = release_folder() / f"{run_key}.json"
    if not path.exists():
        return None
    record = json.loads(path.read_text())
    files = scenario_files(args, cwd)
    now = digest(files)
    if record["scenario_digest"] != now:
        raise StaleRecord(
            f"upstream's run of {' '.join(args)} was recorded on torch {record['torch']} at "
            f"commit {record['commit']}, and its scenario files have changed since "
            f"({', '.join(os.path.relpath(f, TESTS) for f in files)}). Refresh the records "
            f"with: python test/record_upstream.py (or run with {MODE_VAR}=live). "
            f"Record: {os.path.relpath(path, TESTS)}")
    return record


def write(args: list[str], env: dict[str, str] | None, cwd: Path, outcome: dict[str, Any]) -> None:
    """Write the outcome of a live run down, where recording is on."""
    run_key = key(args, env, cwd)
    if mode() != "record" or run_key is None:
        return
    folder = release_folder()
    folder.mkdir(parents=True, exist_ok=True)
    files = scenario_files(args, cwd)
    record = {"torch": importlib.metadata.version("torch"), "commit": _commit(),
              "args": list(args), "env": env or {}, "cwd": os.path.relpath(cwd, TESTS),
              "scenario_files": [os.path.relpath(f, TESTS) for f in files],
              "scenario_digest": digest(files), **outcome}
    temporary = folder / f".{run_key}.{os.getpid()}"
    temporary.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    temporary.replace(folder / f"{run_key}.json")
