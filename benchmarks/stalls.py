"""How long a hung collective takes to fail, and what the failure says first.

Runs ``test/scenarios/stalls.py`` (collectives that can never finish, and two
that only take a while) under pytest, as users run it, once per harness:
distspawn's fresh processes, its reused workers, and upstream's harness (where
``torch.testing._internal`` imports here). Prints each row's seconds, verdict
and the first line of its failure.

    python benchmarks/stalls.py                    # deadline 60 s for upstream's rows
    python benchmarks/stalls.py --deadline 300     # upstream's default deadline
    python benchmarks/stalls.py --harnesses processes,reused
    python benchmarks/stalls.py --rows reduce_ops   # pytest -k: only the rows it selects
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree

HERE = os.path.dirname(os.path.abspath(__file__))
SCENARIO = os.path.join(HERE, os.pardir, "test", "scenarios", "stalls.py")
HARNESSES = ("processes", "reused", "upstream")


def _first_line(case: ElementTree.Element) -> str:
    failure = case.find("failure")
    if failure is None:
        return ""
    text = failure.get("message") or failure.text or ""
    # pytest's message is "ExceptionType: text": the report's first lines.
    lines = [line for line in text.splitlines() if line.strip()]
    # The stall's own line where there is one, else the first rank's.
    for line in lines:
        if "failed after" in line or line.startswith("E ") or " ranks failed (" in line:
            continue
        return line.split(": ", 1)[-1] if line.startswith("distspawn.") else line
    return lines[0] if lines else ""


def run(harness: str, deadline: int, rows: str = "") -> list[tuple[str, float, str, str]]:
    """(test, seconds, verdict, first line of the failure) for each row."""
    with tempfile.TemporaryDirectory() as tmp:
        junit = os.path.join(tmp, "junit.xml")
        env = {**os.environ, "DISTSPAWN_STALL_TIER": harness,
               "DISTRIBUTED_TESTS_DEFAULT_TIMEOUT": str(deadline)}
        env.pop("CI", None)  # upstream's run_tests wants xmlrunner under CI
        subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "-o", "junit_family=xunit1", f"--junitxml={junit}", SCENARIO,
                        *(["-k", rows] if rows else [])],
                       env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=20 * deadline + 600)
        rows = []
        for case in ElementTree.parse(junit).iter("testcase"):
            verdict = ("failed" if case.find("failure") is not None or case.find("error")
                       is not None else "skipped" if case.find("skipped") is not None
                       else "passed")
            rows.append((case.get("name"), float(case.get("time", 0)), verdict,
                         _first_line(case)))
        return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--harnesses", default=",".join(HARNESSES))
    parser.add_argument("--deadline", type=int, default=60,
                        help="DISTRIBUTED_TESTS_DEFAULT_TIMEOUT for every run (default 60)")
    parser.add_argument("--rows", default="", help="a pytest -k expression picking rows")
    parser.add_argument("--save", help="write every row as JSON to this file")
    args = parser.parse_args()
    saved: dict = {"deadline_s": args.deadline, "harnesses": {}}
    for harness in args.harnesses.split(","):
        if harness == "upstream":
            try:
                import torch.testing._internal.common_distributed  # noqa: F401
            except Exception as exc:  # noqa: BLE001 - any failure: not runnable here
                print(f"upstream: skipped, its harness does not import here ({exc})")
                continue
        print(f"{harness} (deadline {args.deadline} s)")
        rows = run(harness, args.deadline, args.rows)
        saved["harnesses"][harness] = [
            {"case": name, "seconds": seconds, "verdict": verdict, "first_line": first}
            for name, seconds, verdict, first in rows]
        for name, seconds, verdict, first in rows:
            print(f"  {name:55s} {seconds:7.1f} s  {verdict:7s} {first[:150]}")
    if args.save:
        sys.path.insert(0, HERE)
        from measured_on import measured_on

        saved["measured_on"] = measured_on()
        with open(args.save, "w") as f:
            json.dump(saved, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
