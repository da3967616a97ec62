"""Per-test time and peak memory of every way to run distributed tests, side by side.

Runs the same suites through upstream's harness (when ``torch.testing._internal``
imports here) and through each distspawn tier, every combination in its own fresh
interpreter, and prints seconds per test, peak RSS per rank and the ratio to
upstream's spawn-per-test harness at the same world size.

    python benchmarks/tiers.py --pytest             # as users run: under pytest
    python benchmarks/tiers.py --pytest --world-sizes 4 --suites ddp --tiers upstream-spawn,forkserver
    python benchmarks/tiers.py                      # a bare unittest loop instead

Suites: ``trivial`` (one gloo all_reduce), ``ddp`` (a small DDP training step)
and ``dtensor`` (a DTensorTestBase test sharding and redistributing a tensor on
a 1-D mesh; tiers upstream-spawn and forkserver).
Tiers: upstream-spawn, upstream-threads, spawn, forkserver, fork, reused, threads.

With ``--pytest`` each configuration is one pytest run of this file with
``--tests`` copies of the test (fewer for the spawn tiers, which take seconds
each); pytest's per-test times give the first test (server start, first
imports) and the median of the rest. Without it, a unittest loop runs one
warm-up test and then the timed ones, and prints their mean.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest

TIERS = ("upstream-spawn", "upstream-threads", "spawn", "forkserver", "fork", "reused",
         "threads")
SUITES = ("trivial", "ddp", "dtensor")
DTENSOR_TIERS = ("upstream-spawn", "forkserver")
SLOW_TIERS = ("upstream-spawn", "spawn")

_TIER = os.environ.get("DISTSPAWN_BENCH_TIER")
_SUITE = os.environ.get("DISTSPAWN_BENCH_SUITE", "trivial")
_WORLD = int(os.environ.get("DISTSPAWN_BENCH_WS", "2"))
_RSS_DIR = os.environ.get("DISTSPAWN_BENCH_RSS_DIR")
_COPIES = int(os.environ.get("DISTSPAWN_BENCH_COPIES", "1"))  # test methods, under pytest


def _record_rss(rank: int) -> None:
    if _RSS_DIR:
        peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        with open(os.path.join(_RSS_DIR, f"{os.getpid()}-{rank}"), "w") as f:
            f.write(str(peak_kb))


def _body(rank: int, world_size: int) -> None:
    import torch
    import torch.distributed as dist

    if _SUITE == "trivial":
        t = torch.ones(2)
        dist.all_reduce(t)
        assert t[0].item() == world_size
    elif _SUITE == "dtensor":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Replicate, Shard, distribute_tensor

        mesh = init_device_mesh("cpu", (world_size,))
        full = torch.arange(8 * world_size, dtype=torch.float32).reshape(-1, 2)
        sharded = distribute_tensor(full, mesh, [Shard(0)])
        assert torch.equal(sharded.redistribute(mesh, [Replicate()]).to_local(), full)
    else:
        from torch.nn.parallel import DistributedDataParallel as DDP

        torch.manual_seed(0)
        model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                        torch.nn.Linear(32, 4)))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            optimizer.zero_grad()
            model(torch.randn(8, 16)).sum().backward()
            optimizer.step()
    _record_rss(rank)


def _build_case():
    """The test class for this interpreter's tier (rank processes import it too)."""
    if _TIER is None:
        return None
    import torch.distributed as dist

    if _SUITE == "dtensor":
        return _build_dtensor_case()
    if _TIER.startswith("upstream"):
        from torch.testing._internal import common_distributed as harness
    else:
        import distspawn as harness

    def init(self):
        dist.init_process_group("gloo", rank=self.rank, world_size=self.world_size,
                                init_method=f"file://{self.file_name}")

    if _TIER in ("upstream-threads", "threads"):
        class Case(harness.MultiThreadedTestCase):
            world_size = property(lambda self: _WORLD)

            def setUp(self):
                super().setUp()
                self._spawn_threads()

            def test_body(self):
                _body(self.rank, self.world_size)
    elif _TIER == "reused":
        class Case(harness.MultiProcContinuousTest):
            world_size = _WORLD

            @classmethod
            def backend_str(cls):
                return "gloo"

            def test_body(self):
                _body(self.rank, self.world_size)
    else:
        class Case(harness.MultiProcessTestCase):
            world_size = property(lambda self: _WORLD)
            if not _TIER.startswith("upstream"):
                start_method = _TIER

            def setUp(self):
                super().setUp()
                self._spawn_processes()

            def test_body(self):
                init(self)
                try:
                    _body(self.rank, self.world_size)
                finally:
                    dist.destroy_process_group()
    return _named(Case)


