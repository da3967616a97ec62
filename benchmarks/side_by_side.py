"""One test file, through distspawn and through upstream's harness, under pytest.

The file picks its harness from UPSTREAM_HARNESS (1: upstream's modules;
otherwise distspawn's), as ``test/scenarios/*`` do. A third harness,
``stand-in``, runs the upstream variant unchanged with ``DISTSPAWN_STAND_IN=1``
(distspawn's zero-change mode: upstream's modules on distspawn's engine). Each run goes through pytest,
the way users run tests, once per world size and harness, and prints pass /
fail / skip counts, wall time, the speed ratio, and every test whose verdict
differs between the harnesses. The default file is upstream's own
DistributedTest suite (``_DistTestBase`` from the torch wheel, test bodies
unchanged), for which BACKEND / WORLD_SIZE / TEMP_DIR choose the run.

    python benchmarks/side_by_side.py --world-sizes 2,3,4
    python benchmarks/side_by_side.py --world-sizes 2 -k "barrier or broadcast"
    python benchmarks/side_by_side.py --file test/scenarios/dtensor_suite.py
    python benchmarks/side_by_side.py --harnesses distspawn --save verdicts.json
    python benchmarks/side_by_side.py --harnesses stand-in,upstream

Needs ``torch.testing._internal`` to import (``pip install expecttest``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
UPSTREAM_SUITE = ROOT / "test" / "scenarios" / "upstream_dist_suite.py"
HARNESSES = ("distspawn", "upstream", "stand-in")


def junit_cases(path: Path) -> list[tuple[str, str, str, float]]:
    """Each test case of a JUnit XML file: its full class name (the test's
    module path, dotted, then its classes), its name, "pass", "fail" or
    "skip: <reason>", and its seconds."""
    cases = []
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            verdict = "fail"
        elif (skipped := case.find("skipped")) is not None:
            verdict = "skip: " + (skipped.get("message") or "").removeprefix(
                "SkipTest: ").strip()
        else:
            verdict = "pass"
        cases.append((case.get("classname", ""), case.get("name", ""), verdict,
                      float(case.get("time") or 0.0)))
    return cases


def case_name(classname: str, test: str) -> str:
    """"Class.test": a JUnit case's innermost class (or module) and its name."""
    return f"{classname.rsplit('.', 1)[-1]}.{test}"


def verdicts_from_junit(path: Path, times: dict[str, float] | None = None) -> dict[str, str]:
    """"Class.test" -> "pass", "fail" or "skip: <reason>" from a JUnit XML file
    (and each test's seconds into ``times``, when given)."""
    verdicts = {}
    for classname, test, verdict, seconds in junit_cases(path):
        name = case_name(classname, test)
        if times is not None:
            times[name] = seconds
        verdicts[name] = verdict
    return verdicts


def run_suite(harness: str, world_size: int, backend: str, keyword: str | None,
              timeout: float, tests: list[str] | None = None,
              times: dict[str, float] | None = None,
              suite: Path = UPSTREAM_SUITE) -> tuple[dict[str, str], float]:
    """Run ``suite`` (or just ``tests``, named "Class.test") once under pytest;
    its verdicts and wall-clock seconds."""
    with tempfile.TemporaryDirectory(prefix="distspawn-side-by-side-") as tmp:
        junit = Path(tmp) / "junit.xml"
        temp_dir = Path(tmp) / "temp_dir"
        temp_dir.mkdir()
        env = {**os.environ, "BACKEND": backend, "WORLD_SIZE": str(world_size),
               "TEMP_DIR": str(temp_dir),
               "UPSTREAM_HARNESS": "0" if harness == "distspawn" else "1",
               "DISTSPAWN_STAND_IN": "1" if harness == "stand-in" else "0"}
        # --noconftest: the repository's test/conftest.py is for distspawn's own tests.
        targets = [f"{suite}::{name.replace('.', '::')}" for name in tests or []]
        command = [sys.executable, "-m", "pytest", *(targets or [str(suite)]), "-q",
                   "--noconftest", "-p", "no:cacheprovider", f"--junitxml={junit}"]
        if keyword:
            command += ["-k", keyword]
        started = time.monotonic()
        subprocess.run(command, env=env, cwd=suite.parent, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=timeout, check=False)
        elapsed = time.monotonic() - started
        if not junit.exists():
            raise SystemExit(f"{harness} at WORLD_SIZE={world_size}: pytest wrote no report")
        return verdicts_from_junit(junit, times), elapsed


