"""Record upstream's harness on every scenario the suite compares with it.

    python test/record_upstream.py               # the whole suite, -n 2
    python test/record_upstream.py --fresh       # the installed release's records anew
    python test/record_upstream.py test/test_dtensor.py -k upstream

Runs the tests with DISTSPAWN_TEST_UPSTREAM=record: each run on upstream's
harness is live and written to test/data/upstream_runs/torch-<release>/
(see upstream_record.py); later runs of the suite on that release replay it.
Run it after changing a scenario that a comparison uses (the suite says which
record went stale), and for a new torch release. Exit status: pytest's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import upstream_record

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str]) -> int:
    fresh = "--fresh" in argv
    args = [arg for arg in argv if arg != "--fresh"] or ["test", "-n", "2", "--dist", "worksteal"]
    folder = upstream_record.release_folder()
    if fresh and folder.exists():
        shutil.rmtree(folder)
    env = {**os.environ, upstream_record.MODE_VAR: "record"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", *args], cwd=ROOT, env=env)
    count = len(list(folder.glob("*.json"))) if folder.exists() else 0
    print(f"{count} records of upstream's runs in {folder.relative_to(ROOT)}")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
