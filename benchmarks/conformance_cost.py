"""Per-test cost of upstream's DistributedTest suite on distspawn, beside the trivial and DDP tiers.

Upstream's own conformance suite (``DistributedTest._DistTestBase`` from the
torch wheel, test bodies unchanged, through distspawn's ``TestDistBackend``,
``test/scenarios/upstream_dist_suite.py``) runs once under pytest at
``BACKEND=gloo``; then ``tiers.py`` times a trivial test and a DDP step on the
default tier (forkserver) in the same run. A regression in what a suite test
costs beyond its collectives (rank start, rendezvous, barriers, imports,
teardown) shows as a gap between the suite's per-test time and the tiers'.

    python benchmarks/conformance_cost.py                  # world size 2
    python benchmarks/conformance_cost.py --world-size 3 --save results.json
    python benchmarks/conformance_cost.py --upstream       # upstream's harness too (minutes)

Verdicts are compared with upstream's, recorded in
``test/data/upstream_dist_suite.json`` for the release they name (or, with
``--upstream``, with upstream's run here); any difference is printed and the
exit status is 1.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
RECORDED = HERE.parent / "test" / "data" / "upstream_dist_suite.json"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def suite_cost(harness: str, world_size: int, timeout: float) -> dict:
    """One pytest run of upstream's suite on ``harness``: verdicts and times."""
    side_by_side = _load("side_by_side")
    times: dict[str, float] = {}
    verdicts, wall = side_by_side.run_suite(harness, world_size, "gloo", None, timeout,
                                            times=times)
    passed = [times[name] for name, verdict in verdicts.items() if verdict == "pass"]
    return {"wall_s": wall, "tests": len(verdicts), "counts": side_by_side.counts(verdicts),
            "per_passing_test_s": statistics.median(passed) if passed else None,
            "per_test_s": sum(times.values()) / max(len(times), 1), "verdicts": verdicts}


def tier_costs(world_size: int) -> dict[str, dict]:
    """The trivial test's and the DDP step's per-test cost on the default tier."""
    tiers = _load("tiers")
    return {suite: tiers._run_under_pytest("forkserver", suite, world_size, 10)
            for suite in ("trivial", "ddp")}


def expected_verdicts(world_size: int, upstream: dict | None) -> tuple[dict[str, str], str]:
    if upstream is not None:
        return upstream["verdicts"], "upstream's harness, this run"
    data = json.loads(RECORDED.read_text())
    release = data["torch"]
    if release.split("+")[0] != torch.__version__.split("+")[0]:
        return {}, f"none: recorded on torch {release}, this is {torch.__version__}"
    return data.get(f"upstream-ws{world_size}", {}), f"recorded on torch {release}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--world-size", type=int, default=2, choices=(2, 3, 4))
    parser.add_argument("--upstream", action="store_true",
                        help="also run the suite on upstream's harness (tens of minutes)")
    parser.add_argument("--timeout", type=float, default=1800, help="per suite run, seconds")
    parser.add_argument("--save", type=Path, help="write the figures as JSON here")
    args = parser.parse_args(argv)

    upstream = suite_cost("upstream", args.world_size, args.timeout) if args.upstream else None
    ours = suite_cost("distspawn", args.world_size, args.timeout)
    tiers = tier_costs(args.world_size)
    expected, source = expected_verdicts(args.world_size, upstream)
    kind = lambda verdict: (verdict or "missing").split(":")[0]  # noqa: E731
    differ = sorted(name for name in set(expected) | set(ours["verdicts"])
                    if kind(expected.get(name)) != kind(ours["verdicts"].get(name)))

    print(f"torch {torch.__version__}, gloo, world size {args.world_size}")
    print(f"{'run':<34} {'wall s':>8} {'per test s':>11} {'per passing s':>14}  verdicts")
    rows = [("upstream's suite, upstream harness", upstream),
            ("upstream's suite, distspawn", ours)]
    for label, cost in rows:
        if cost is not None:
            print(f"{label:<34} {cost['wall_s']:8.1f} {cost['per_test_s']:11.3f} "
                  f"{cost['per_passing_test_s'] or 0:14.3f}  {cost['counts']}")
    for suite, cost in tiers.items():
        label = f"{suite} test, distspawn (forkserver)"
        if "error" in cost:
            print(f"{label:<34} error: {cost['error']}")
        else:
            print(f"{label:<34} {'':>8} {cost['per_test_s']:11.3f} {'':>14}  "
                  f"first test {cost['first_s']:.2f} s")
    print(f"verdicts against {source}: "
          + (f"{len(differ)} differ: {', '.join(differ[:10])}" if differ else
             ("none differ" if expected else "not compared")))
    if args.save:
        figures = {"torch": torch.__version__, "world_size": args.world_size,
                   "suite": {k: v for k, v in ours.items() if k != "verdicts"},
                   "upstream_suite": ({k: v for k, v in upstream.items() if k != "verdicts"}
                                      if upstream else None),
                   "tiers": tiers, "verdicts_compared_with": source, "differ": differ}
        args.save.write_text(json.dumps(figures, indent=1) + "\n")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
