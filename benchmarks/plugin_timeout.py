"""What a plugin's timeout leaves of a class on reused ranks, on each harness.

Runs ``test/scenarios/plugin_timeout.py`` (3 tests on the same reused ranks,
the first hung) under pytest with pytest-timeout's signal method, as a CI job
with ``--timeout`` runs it: on upstream's harness, in distspawn's stand-in
mode, and on distspawn. Prints each test's verdict, the run's wall time, and
whether the timeout's failure shows where the ranks were. Needs pytest-timeout
(``pip install pytest-timeout``).

    python benchmarks/plugin_timeout.py               # --timeout 10
    python benchmarks/plugin_timeout.py --timeout 30 --harnesses distspawn
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from side_by_side import junit_cases  # noqa: E402
SCENARIO = os.path.join(HERE, os.pardir, "test", "scenarios", "plugin_timeout.py")
HARNESSES = ("upstream", "stand-in", "distspawn")
# The first line of the note distspawn adds under the timeout's exception.
RANKS_NOTE = "still ran when this stopped the test process's wait for them"


def run(harness: str, timeout: int) -> tuple[float, list[tuple[str, str]], bool]:
    """(wall seconds, (test, "pass", "fail" or "skip: ...") for each test, whether
    the ranks were shown)."""
    flags = {"upstream": ["-p", "no:distspawn"], "stand-in": ["--distspawn-stand-in"],
             "distspawn": []}[harness]
    env = {**os.environ, "PLUGIN_TIMEOUT_BASE": "distspawn" if harness == "distspawn"
           else "upstream"}
    env.pop("CI", None)  # upstream's run_tests wants xmlrunner under CI
    with tempfile.TemporaryDirectory() as tmp:
        junit = os.path.join(tmp, "junit.xml")
        started = time.monotonic()
        # pytest prints the failures, the note under the timeout's exception too.
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               "-p", "no:randomly", *flags, f"--timeout={timeout}",
                               "--timeout-method=signal", f"--junitxml={junit}", SCENARIO],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=60 * timeout + 600)
        wall = time.monotonic() - started
        verdicts = [(test, verdict) for _, test, verdict, _ in junit_cases(Path(junit))]
        return wall, verdicts, RANKS_NOTE in done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--harnesses", default=",".join(HARNESSES))
    parser.add_argument("--timeout", type=int, default=10,
                        help="pytest-timeout's --timeout, in seconds (default 10)")
    args = parser.parse_args()
    try:
        import pytest_timeout  # noqa: F401
    except ImportError:
        sys.exit("needs pytest-timeout: pip install pytest-timeout")
    for harness in args.harnesses.split(","):
        if harness not in HARNESSES:
            sys.exit(f"--harnesses: {harness!r} is not one of {', '.join(HARNESSES)}")
        if harness != "distspawn":
            try:
                import torch.testing._internal.common_distributed  # noqa: F401
            except Exception as exc:  # noqa: BLE001 - any failure: not runnable here
                print(f"{harness}: skipped, upstream's harness does not import here ({exc})")
                continue
        wall, verdicts, shown = run(harness, args.timeout)
        counts = ", ".join(f"{sum(v.startswith(kind) for _, v in verdicts)} {words}"
                           for kind, words in (("pass", "passed"), ("fail", "failed"),
                                               ("skip", "skipped")))
        print(f"{harness}: {counts} in {wall:.1f} s; ranks shown in the timeout's "
              f"failure: {'yes' if shown else 'no'}")
        for name, verdict in verdicts:
            print(f"    {name}: {verdict}")


if __name__ == "__main__":
    main()