def _build_dtensor_case():
    if _TIER.startswith("upstream"):
        from torch.testing._internal.distributed._tensor import common_dtensor as bases
    else:
        from distspawn import dtensor as bases

    class Case(bases.DTensorTestBase):
        @property
        def world_size(self):
            return _WORLD

        @bases.with_comms
        def test_body(self):
            _body(self.rank, self.world_size)
    return _named(Case)


def _named(case):
    # Rank processes find the class by name: make it a plain module-level one,
    # with --tests copies of the test for a pytest run.
    case.__name__ = case.__qualname__ = "Case"
    for copy in range(1, _COPIES):
        setattr(case, f"test_body_{copy:03d}", case.test_body)
    return case


Case = _build_case()


def _child(tests: int) -> dict:
    """In this interpreter: one warm-up test, then ``tests`` timed ones."""
    import warnings

    warnings.simplefilter("ignore")
    rss_dir = _RSS_DIR
    result = unittest.TestResult()
    if Case is not None and hasattr(Case, "setUpClass"):
        Case.setUpClass()
    try:
        Case("test_body").run(result)
        for name in os.listdir(rss_dir):
            os.remove(os.path.join(rss_dir, name))
        started = time.perf_counter()
        for _ in range(tests):
            Case("test_body").run(result)
        elapsed = time.perf_counter() - started
    finally:
        Case.tearDownClass()
    problems = result.failures + result.errors
    if problems:
        return {"error": problems[0][1][-400:]}
    if result.skipped:
        return {"error": f"skipped: {result.skipped[0][1]}"}
    peaks = [int(open(os.path.join(rss_dir, n)).read()) for n in os.listdir(rss_dir)]
    return {"per_test_s": elapsed / tests, "peak_rss_mb": max(peaks) / 1024 if peaks else None}


def _run_config(tier: str, suite: str, world_size: int, tests: int) -> dict:
    with tempfile.TemporaryDirectory() as rss_dir:
        env = dict(os.environ, DISTSPAWN_BENCH_TIER=tier, DISTSPAWN_BENCH_SUITE=suite,
                   DISTSPAWN_BENCH_WS=str(world_size), DISTSPAWN_BENCH_RSS_DIR=rss_dir)
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child",
                              "--tests", str(tests)], env=env, capture_output=True,
                             text=True, check=False)
    for line in reversed(out.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    tail = (out.stderr or out.stdout).strip().splitlines()[-1:] or ["no output"]
    return {"error": f"exit {out.returncode}: {tail[0][:200]}"}


def _test_file(tier: str, tmp: str) -> str:
    """The file pytest runs: this one, or for threads a file that reads as threads-only.

    distspawn's plugin starts the rank server early for a file whose text
    names a multi-process class, as this one does; a user's threaded test file
    does not, so the threads tiers run from a file that only imports the class.
    """
    if tier not in ("threads", "upstream-threads"):
        return os.path.abspath(__file__)
    path = os.path.join(tmp, "test_threads_only.py")
    with open(path, "w") as f:
        f.write("# A test file with rank threads only (distspawn's MultiThreadedTestCase,\n"
                "# or upstream's), the class built by benchmarks/tiers.py.\n"
                f"import sys\nsys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})\n"
                "from tiers import Case  # noqa: E402,F401\n")
    return path


def _run_under_pytest(tier: str, suite: str, world_size: int, tests: int) -> dict:
    """One pytest run of this file with ``tests`` copies of the test, as users run."""
    import statistics
    import xml.etree.ElementTree as ElementTree

    with tempfile.TemporaryDirectory() as tmp:
        rss_dir = os.path.join(tmp, "rss")
        os.mkdir(rss_dir)
        junit = os.path.join(tmp, "junit.xml")
        durations = os.path.join(tmp, "durations.json")
        env = dict(os.environ, DISTSPAWN_BENCH_TIER=tier, DISTSPAWN_BENCH_SUITE=suite,
                   DISTSPAWN_BENCH_WS=str(world_size), DISTSPAWN_BENCH_RSS_DIR=rss_dir,
                   DISTSPAWN_BENCH_COPIES=str(tests), DISTSPAWN_BENCH_DURATIONS=durations)
        out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                              "-p", "pytest_durations", "-W", "ignore",
                              f"--junitxml={junit}", _test_file(tier, tmp)],
                             env=env, capture_output=True, text=True, check=False,
                             cwd=os.path.dirname(os.path.abspath(__file__)))
        if not os.path.exists(junit):
            tail = (out.stdout + out.stderr).strip().splitlines()[-1:] or ["no output"]
            return {"error": f"exit {out.returncode}: {tail[0][:200]}"}
        cases = list(ElementTree.parse(junit).getroot().iter("testcase"))
        for case in cases:
            for outcome in ("failure", "error", "skipped"):
                found = case.find(outcome)
                if found is not None:
                    # The whole report (a hung rank's stack, say) goes below the row.
                    first_line = (found.get("message") or "").strip().split("\n")[0]
                    return {"error": f"{outcome}: {first_line[:200]}",
                            "detail": found.text or ""}
        peaks = [int(open(os.path.join(rss_dir, n)).read()) for n in os.listdir(rss_dir)]
        with open(durations) as f:
            times = list(json.load(f).values())  # in run order, unrounded
    if len(times) < 2:
        return {"error": f"{len(times)} tests ran"}
    return {"first_s": times[0], "per_test_s": statistics.median(times[1:]),
            "peak_rss_mb": max(peaks) / 1024 if peaks else None}


