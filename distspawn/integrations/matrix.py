"""``python -m distspawn``: run test files across a matrix of backends and world sizes.

Each cell (one backend, one world size) is one pytest run in a subprocess with
``BACKEND``, ``WORLD_SIZE`` and a fresh ``TEMP_DIR`` set, so suites written for
``TestDistBackend`` / ``DistributedTest`` need no setup by hand. A backend this
torch cannot run is reported as skipped with the reason, never as a failure.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

__all__ = ["main"]

EXAMPLE = """examples:
  python -m distspawn test/test_distributed_spawn.py --backend gloo --world-size 2,3,4
  python -m distspawn tests/ --backend gloo,nccl --world-size 2 --junit-xml matrix.xml
  python -m distspawn tests/ -k all_reduce -- -x        (after --: passed to pytest)

exit status: 0 when nothing failed, 1 when a test failed or errored, 2 on bad usage.
"""


@dataclass
class Cell:
    backend: str
    world_size: int
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    seconds: float = 0.0
    skip_reason: str | None = None
    problem: str | None = None  # the run itself broke (no report)
    suites: list = field(default_factory=list)  # JUnit <testsuite> elements
    failures: list = field(default_factory=list)  # (node id, first line of the failure)

    @property
    def label(self) -> str:
        return f"{self.backend} ws={self.world_size}"

    def summary(self) -> str:
        if self.skip_reason is not None:
            return f"skipped: {self.skip_reason}"
        if self.problem is not None:
            return f"ERROR: {self.problem}"
        return f"{self.passed}/{self.failed}/{self.skipped} {self.seconds:.1f}s"


def backend_unavailable(backend: str) -> str | None:
    """Why ``backend`` cannot run here, or None if it can (or is not ours to judge)."""
    import torch
    import torch.distributed as dist

    if not dist.is_available():
        return "this torch has no torch.distributed"
    from ..cases.dist_backend import BUILTIN_BACKENDS, backend_is_available
    from ..fixtures.device_probe import cuda_available

    # A name that is not built in may be a plugin the test files register.
    if backend in BUILTIN_BACKENDS and not backend_is_available(backend):
        return f"{backend} is not built into this torch ({torch.__version__})"
    if backend == "nccl" and not cuda_available():
        return "nccl needs CUDA, and no CUDA device is visible"
    return None


def _comma_list(text: str, what: str, parser: argparse.ArgumentParser) -> list[str]:
    values = [v.strip() for v in text.split(",") if v.strip()]
    if not values:
        parser.error(f"{what}: give at least one value, e.g. {what} gloo")
    return values


def torch_version() -> str:
    import torch

    return torch.__version__


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m distspawn",
        description="Run distributed test files once per backend and world size, with "
                    "BACKEND, WORLD_SIZE and TEMP_DIR set for each run, and summarise.",
        epilog=EXAMPLE, formatter_class=argparse.RawDescriptionHelpFormatter)
    from .. import __version__

    parser.add_argument("--version", action="version", version=(
        f"distspawn {__version__} (torch {torch_version()}, Python {sys.version.split()[0]})"))
    parser.add_argument("paths", nargs="+",
                        help="test files or directories, as pytest takes them")
    parser.add_argument("--backend", default="gloo",
                        help="comma-separated backends, e.g. gloo,nccl (default: gloo)")
    parser.add_argument("--world-size", default="2",
                        help="comma-separated world sizes, e.g. 2,3,4 (default: 2)")
    parser.add_argument("--junit-xml", metavar="FILE",
                        help="write every cell's results to FILE as JUnit XML "
                             "(one <testsuite> per backend and world size)")
    parser.add_argument("-k", dest="keyword", metavar="EXPR",
                        help="only tests matching EXPR (pytest's -k)")
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:  # everything after -- goes to pytest untouched
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1:]
    args = parser.parse_args(argv)
    args.pytest_args = extra
    args.backends = _comma_list(args.backend, "--backend", parser)
    sizes = []
    for value in _comma_list(args.world_size, "--world-size", parser):
        if not value.isdigit() or int(value) < 1:
            parser.error(f"--world-size: {value!r} is not an integer >= 1 (e.g. --world-size 2,4)")
        sizes.append(int(value))
    args.world_sizes = sizes
    missing = [p for p in args.paths if not os.path.exists(p)]
    if missing:
        parser.error(f"no such file or directory: {', '.join(missing)}")
    return args


def run_cell(cell: Cell, args: argparse.Namespace) -> None:
    """Run pytest for one cell and fill in its counts from pytest's JUnit report."""
    temp_dir = tempfile.mkdtemp(prefix=f"distspawn-{cell.backend}-ws{cell.world_size}-")
    report = os.path.join(temp_dir, "report.xml")
    env = dict(os.environ, BACKEND=cell.backend, WORLD_SIZE=str(cell.world_size),
               TEMP_DIR=os.path.join(temp_dir, "work"))
    os.makedirs(env["TEMP_DIR"])
    # -rfE: pytest's summary lines give each failed test's node id exactly.
    command = [sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider",
               f"--junit-xml={report}", *args.paths, *args.pytest_args]
    if args.keyword:
        command += ["-k", args.keyword]
    started = time.monotonic()
    try:
        out = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        cell.seconds = time.monotonic() - started
        if not os.path.exists(report):
            tail = (out.stdout + out.stderr).strip().splitlines()[-1:] or ["no output"]
            cell.problem = f"pytest exited {out.returncode} without a report: {tail[0]}"
            return
        root = ET.parse(report).getroot()
        suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
        for suite in suites:
            suite.set("name", f"{cell.backend}.ws{cell.world_size}")
            total = int(suite.get("tests", 0))
            failed = int(suite.get("failures", 0)) + int(suite.get("errors", 0))
            skipped = int(suite.get("skipped", 0))
            cell.failed += failed
            cell.skipped += skipped
            cell.passed += total - failed - skipped
            cell.failures += failed_tests(suite, _summary_node_ids(out.stdout))
            cell.suites.append(suite)
        if out.returncode not in (0, 1, 5) and cell.failed == 0:
            cell.problem = f"pytest exited {out.returncode}"
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)


