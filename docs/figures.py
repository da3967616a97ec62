"""Draw the documentation's figures from the benchmarks' saved results.

Each figure is made from one JSON file in ``benchmarks/results/``, written by
a benchmark's ``--save``::

    python benchmarks/corpus.py --corpus DIR --together --harnesses upstream,stand-in \\
        --only torchtitan,autoparallel,ao,pippy --save benchmarks/results/corpus-sessions.json
    python benchmarks/tiers.py --pytest --suites trivial,ddp \\
        --save benchmarks/results/tiers.json
    python benchmarks/stalls.py --deadline 20 --save benchmarks/results/stalls.json
    python docs/figures.py            # then redraw: docs/_static/figures/*.svg

Matplotlib is needed to draw (``pip install -e ".[docs]"``); reading the data
and writing the captions (what the docs' results page shows under each
figure) needs only the standard library, so the Sphinx build does that part
itself. Every SVG carries the SHA-256 of the data it was drawn from;
``test/test_figures.py`` fails when a result changed and its figure was not
redrawn.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
FIGURES = ROOT / "docs" / "_static" / "figures"

#: figure name -> the saved result it is drawn from
SOURCES = {
    "files": "corpus-sessions.json",
    "sessions": "corpus-sessions.json",
    "tiers": "tiers.json",
    "stalls": "stalls.json",
}

# The data hash goes into the SVG's <dc:description>, matplotlib's "Description".
_HASH_MARK = "distspawn-data-sha256:"


def data_hash(path: Path) -> str:
    """The SHA-256 of a saved result, as the figure drawn from it records it."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def recorded_hash(svg: Path) -> str | None:
    """The data hash a drawn figure carries (None: none found)."""
    found = re.search(_HASH_MARK + r"([0-9a-f]{64})", svg.read_text())
    return found.group(1) if found else None


def load(name: str) -> dict[str, Any]:
    return json.loads((RESULTS / SOURCES[name]).read_text())


# -- what the figures show, as plain data (no matplotlib) ---------------------

def file_times(corpus: dict[str, Any]) -> list[tuple[str, float, float]]:
    """(project, upstream s, stand-in s) per file: its counted tests' time in
    its project's session, as JUnit reports it (collection and start-up are
    the session's, not a file's; tests failing on every harness are left out)."""
    rows = []
    for name, row in sorted(corpus["files"].items()):
        runs, failing = row["runs"], set(row["failing_everywhere"])
        times = [sum(t for test, t in runs[h]["test_seconds"].items() if test not in failing)
                 for h in ("upstream", "stand-in")]
        if min(times) > 0:
            rows.append((name.split("/", 1)[0], times[0], times[1]))
    return rows


def _session_key(name: str, row: dict[str, Any]) -> tuple:
    # A project's files may need more than one session (two files of one
    # name); the files of a session share its runs, so its seconds too.
    runs = row["runs"]
    return (name.split("/", 1)[0], row.get("session"),
            *(runs[h]["seconds"] for h in sorted(runs)))