def _ratio_text(tier: str, seconds: float, references: dict[str, float]) -> str:
    """How many times faster than upstream: threads against upstream's threads
    (same kind of test), every process tier against upstream's spawn."""
    if tier.startswith("upstream"):
        return "-"
    reference = references.get("upstream-threads" if tier == "threads" else "upstream-spawn")
    if not reference:
        return "-"
    ratio = reference / seconds
    return f"{ratio:.2f}x (threads)" if tier == "threads" else f"{ratio:.0f}x faster"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiers", default=",".join(TIERS),
                        help=f"comma-separated, from: {', '.join(TIERS)}")
    parser.add_argument("--suites", default=",".join(SUITES),
                        help=f"comma-separated, from: {', '.join(SUITES)}")
    parser.add_argument("--world-sizes", default="2,4", help="comma-separated (default 2,4)")
    parser.add_argument("--tests", type=int, default=30,
                        help="timed tests per fast configuration (default 30)")
    parser.add_argument("--slow-tests", type=int, default=3,
                        help="timed tests per spawn configuration (default 3)")
    parser.add_argument("--pytest", action="store_true",
                        help="run each configuration under pytest, as users run tests")
    parser.add_argument("--save", help="write every measured row as JSON to this file")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print("RESULT " + json.dumps(_child(args.tests)))
        return 0

    def choices(text, allowed, what):
        values = [v.strip() for v in text.split(",") if v.strip()]
        bad = [v for v in values if v not in allowed]
        if bad:
            parser.error(f"--{what}: unknown {', '.join(bad)}; choose from {', '.join(allowed)}")
        return values

    tiers = choices(args.tiers, TIERS, "tiers")
    suites = choices(args.suites, SUITES, "suites")
    try:
        world_sizes = [int(v) for v in args.world_sizes.split(",")]
    except ValueError:
        parser.error(f"--world-sizes: expected integers like 2,4, got {args.world_sizes!r}")

    steady = "median s" if args.pytest else "s/test"
    print(f"{'suite':<8} {'ws':>2}  {'tier':<17} {'first s':>8} {steady:>9} "
          f"{'peak RSS/rank':>14} {'vs upstream':>18}")
    failed = False
    rows: list[dict] = []
    for suite in suites:
        for world_size in world_sizes:
            references: dict[str, float] = {}
            for tier in tiers:
                if suite == "dtensor" and tier not in DTENSOR_TIERS:
                    continue
                tests = args.slow_tests if tier in SLOW_TIERS else args.tests
                if args.pytest:
                    result = _run_under_pytest(tier, suite, world_size, max(tests, 2))
                else:
                    result = _run_config(tier, suite, world_size, tests)
                if "error" in result:
                    failed = failed or not tier.startswith("upstream")
                    print(f"{suite:<8} {world_size:>2}  {tier:<17} not measured: "
                          f"{result['error']}")
                    if result.get("detail"):
                        print(textwrap.indent(result["detail"].rstrip(), "    | "))
                    continue
                seconds = result["per_test_s"]
                if tier.startswith("upstream"):
                    references[tier] = seconds
                rss = result["peak_rss_mb"]
                rss_text = "-" if rss is None else f"{rss:.0f} MB"
                if tier in ("threads", "upstream-threads"):
                    rss_text += " (all)"
                ratio = _ratio_text(tier, seconds, references)
                rows.append({"suite": suite, "world_size": world_size, "tier": tier,
                             "first_s": result.get("first_s"), "per_test_s": seconds,
                             "peak_rss_mb": rss})
                first = f"{result['first_s']:.2f}s" if "first_s" in result else "-"
                print(f"{suite:<8} {world_size:>2}  {tier:<17} {first:>8} {seconds:>8.4f}s "
                      f"{rss_text:>14} {ratio:>18}", flush=True)
    if args.save:
        from measured_on import measured_on

        saved = {"measured_on": measured_on(), "under_pytest": args.pytest, "rows": rows}
        with open(args.save, "w") as f:
            json.dump(saved, f, indent=1)
            f.write("\n")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