def counts(verdicts: dict[str, str]) -> str:
    passed = sum(v == "pass" for v in verdicts.values())
    failed = sum(v == "fail" for v in verdicts.values())
    skipped = sum(v.startswith("skip") for v in verdicts.values())
    return f"{passed} passed, {failed} failed, {skipped} skipped"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world-sizes", default="2",
                        help="comma-separated WORLD_SIZE values (default: 2)")
    parser.add_argument("--harnesses", default=",".join(HARNESSES),
                        help="comma-separated: distspawn, upstream, stand-in "
                             "(default: all three)")
    parser.add_argument("--backend", default="gloo")
    parser.add_argument("--file", type=Path, default=UPSTREAM_SUITE,
                        help="the test file (default: upstream's DistributedTest suite)")
    parser.add_argument("-k", dest="keyword", default=None, help="pytest -k expression")
    parser.add_argument("--timeout", type=float, default=3 * 3600,
                        help="seconds allowed for one run of the suite")
    parser.add_argument("--save", type=Path, help="write every verdict to this JSON file")
    args = parser.parse_args(argv)
    try:
        world_sizes = [int(w) for w in args.world_sizes.split(",")]
    except ValueError:
        parser.error(f"--world-sizes={args.world_sizes!r}: expected integers such as 2,3,4")
    harnesses = args.harnesses.split(",")
    unknown = sorted(set(harnesses) - set(HARNESSES))
    if unknown:
        parser.error(f"--harnesses: unknown {unknown}; expected some of {list(HARNESSES)}")

    results: dict[str, dict] = {}
    for world_size in world_sizes:
        for harness in harnesses:
            times: dict[str, float] = {}
            verdicts, elapsed = run_suite(harness, world_size, args.backend, args.keyword,
                                          args.timeout, times=times,
                                          suite=args.file.resolve())
            results[f"{harness}-ws{world_size}"] = {"verdicts": verdicts, "seconds": elapsed,
                                                    "test_seconds": times}
            print(f"WORLD_SIZE={world_size} {harness:9}: {counts(verdicts)} "
                  f"in {elapsed:.0f} s", flush=True)
        if "upstream" not in harnesses:
            continue
        theirs = results[f"upstream-ws{world_size}"]
        for harness in harnesses:
            if harness == "upstream":
                continue
            ours = results[f"{harness}-ws{world_size}"]
            ratio = theirs["seconds"] / max(ours["seconds"], 1e-9)
            different = {name: (ours["verdicts"].get(name), theirs["verdicts"].get(name))
                         for name in set(ours["verdicts"]) | set(theirs["verdicts"])
                         if _kind(ours["verdicts"].get(name)) !=
                         _kind(theirs["verdicts"].get(name))}
            print(f"WORLD_SIZE={world_size}: {harness} {ratio:.1f}x faster than upstream; "
                  f"{len(different)} verdicts differ", flush=True)
            for name, (mine, upstream) in sorted(different.items()):
                print(f"  {name}: {harness} {mine!r}, upstream {upstream!r}")
    if args.save:
        args.save.write_text(json.dumps(results, indent=1, sort_keys=True))
    return 0


def _kind(verdict: str | None) -> str | None:
    # Skip reasons differ on purpose (distspawn keeps the rank's own reason).
    return verdict.split(":")[0] if verdict else verdict


if __name__ == "__main__":
    sys.exit(main())
