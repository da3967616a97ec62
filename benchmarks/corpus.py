"""Real projects' test files, run on upstream's harness and on distspawn, side by side.

Each file of the corpus (``benchmarks/corpus.json``: project, repository,
commit, path) is run under pytest three ways, one file at a time (or, with
``--together``, each project's files in one session, as a project's suite is
run: the interpreter, torch and distspawn's rank server start once per
session, not once per file):
- ``upstream``: as written, on the harness inside the installed torch;
- ``stand-in``: as written, with ``--distspawn-stand-in``;
- ``switched``: a copy beside it with only its imports switched to
  distspawn's, as README's migration table says (``switch_imports`` below).
It prints one table, file by file: tests counted, verdicts the same, better
(upstream skips, distspawn passes), differing, wall time per harness, and
how many files and folders each run left in the temp folder (new entries
there after the run; pytest's ``pytest-of-*`` folders and inductor's caches
are not counted; nothing else should run meanwhile).
A test that fails on every harness (a file newer than the torch installed, a
missing optional package) is left out of the counts, and listed.

The files are not ours, so they are never committed: fetch each project at its
commit into one folder per project (``--corpus DIR``: ``DIR/torchtitan``,
``DIR/pytorch``, ...). pytorch's files come one by one (its repository is too
big to fetch whole); an entry whose commit the code-search index could not name
has ``"commit": null`` and its ``index_id`` there instead. An entry with a
``sha256`` is checked against it before anything runs. Then

    python benchmarks/corpus.py --corpus /tmp/corpus
    python benchmarks/corpus.py --corpus /tmp/corpus --only torchtitan --harnesses stand-in
    python benchmarks/corpus.py --corpus /tmp/corpus --save corpus-verdicts.json
    python benchmarks/corpus.py --corpus /tmp/corpus --together
    python benchmarks/corpus.py --corpus /tmp/corpus --floor
    python benchmarks/corpus.py --corpus /tmp/corpus --together --workers 2

``--floor`` also times each session's ``pytest --collect-only`` (no harness):
the interpreter, torch, the project's imports and collection, which every
harness pays before its first test. The time beyond it is the tests' own,
and the ratio over that is printed too. ``--workers N`` runs every session on
N pytest-xdist workers, where each worker is a test process of its own with a
rank server of its own, and runs the tests it is sent.

Needs ``torch.testing._internal`` to import (``pip install expecttest``) and
each project's own test dependencies.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measured_on import measured_on  # noqa: E402
from side_by_side import case_name, junit_cases  # noqa: E402

MANIFEST = Path(__file__).resolve().parent / "corpus.json"
HARNESSES = ("upstream", "stand-in", "switched")
# Not a harness: pytest collecting the files and running nothing (--floor).
COLLECT_ONLY = "collect-only"

# README's migration table: upstream module -> distspawn module.
SWITCHED_MODULES = {
    "torch.testing._internal.common_distributed": "distspawn.compat",
    "torch.testing._internal.distributed.multi_threaded_pg": "distspawn.multi_threaded_pg",
    "torch.testing._internal.distributed.distributed_test": "distspawn.distributed_test",
    "torch.testing._internal.distributed._tensor.common_dtensor": "distspawn.dtensor",
    "torch.testing._internal.common_fsdp": "distspawn.fsdp",
    "torch.testing._internal.distributed.fake_pg": "distspawn.fake_pg",
    "torch.testing._internal.distributed.checkpoint_utils": "distspawn.checkpoint_utils",
    "torch.testing._internal.distributed._shard.sharded_tensor": "distspawn.sharded_tensor",
    "torch.testing._internal.distributed.rpc_utils": "distspawn.rpc_utils",
}
# What distspawn takes over from common_utils (the rest stays upstream's).
SWITCHED_COMMON_UTILS = {"TestCase", "run_tests", "FILE_SCHEMA", "IS_SANDCASTLE",
                         "find_free_port", "retry_on_connect_failures"}
COMMON_UTILS = "torch.testing._internal.common_utils"


def _provided(module: str, name: str) -> bool:
    # README: names of upstream's modules that are not harness (common_dtensor's
    # DTensor op-test helpers, say) are not in distspawn's, and a file keeps
    # importing them from upstream's module.
    return name == "*" or hasattr(importlib.import_module(module), name)


def switch_imports(source: str) -> str:
    """``source`` with its imports of upstream's harness switched to distspawn's."""
    lines = source.splitlines(keepends=True)
    edits = []
    for node in ast.walk(ast.parse(source)):
        replacement = None
        if isinstance(node, ast.ImportFrom) and node.level == 0:
            if node.module in SWITCHED_MODULES:
                ours = [a for a in node.names if _provided(SWITCHED_MODULES[node.module], a.name)]
                theirs = [a for a in node.names if a not in ours]
                replacement = ([(SWITCHED_MODULES[node.module], ours)] if ours else []) + (
                    [(node.module, theirs)] if theirs else [])
            elif node.module == COMMON_UTILS:
                ours = [a for a in node.names if a.name in SWITCHED_COMMON_UTILS]
                theirs = [a for a in node.names if a.name not in SWITCHED_COMMON_UTILS]
                if ours:
                    replacement = [("distspawn", ours)] + ([(COMMON_UTILS, theirs)] if theirs
                                                           else [])
        elif isinstance(node, ast.Import) and all(a.asname for a in node.names
                                                  if a.name in SWITCHED_MODULES):
            if any(a.name in SWITCHED_MODULES for a in node.names):
                text = ", ".join(f"{SWITCHED_MODULES.get(a.name, a.name)} as {a.asname}"
                                 if a.asname else a.name for a in node.names)
                edits.append((node, f"import {text}"))
                continue
        if replacement:
            edits.append((node, "; ".join(
                f"from {module} import "
                + ", ".join(f"{a.name} as {a.asname}" if a.asname else a.name for a in names)
                for module, names in replacement)))
    for node, text in sorted(edits, key=lambda e: e[0].lineno, reverse=True):
        first, last = node.lineno - 1, node.end_lineno - 1
        indent = lines[first][: len(lines[first]) - len(lines[first].lstrip())]
        lines[first: last + 1] = [f"{indent}{text}\n"]
    return "".join(lines)


@dataclass(frozen=True)
class Entry:
    project: str
    repository: str
    commit: str | None
    path: str
    pythonpath: tuple[str, ...] = (".",)
    sha256: str | None = None


def load_manifest(path: Path) -> list[Entry]:
    """The corpus files listed in ``path``."""
    data = json.loads(path.read_text())
    return [Entry(e["project"], e["repository"], e["commit"], e["path"],
                  tuple(e.get("pythonpath", ["."])), e.get("sha256")) for e in data["files"]]


def content_mismatches(entries: list[Entry], corpus: Path) -> list[str]:
    """Entries whose file in ``corpus`` is not the version the manifest pins."""
    wrong = []
    for entry in entries:
        if entry.sha256 is None:
            continue
        found = hashlib.sha256((corpus / entry.project / entry.path).read_bytes()).hexdigest()
        if found != entry.sha256:
            wrong.append(f"{entry.project}/{entry.path} (sha256 {found[:12]}..., "
                         f"expected {entry.sha256[:12]}...)")
    return wrong


@dataclass
class Run:
    """Files run together, in one pytest session, on one harness."""

    verdicts: dict[str, dict[str, str]]  # file path -> "Class.test" -> verdict
    seconds: float
    left_behind: list[str]  # new entries in the temp folder after the run
    # file path -> "Class.test" -> seconds, as JUnit reports them
    test_seconds: dict[str, dict[str, float]] = field(default_factory=dict)


def run_files(entries: list[Entry], root: Path, harness: str, timeout: float,
              workers: int = 0) -> Run:
    """Run ``entries`` (files of one project) in one pytest session on one
    harness; read back each file's verdicts and what the run left in the temp
    folder. ``workers``: pytest-xdist workers (``-n``; 0: none)."""
    targets = {entry.path: root / entry.path for entry in entries}
    switched = []
    if harness == "switched":
        for path, target in targets.items():
            copy = target.with_name(target.stem + "__distspawn.py")
            copy.write_text(switch_imports(target.read_text()))
            switched.append(copy)
            targets[path] = copy
    pythonpath = list(dict.fromkeys(str(root / p) for e in entries for p in e.pythonpath))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        pythonpath + [os.environ.get("PYTHONPATH", "")])}
    env.pop("DISTSPAWN_STAND_IN", None)
    env.pop("CI", None)  # upstream's run_tests writes XML reports under CI

    def every_file(verdict: str) -> dict[str, dict[str, str]]:
        return {path: {"(whole file)": verdict} for path in targets}

    try:
        with tempfile.TemporaryDirectory(prefix="distspawn-corpus-") as tmp:
            junit = Path(tmp) / "junit.xml"
            # What the run leaves in the temp folder: new top-level entries there.
            # (A TMPDIR of its own per run would be cleaner, but inductor keeps
            # caches under it, and every run would then compile from cold.)
            before = _temp_entries()
            command = pytest_command(list(targets.values()), junit, harness, workers)
            started = time.monotonic()
            try:
                subprocess.run(command, env=env, cwd=root, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, timeout=timeout, check=False)
            except subprocess.TimeoutExpired:
                return Run(every_file(f"timeout after {timeout:.0f} s"), timeout,
                           sorted(_temp_entries() - before))
            elapsed = time.monotonic() - started
            left = sorted(_temp_entries() - before)
            if not junit.exists():
                return Run(every_file("fail: pytest wrote no report"), elapsed, left)
            verdicts, test_seconds = _verdicts_by_file(junit, targets, root)
            return Run(verdicts, elapsed, left, test_seconds)
    finally:
        for copy in switched:
            copy.unlink(missing_ok=True)


def pytest_command(files: list[Path], junit: Path, harness: str, workers: int = 0) -> list[str]:
    """The pytest command that runs ``files`` on ``harness``, its report in ``junit``."""
    # A file that fails to collect (one newer than the torch installed) would
    # otherwise stop the whole session before any test runs. Every harness
    # runs the tests in file order: pytest-randomly, where installed, would
    # give each session an order of its own (by node id, so the switched
    # copies' names would reorder them even under one seed), and a verdict
    # that follows from the order (upstream's reused ranks skip the rest of a
    # class after a failure) would then differ by run, not by harness.
    command = [sys.executable, "-m", "pytest", *map(str, files), "-q",
               "-p", "no:cacheprovider", "-p", "no:randomly",
               "--continue-on-collection-errors", f"--junitxml={junit}"]
    if workers and harness != COLLECT_ONLY:
        command += ["-n", str(workers)]
    if harness == "stand-in":
        command.append("--distspawn-stand-in")
    elif harness == COLLECT_ONLY:
        command.append("--collect-only")
    return command


def _verdicts_by_file(junit: Path, targets: dict[str, Path], root: Path
                      ) -> tuple[dict[str, dict[str, str]], dict[str, dict[str, float]]]:
    # JUnit names a test's class by its node id: the file's path from pytest's
    # rootdir, dotted, then its classes. The rootdir may be below ``root``,
    # so the longest dotted tail of a file's path that starts the class name
    # picks its file.
    dotted = {path: target.relative_to(root).with_suffix("").as_posix().split("/")
              for path, target in targets.items()}
    verdicts: dict[str, dict[str, str]] = {path: {} for path in targets}
    seconds: dict[str, dict[str, float]] = {path: {} for path in targets}
    for classname, test, verdict, took in junit_cases(junit):
        full = f"{classname}.{test}" if classname else test
        owner, matched = None, 0
        for path, parts in dotted.items():
            for start in range(len(parts)):
                tail = ".".join(parts[start:])
                if (full == tail or full.startswith(tail + ".")) and len(parts) - start > matched:
                    owner, matched = path, len(parts) - start
        # The switched copy's module name shows in names of collection errors.
        name = case_name(classname, test).replace("__distspawn", "")
        for path in [owner] if owner else targets:  # a conftest's error: every file's
            verdicts[path][name] = verdict
            seconds[path][name] = took
    return verdicts, seconds


def run_file(entry: Entry, root: Path, harness: str, timeout: float) -> Run:
    """Run one file by itself on one harness."""
    return run_files([entry], root, harness, timeout)


def sessions(entries: list[Entry], together: bool) -> list[list[Entry]]:
    """The files each pytest session runs: one file each, or (``together``)
    each project's files in as few sessions as pytest can import them in.
    pytest's default import mode imports a file by its name, so two files of
    one name go to different sessions."""
    if not together:
        return [[entry] for entry in entries]
    groups: list[list[Entry]] = []
    for entry in entries:
        name = Path(entry.path).name
        for group in groups:
            if group[0].project == entry.project and all(
                    Path(other.path).name != name for other in group):
                group.append(entry)
                break
        else:
            groups.append([entry])
    return groups


def _temp_entries() -> set[str]:
    # Caches meant to outlive a run (inductor's) and pytest's own tmp_path
    # folders (kept on purpose) are not counted.
    return {name for name in os.listdir(tempfile.gettempdir())
            if not name.startswith(("pytest-of-", "torchinductor_"))}


def kind(verdict: str | None) -> str:
    """pass / fail / skip / missing: what is compared (skip reasons may differ)."""
    if verdict is None:
        return "missing"
    return verdict.split(":")[0].split(" ")[0]


def compare(upstream: dict[str, str], ours: dict[str, str],
            everywhere_failing: set[str]) -> dict[str, list[str]]:
    """Tests by outcome: same, better (upstream skips, ours passes), differ."""
    outcome: dict[str, list[str]] = {"same": [], "better": [], "differ": []}
    for name in sorted(set(upstream) | set(ours)):
        if name in everywhere_failing:
            continue
        theirs_kind, ours_kind = kind(upstream.get(name)), kind(ours.get(name))
        if theirs_kind == ours_kind:
            outcome["same"].append(name)
        elif theirs_kind == "skip" and ours_kind == "pass":
            outcome["better"].append(name)
        else:
            outcome["differ"].append(name)
    return outcome


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, required=True,
                        help="folder with one checkout per project, at the listed commits")
    parser.add_argument("--manifest", type=Path, default=MANIFEST)
    parser.add_argument("--harnesses", default=",".join(HARNESSES),
                        help=f"comma-separated, from {', '.join(HARNESSES)} (default: all)")
    parser.add_argument("--only", default=None,
                        help="run only these projects' files (comma-separated names)")
    parser.add_argument("--timeout", type=float, default=1800,
                        help="seconds allowed for one session (a file, or a project's "
                             "files with --together) on one harness")
    parser.add_argument("--save", type=Path, help="write every verdict to this JSON file")
    parser.add_argument("--floor", action="store_true",
                        help="also time each session's pytest --collect-only, and give "
                             "the ratio over the time beyond it")
    parser.add_argument("--together", action="store_true",
                        help="run each project's files in one pytest session per harness, "
                             "as a project's suite is run, instead of one file at a time")
    parser.add_argument("--workers", type=int, default=0, metavar="N",
                        help="run each session on N pytest-xdist workers (-n N), as many CI "
                             "jobs run their suites; needs pytest-xdist")
    args = parser.parse_args(argv)
    if args.workers < 0:
        parser.error(f"--workers {args.workers}: expected 0 (no xdist) or a number of workers")
    harnesses = args.harnesses.split(",")
    unknown = sorted(set(harnesses) - set(HARNESSES))
    if unknown:
        parser.error(f"--harnesses: unknown {unknown}; expected some of {list(HARNESSES)}")
    only = None if args.only is None else set(args.only.split(","))
    entries = [e for e in load_manifest(args.manifest) if only is None or e.project in only]
    if only and not entries:
        parser.error(f"--only {args.only}: no such project in {args.manifest}")
    missing = [f"{e.project}/{e.path}" for e in entries
               if not (args.corpus / e.project / e.path).is_file()]
    if missing:
        parser.error(f"--corpus {args.corpus}: not found there: {', '.join(missing[:5])} "
                     "(fetch each project at its listed commit into a folder named after it)")
    wrong = content_mismatches(entries, args.corpus)
    if wrong:
        parser.error(f"--corpus {args.corpus}: not the listed version: {', '.join(wrong)}")

    results: dict[str, dict] = {}
    totals = {h: 0.0 for h in harnesses}
    left_totals = {h: 0 for h in harnesses}
    # Seconds spent in the tests that fail on every harness: they are not
    # counted in the verdicts, and some (a training run in a subprocess of its
    # own) take as long on every harness.
    uncounted = {h: 0.0 for h in harnesses}
    floor = 0.0  # seconds of the collect-only runs (--floor)
    header = ["files" if args.together else "file", "tests", *[f"{h} s" for h in harnesses],
              *(["collect-only s"] if args.floor else [])] + [
        f"{h}: same/better/differ" for h in harnesses if h != "upstream"] + [
        "left in the temp folder (" + "/".join(harnesses) + ")"]
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header), flush=True)
    for session, group in enumerate(sessions(entries, args.together)):
        root = args.corpus / group[0].project
        runs = {h: run_files(group, root, h, args.timeout, args.workers) for h in harnesses}
        collect = run_files(group, root, COLLECT_ONLY, args.timeout) if args.floor else None
        floor += collect.seconds if collect else 0.0
        for harness, run in runs.items():
            totals[harness] += run.seconds
            left_totals[harness] += len(run.left_behind)
        counted, cells = 0, {h: [0, 0, 0] for h in harnesses if h != "upstream"}
        for entry in group:
            verdicts = {h: run.verdicts[entry.path] for h, run in runs.items()}
            failing = set.intersection(*[{n for n, v in found.items()
                                          if kind(v) not in ("pass", "skip")}
                                         for found in verdicts.values()])
            for harness, run in runs.items():
                uncounted[harness] += sum(run.test_seconds.get(entry.path, {}).get(name, 0.0)
                                          for name in failing)
            row_results = {"runs": {h: {"verdicts": verdicts[h], "seconds": run.seconds,
                                        "test_seconds": run.test_seconds.get(entry.path, {}),
                                        "left_behind": run.left_behind}
                                    for h, run in runs.items()},
                           "session": session, "session_files": len(group),
                           **({"collect_only_seconds": collect.seconds} if collect else {}),
                           "failing_everywhere": sorted(failing)}
            if "upstream" in runs:
                for harness in cells:
                    outcome = compare(verdicts["upstream"], verdicts[harness], failing)
                    row_results[harness] = outcome
                    for i, key in enumerate(("same", "better", "differ")):
                        cells[harness][i] += len(outcome[key])
            counted += len(set().union(*verdicts.values()) - failing)
            results[f"{entry.project}/{entry.path}"] = row_results
        label = (f"{group[0].project}/{group[0].path}" if len(group) == 1
                 else f"{group[0].project}: {len(group)} files in one session")
        print(f"| {label} | {counted} | "
              + " | ".join(f"{runs[h].seconds:.1f}" for h in harnesses)
              + (f" | {collect.seconds:.1f}" if collect else "")
              + ("".join(f" | {'/'.join(map(str, c))}" for c in cells.values())
                 if "upstream" in runs else "")
              + " | " + "/".join(str(len(runs[h].left_behind)) for h in harnesses) + " |",
              flush=True)
    print("\ntotal seconds: " + ", ".join(f"{h} {s:.0f}" for h, s in totals.items()))
    print("left in the temp folder after the run (files and folders): "
          + ", ".join(f"{h} {n}" for h, n in left_totals.items()))
    if "upstream" in totals:
        for harness in harnesses:
            if harness != "upstream":
                print(f"{harness}: {totals['upstream'] / max(totals[harness], 1e-9):.1f}x "
                      "faster than upstream, summed over "
                      + ("sessions" if args.together else "files"))
        print("in the tests that fail on every harness (not counted): "
              + ", ".join(f"{h} {s:.0f} s" for h, s in uncounted.items()))
        for harness in harnesses:
            if harness != "upstream":
                rest = {h: totals[h] - uncounted[h] for h in ("upstream", harness)}
                print(f"{harness}: {rest['upstream'] / max(rest[harness], 1e-9):.1f}x "
                      "faster than upstream without them")
        if args.floor:
            print(f"collect-only (pytest's start, imports, collection): {floor:.0f} s")
            beyond = {h: totals[h] - floor for h in harnesses}
            for harness in harnesses:
                if harness != "upstream":
                    print(f"{harness}: {beyond['upstream'] / max(beyond[harness], 1e-9):.1f}x "
                          f"faster than upstream beyond it ({beyond['upstream']:.0f} s against "
                          f"{beyond[harness]:.0f} s)")
    for name, row in results.items():
        for harness in harnesses:
            for test in row.get(harness, {}).get("differ", []):
                print(f"DIFFER {harness} {name}::{test}: "
                      f"{row['runs'][harness]['verdicts'].get(test)!r}, upstream "
                      f"{row['runs']['upstream']['verdicts'].get(test)!r}")
        if row["failing_everywhere"]:
            print(f"failing on every harness, not counted: {name}: "
                  f"{len(row['failing_everywhere'])} tests")
    if args.save:
        saved = {"measured_on": measured_on(), "together": args.together,
                 "harnesses": harnesses, "totals": totals, "files": results}
        args.save.write_text(json.dumps(saved, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