def _summary_node_ids(output: str) -> dict[tuple[str, str], str]:
    """(class, test) -> node id, from pytest's "FAILED/ERROR node-id - ..." lines."""
    found = {}
    for line in output.splitlines():
        words = line.split(" ", 2)
        if len(words) > 1 and words[0] in ("FAILED", "ERROR") and "::" in words[1]:
            parts = words[1].split("::")
            found[(parts[-2] if len(parts) > 2 else "", parts[-1])] = words[1]
    return found


def _node_id(case: ET.Element, node_ids: dict[tuple[str, str], str]) -> str:
    name = case.get("name", "?")
    classname = case.get("classname", "")
    known = node_ids.get((classname.rsplit(".", 1)[-1], name))
    if known is not None:
        return known
    return f"{classname}::{name}" if classname else name


_RANK_FAILURE = "distspawn.RankFailure:"
_ERROR_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Failure)\b.*")


def _first_line(problem: ET.Element) -> str:
    """One line that says what failed: the exception, or for a distributed test
    the verdict line and the first failing rank's exception."""
    text = problem.get("message") or problem.text or problem.tag
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return problem.tag
    if lines[0].startswith(_RANK_FAILURE) and len(lines) > 1:
        # The message may be cut short; the element's text holds the whole report.
        whole = lines[2:] + [line.strip().removeprefix("E ").strip()  # pytest's error marks
                             for line in (problem.text or "").splitlines()]
        error = next((line for line in whole if _ERROR_LINE.match(line)
                      and not line.startswith(_RANK_FAILURE)), "")
        return f"{lines[1]} {error}".strip()
    return lines[0]


def failed_tests(suite: ET.Element,
                 node_ids: dict[tuple[str, str], str]) -> list[tuple[str, str]]:
    """(node id, first line of the failure) for each failed or errored test of a suite."""
    found = []
    for case in suite.iter("testcase"):
        for problem in case:
            if problem.tag in ("failure", "error"):
                found.append((_node_id(case, node_ids), _first_line(problem)))
                break
    return found


def failure_lines(cell: Cell, indent: str = "  ") -> list[str]:
    return [f"{indent}FAILED {node} - {why}" for node, why in cell.failures]


def _skipped_suite(cell: Cell) -> ET.Element:
    suite = ET.Element("testsuite", name=f"{cell.backend}.ws{cell.world_size}",
                       tests="1", failures="0", errors="0", skipped="1", time="0")
    case = ET.SubElement(suite, "testcase", classname="distspawn.matrix",
                         name=f"{cell.backend}.ws{cell.world_size}")
    ET.SubElement(case, "skipped", message=cell.skip_reason or "")
    return suite


def write_junit(cells: list[Cell], path: str) -> None:
    root = ET.Element("testsuites")
    for cell in cells:
        if cell.skip_reason is not None:
            root.append(_skipped_suite(cell))
        root.extend(cell.suites)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)


def summary_table(cells: list[Cell], backends: list[str], sizes: list[int]) -> str:
    by_key = {(c.backend, c.world_size): c for c in cells}
    headers = ["backend"] + [f"ws={n}" for n in sizes]
    rows = [[b] + [by_key[(b, n)].summary() for n in sizes] for b in backends]
    widths = [max(len(r[i]) for r in [headers] + rows) for i in range(len(headers))]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in rows]
    lines.append("cells: passed/failed/skipped and time")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import pytest  # noqa: F401
    except ImportError:
        print("python -m distspawn runs pytest: install it with pip install 'distspawn[test]'",
              file=sys.stderr)
        return 2
    cells = [Cell(b, n) for b in args.backends for n in args.world_sizes]
    for index, cell in enumerate(cells, 1):
        print(f"[{index}/{len(cells)}] {cell.label} ...", end=" ", flush=True)
        cell.skip_reason = backend_unavailable(cell.backend)
        if cell.skip_reason is None:
            run_cell(cell, args)
        print(cell.summary(), flush=True)
        for line in failure_lines(cell):
            print(line, flush=True)
    print()
    print(summary_table(cells, args.backends, args.world_sizes))
    failing = [c for c in cells if c.failures]
    if failing:
        print()
        print(f"failed ({sum(len(c.failures) for c in failing)}):")
        for cell in failing:
            print(f"{cell.label}:")
            print("\n".join(failure_lines(cell)))
    if args.junit_xml:
        write_junit(cells, args.junit_xml)
        print(f"JUnit XML: {args.junit_xml}")
    return 1 if any(c.failed or c.problem for c in cells) else 0