def projects(corpus: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per project: files, sessions, tests counted and failing everywhere,
    better and differing verdicts, and each harness's seconds and leftovers
    summed over its sessions."""
    found: dict[str, dict[str, Any]] = {}
    seen = set()
    for name, row in sorted(corpus["files"].items()):
        project = name.split("/", 1)[0]
        entry = found.setdefault(project, {"files": 0, "sessions": 0, "tests": 0, "failing": 0,
                                           "better": 0, "differ": 0, "seconds": {},
                                           "failing_seconds": {}, "left_behind": {}})
        failing = set(row["failing_everywhere"])
        names = set().union(*(set(r["verdicts"]) for r in row["runs"].values()))
        entry["files"] += 1
        entry["tests"] += len(names - failing)
        entry["failing"] += len(failing)
        entry["better"] += len(row.get("stand-in", {}).get("better", []))
        entry["differ"] += len(row.get("stand-in", {}).get("differ", []))
        for harness, run in row["runs"].items():
            entry["failing_seconds"][harness] = entry["failing_seconds"].get(harness, 0.0) + sum(
                t for test, t in run["test_seconds"].items() if test in failing)
        key = _session_key(name, row)
        if key in seen:
            continue
        seen.add(key)
        entry["sessions"] += 1
        for harness, run in row["runs"].items():
            entry["seconds"][harness] = entry["seconds"].get(harness, 0.0) + run["seconds"]
            entry["left_behind"][harness] = (entry["left_behind"].get(harness, 0)
                                             + len(run["left_behind"]))
    return found


def session_times(corpus: dict[str, Any]) -> list[tuple[str, int, float, float]]:
    """(project, files, upstream s, stand-in s) per project, slowest first: its
    sessions' wall time less the tests that fail on every harness."""
    rows = [(p, e["files"], *(e["seconds"][h] - e["failing_seconds"][h]
                              for h in ("upstream", "stand-in")))
            for p, e in projects(corpus).items()]
    return sorted(rows, key=lambda r: -r[2])


def corpus_summary(corpus: dict[str, Any]) -> dict[str, Any]:
    """Tests counted, verdicts differing, and seconds of a corpus run: in all,
    and less the tests that fail on every harness (counted_*)."""
    found = projects(corpus)
    totals = corpus["totals"]
    failing = {h: sum(e["failing_seconds"][h] for e in found.values()) for h in totals}
    counted = {h: totals[h] - failing[h] for h in totals}
    return {"tests": sum(e["tests"] for e in found.values()),
            "failing_tests": sum(e["failing"] for e in found.values()),
            "files": sum(e["files"] for e in found.values()),
            "differ": sum(e["differ"] for e in found.values()),
            "upstream_s": totals["upstream"], "stand_in_s": totals["stand-in"],
            "ratio": totals["upstream"] / max(totals["stand-in"], 1e-9),
            "failing_upstream_s": failing["upstream"], "failing_stand_in_s": failing["stand-in"],
            "counted_upstream_s": counted["upstream"], "counted_stand_in_s": counted["stand-in"],
            "counted_ratio": counted["upstream"] / max(counted["stand-in"], 1e-9),
            "projects": len(found)}


def session_table(corpus: dict[str, Any]) -> str:
    """A reST list-table of a --together run: one row per project, its
    sessions' seconds less the tests that fail on every harness, and those."""
    lines = [".. list-table::", "   :header-rows: 1", "",
             "   * - project", "     - tests counted", "     - upstream's harness",
             "     - stand-in mode", "     - better / differing verdicts",
             "     - failing on every harness: tests, seconds (upstream / stand-in)",
             "     - left in the temp folder (upstream / stand-in)"]
    found = projects(corpus)
    for project, _, up, ours in session_times(corpus):
        e = found[project]
        sessions = "" if e["sessions"] == 1 else f", {e['sessions']} sessions"
        lines += [f"   * - {project}, {e['files']} files{sessions}",
                  f"     - {e['tests']}",
                  f"     - {up:.1f} s", f"     - {ours:.1f} s ({up / ours:.1f}x)",
                  f"     - {e['better']} / {e['differ']}",
                  f"     - {e['failing']}, {e['failing_seconds']['upstream']:.1f} s / "
                  f"{e['failing_seconds']['stand-in']:.1f} s",
                  f"     - {e['left_behind']['upstream']} / {e['left_behind']['stand-in']}"]
    return "\n".join(lines) + "\n"


def caption(name: str) -> str:
    """The reST lines the results page shows under a figure: the command and
    the conditions of the run that made its data."""
    data = load(name)
    run = data["measured_on"]
    # where the corpus was fetched to is the measuring machine's business
    command = re.sub(r"--corpus \S+", "--corpus DIR", run["command"])
    return (f"Made by ``{command}`` on {run['date']}: torch {run['torch']}, "
            f"Python {run['python']}, {run['cpus']} CPUs, load average "
            f"{run['load_average_at_end']} at the end, distspawn {run['distspawn_commit']}. "
            f"Drawn by ``python docs/figures.py`` from "
            f"``benchmarks/results/{SOURCES[name]}``.")


def write_captions(folder: Path) -> None:
    """One ``<figure>.inc`` per figure for the results page (Sphinx build)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in SOURCES:
        (folder / f"{name}.inc").write_text(caption(name) + "\n")
    (folder / "corpus-sessions.inc").write_text(session_table(load("sessions")))
    summary = corpus_summary(load("sessions"))
    (folder / "corpus-summary.inc").write_text(
        f"{summary['projects']} projects, {summary['files']} files, each project's files as "
        f"one pytest session: {summary['tests']} tests counted, "
        f"{summary['differ'] or 'none'} with another verdict in the stand-in mode. "
        f"Upstream's harness "
        f"{summary['counted_upstream_s']:.0f} s, distspawn {summary['counted_stand_in_s']:.0f} s: "
        f"**{summary['counted_ratio']:.1f}x**. Not counted: {summary['failing_tests']} tests "
        f"that fail on every harness (they need a network, a GPU, a newer torch or a package "
        f"not installed), which took {summary['failing_upstream_s']:.0f} s and "
        f"{summary['failing_stand_in_s']:.0f} s of the sessions' "
        f"{summary['upstream_s']:.0f} s and {summary['stand_in_s']:.0f} s "
        f"({summary['ratio']:.1f}x with them).\n")


# -- drawing -----------------------------------------------------------------

PROJECT_COLOURS = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860"]
UPSTREAM, OURS, OURS_2 = "#9a9a9a", "#2f6db5", "#7fb0e0"


def draw_files(plt: Any, data: dict[str, Any]) -> Any:
    rows = file_times(data)
    projects = sorted({p for p, _, _ in rows})
    fig, ax = plt.subplots(figsize=(6, 5))
    for colour, project in zip(PROJECT_COLOURS, projects):
        xs = [u for p, u, _ in rows if p == project]
        ys = [s for p, _, s in rows if p == project]
        ax.scatter(xs, ys, s=22, color=colour, label=project)
    low = min(min(u, s) for _, u, s in rows) / 2
    high = max(max(u, s) for _, u, s in rows) * 2
    for factor, style in ((1, "-"), (10, "--")):
        ax.plot([low, high], [low / factor, high / factor], style, color="#bbbbbb", lw=1,
                zorder=0)
        ax.annotate("same time" if factor == 1 else "10x faster", (high / 1.5, high / 1.5 / factor),
                    ha="right", va="bottom", fontsize=8, color="#777777")
    ax.set(xscale="log", yscale="log", xlim=(low, high), ylim=(low, high),
           xlabel="upstream's harness, s (a file's tests)",
           ylabel="distspawn, stand-in mode, s",
           title="Each real test file, unchanged")
    ax.legend(fontsize=8, loc="upper left")
    return fig


def draw_sessions(plt: Any, data: dict[str, Any]) -> Any:
    rows = session_times(data)
    summary = corpus_summary(data)
    fig, ax = plt.subplots(figsize=(7, 0.55 * len(rows) + 1.4))
    labels = [f"{p} ({n} files)" for p, n, _, _ in rows]
    ys = range(len(rows))
    ax.barh([y + 0.2 for y in ys], [u for _, _, u, _ in rows], 0.4, color=UPSTREAM,
            label="upstream's harness")
    ax.barh([y - 0.2 for y in ys], [s for _, _, _, s in rows], 0.4, color=OURS,
            label="distspawn (stand-in mode)")
    for y, (_, _, u, s) in zip(ys, rows):
        ax.text(u, y + 0.2, f" {u:.0f} s", va="center", fontsize=8)
        ax.text(s, y - 0.2, f" {s:.0f} s  ({u / s:.1f}x)", va="center", fontsize=8)
    ax.set_yticks(list(ys), labels)
    ax.invert_yaxis()
    ax.set_xlabel("seconds, each project's files as one pytest session "
                  "(less the tests that fail on every harness)")
    ax.set_title(f"{summary['tests']} tests, {summary['differ']} with another verdict: "
                 f"{summary['counted_ratio']:.1f}x in all", fontsize=10)
    ax.set_xlim(0, max(u for _, _, u, _ in rows) * 1.25)
    ax.legend(fontsize=8, loc="lower right")
    return fig


def draw_tiers(plt: Any, data: dict[str, Any]) -> Any:
    rows = data["rows"]
    suites = list(dict.fromkeys(r["suite"] for r in rows))
    fig, axes = plt.subplots(1, len(suites), figsize=(5 * len(suites), 4), squeeze=False)
    for ax, suite in zip(axes[0], suites):
        mine = [r for r in rows if r["suite"] == suite]
        tiers = list(dict.fromkeys(r["tier"] for r in mine))
        sizes = sorted({r["world_size"] for r in mine})
        width = 0.8 / len(sizes)
        for i, size in enumerate(sizes):
            values = {r["tier"]: r["per_test_s"] for r in mine if r["world_size"] == size}
            xs = [t + (i - (len(sizes) - 1) / 2) * width for t in range(len(tiers))]
            heights = [values.get(tier, 0) for tier in tiers]
            colour = [PROJECT_COLOURS[0], PROJECT_COLOURS[1], PROJECT_COLOURS[2]][i % 3]
            ax.bar(xs, heights, width, color=colour, label=f"{size} ranks")
            for x, h in zip(xs, heights):
                if h:
                    ax.text(x, h, f"{h:.2g}", ha="center", va="bottom", fontsize=6)
        ax.set_xticks(range(len(tiers)), tiers, rotation=30, ha="right", fontsize=8)
        ax.set(yscale="log", ylabel="seconds a test (median after the first)",
               title=f"{suite} test, under pytest")
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def draw_stalls(plt: Any, data: dict[str, Any]) -> Any:
    harnesses = data["harnesses"]
    cases = list(dict.fromkeys(r["case"] for rows in harnesses.values() for r in rows))
    fig, ax = plt.subplots(figsize=(8, 0.32 * len(cases) * len(harnesses) / 2 + 1.5))
    colours = {"processes": OURS, "reused": OURS_2, "upstream": UPSTREAM}
    width = 0.8 / len(harnesses)
    for i, (harness, rows) in enumerate(harnesses.items()):
        found = {r["case"]: r for r in rows}
        ys = [c + (i - (len(harnesses) - 1) / 2) * width for c in range(len(cases))]
        label = {"processes": "distspawn, fresh processes", "reused": "distspawn, reused ranks",
                 "upstream": "upstream's harness"}.get(harness, harness)
        seconds = [found[c]["seconds"] if c in found else 0 for c in cases]
        ax.barh(ys, seconds, width, color=colours.get(harness, "#444444"), label=label)
        for y, case, x in zip(ys, cases, seconds):
            if case in found:  # the verdict at the bar's end: a hang that passes is hidden
                ax.text(x, y, f" {found[case]['verdict']}", va="center", fontsize=5,
                        color="#555555")
    ax.axvline(data["deadline_s"], color="#c44e52", lw=1, ls="--")
    ax.text(data["deadline_s"], len(cases) - 0.3, f"deadline {data['deadline_s']} s ",
            fontsize=8, color="#c44e52", ha="right")
    ax.set_yticks(range(len(cases)), [c.removeprefix("test_").replace("_", " ")
                                      for c in cases], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds until the test's verdict")
    ax.set_title("Collectives that can never finish, and some that only take a while",
                 fontsize=10)
    ax.set_xlim(0, data["deadline_s"] * 1.15)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.08), ncol=3)
    fig.tight_layout()
    return fig


DRAWERS: dict[str, Callable[[Any, dict[str, Any]], Any]] = {
    "files": draw_files, "sessions": draw_sessions, "tiers": draw_tiers, "stalls": draw_stalls}


def draw(names: list[str], folder: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # The same data draws the same bytes: no date, a fixed id salt.
    plt.rcParams["svg.hashsalt"] = "distspawn"
    plt.rcParams["svg.fonttype"] = "none"
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name in names:
        source = RESULTS / SOURCES[name]
        fig = DRAWERS[name](plt, json.loads(source.read_text()))
        out = folder / f"{name}.svg"
        fig.savefig(out, format="svg", bbox_inches="tight",
                    metadata={"Date": None, "Description": _HASH_MARK + data_hash(source)})
        plt.close(fig)
        written.append(out)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", default=list(SOURCES),
                        help=f"figures to draw (default: all of {', '.join(SOURCES)})")
    parser.add_argument("--out", type=Path, default=FIGURES, help="folder for the SVG files")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - set(SOURCES))
    if unknown:
        parser.error(f"unknown figure {', '.join(unknown)}; expected some of "
                     f"{', '.join(SOURCES)}")
    missing = sorted({SOURCES[n] for n in args.names if not (RESULTS / SOURCES[n]).is_file()})
    if missing:
        parser.error(f"no saved result {', '.join(missing)} in {RESULTS}: run its benchmark "
                     "with --save first (see this script's docstring)")
    for path in draw(args.names, args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
