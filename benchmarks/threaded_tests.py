"""Per-test cost of threaded tests: distspawn's MultiThreadedTestCase vs upstream's.

Runs the same trivial test (world size 4, one all_reduce) ``--tests`` times per
round through each harness, each harness in its own fresh interpreter (both
register a backend named ``threaded``), alternating for ``--rounds`` rounds,
and prints the median time per test and the ratio.

    python benchmarks/threaded_tests.py [--tests 300] [--rounds 5] [--world-size 4]

Upstream's harness is measured when ``torch.testing._internal.common_distributed``
imports (it needs ``expecttest``); otherwise its row says why it is missing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

HARNESSES = ("distspawn", "upstream")
WARM_UP = 50


def _test_class(base, world_size):
    import torch
    import torch.distributed as dist

    class Trivial(base):
        @property
        def world_size(self):
            return world_size

        def setUp(self):
            super().setUp()
            self._spawn_threads()

        def test_all_reduce(self):
            t = torch.ones(2)
            dist.all_reduce(t)
            assert t[0].item() == world_size

    return Trivial


def measure(harness: str, tests: int, world_size: int) -> dict:
    """In this interpreter: run ``tests`` trivial tests, return seconds per test."""
    import unittest
    import warnings

    warnings.simplefilter("ignore")
    if harness == "upstream":
        try:
            from torch.testing._internal.common_distributed import MultiThreadedTestCase
        except Exception as exc:  # noqa: BLE001 - any import failure means "not measured"
            return {"error": f"{type(exc).__name__}: {exc}"}
    else:
        from distspawn import MultiThreadedTestCase
    cls = _test_class(MultiThreadedTestCase, world_size)
    # The first tests of a process pay one-off costs (lazy imports, allocator
    # growth); both harnesses get the same warm-up before the clock starts.
    warm = unittest.TestResult()
    unittest.TestSuite([cls("test_all_reduce") for _ in range(WARM_UP)]).run(warm)
    result = unittest.TestResult()
    suite = unittest.TestSuite([cls("test_all_reduce") for _ in range(tests)])
    started = time.perf_counter()
    suite.run(result)
    elapsed = time.perf_counter() - started
    bad = len(result.failures) + len(result.errors) + len(warm.failures) + len(warm.errors)
    if bad:
        detail = (result.failures + result.errors + warm.failures + warm.errors)[0][1]
        return {"error": f"{bad} tests did not pass: {detail[-500:]}"}
    return {"per_test_s": elapsed / tests}


def _child(harness: str, tests: int, world_size: int) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--child", harness, "--tests", str(tests),
         "--world-size", str(world_size)],
        capture_output=True, text=True, check=False)
    for line in reversed(out.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    return {"error": f"exit {out.returncode}: {out.stderr[-500:]}"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tests", type=int, default=300, help="tests per round (default 300)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per harness (default 5)")
    parser.add_argument("--world-size", type=int, default=4, help="threads per test (default 4)")
    parser.add_argument("--child", choices=HARNESSES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print("RESULT " + json.dumps(measure(args.child, args.tests, args.world_size)))
        return 0

    samples: dict[str, list[float]] = {h: [] for h in HARNESSES}
    errors: dict[str, str] = {}
    for _ in range(args.rounds):
        for harness in HARNESSES:
            if harness in errors:
                continue
            result = _child(harness, args.tests, args.world_size)
            if "error" in result:
                errors[harness] = result["error"]
            else:
                samples[harness].append(result["per_test_s"])

    print(f"trivial threaded tests, world size {args.world_size}, {args.tests} tests x "
          f"{args.rounds} rounds, median per test:")
    medians = {h: statistics.median(v) for h, v in samples.items() if v}
    for harness in HARNESSES:
        if harness in medians:
            spread = ", ".join(f"{s * 1e3:.2f}" for s in samples[harness])
            print(f"  {harness:<10} {medians[harness] * 1e3:7.2f} ms   (rounds: {spread})")
        else:
            print(f"  {harness:<10} not measured: {errors.get(harness, 'no samples')}")
    if len(medians) == 2:
        print(f"  upstream / distspawn: {medians['upstream'] / medians['distspawn']:.2f}x")
    return 1 if "distspawn" in errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
