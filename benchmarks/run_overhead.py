"""What distspawn adds around a pytest run's tests: plugin off, plugin, stand-in.

Runs one test file under pytest three ways, in turn for several rounds: with
distspawn's plugin off (``-p no:distspawn``), with it on, and in the stand-in
mode (``--distspawn-stand-in``). For each run it gives the wall time of
pytest, how long any process the run started (the rank server,
multiprocessing's resource tracker) outlived pytest (a caller reading
pytest's output through a pipe waits for both), and the busy CPU seconds of
the whole machine from start until the last of them ended (from /proc/stat:
run it on an otherwise quiet machine). Linux only.

The default file starts no rank: it is written for upstream's harness, with
one rank test that skips by decorator beside one plain test, as many real
files are on a machine without the hardware their rank tests ask for.
``--file`` runs another (with the plugin off, a distspawn file still runs its
ranks on distspawn's engine). A run past ``--timeout`` is ended with all it
started and counted in the last column, not in the medians.

``--first-rank`` runs a file whose one test starts two ranks, written for
upstream's harness, and adds how long after the test's setUp began its first
rank ran the test's body: upstream's harness starts fresh interpreters there
(plugin off); the stand-in mode forks them from the rank server, started while
pytest collected the file.

``--threads`` runs a file of rank threads only (``MultiThreadedTestCase``
worlds of 4 and 2 threads: device meshes, functional collectives, a backward
through one, parametrized tests), beside one plain test, written for
upstream's harness: a run that starts no rank process, where the stand-in
mode swaps in distspawn's threaded world and starts no rank server.

    python benchmarks/run_overhead.py --rounds 5
    python benchmarks/run_overhead.py --rounds 5 --first-rank
    python benchmarks/run_overhead.py --rounds 8 --threads
    python benchmarks/run_overhead.py --rounds 5 --file examples/test_allreduce.py
    python benchmarks/run_overhead.py --rounds 10 --timeout 60 --file .../test_functional_api.py
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

MODES = {"plugin off": ["-p", "no:distspawn"], "plugin": [],
         "stand-in": ["--distspawn-stand-in"]}
MARKER_VAR = "DISTSPAWN_BENCH_RUN_MARKER"
# Where --first-rank's file writes when its test's setUp began and when each
# rank ran the test's body (time.time(), one "what seconds" line each).
STAMPS_VAR = "DISTSPAWN_BENCH_STAMPS"
DEFAULT_FILE = '''
import unittest

import torch
from torch.testing._internal.common_distributed import MultiProcessTestCase


class NeedsEightAccelerators(MultiProcessTestCase):
    @unittest.skip("needs 8 accelerators")
    def test_all_reduce(self):
        pass


def test_plain():
    assert torch.ones(1).item() == 1.0
'''


FIRST_RANK_FILE = f'''
import os
import time

from torch.testing._internal.common_distributed import MultiProcessTestCase
from torch.testing._internal.common_utils import run_tests


def stamp(what):
    with open(os.environ["{STAMPS_VAR}"], "a") as stamps:
        stamps.write(f"{{what}} {{time.time()}}\\n")


class TwoRanks(MultiProcessTestCase):
    @property
    def world_size(self):
        return 2

    def setUp(self):
        stamp("setUp")
        super().setUp()
        self._spawn_processes()

    def test_rank_runs(self):
        stamp(f"rank{{self.rank}}")


if __name__ == "__main__":
    run_tests()
'''


THREADS_FILE = '''
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed.device_mesh import DeviceMesh
from torch.testing._internal.common_distributed import MultiThreadedTestCase
from torch.testing._internal.common_utils import (
    TestCase, instantiate_parametrized_tests, parametrize, run_tests)


class OnThreads(MultiThreadedTestCase):
    def setUp(self):
        super().setUp()
        self._spawn_threads()


@instantiate_parametrized_tests
class FourThreads(OnThreads):
    world_size = 4

    @parametrize("size", [1, 2, 3, 4, 5])
    def test_sum_over_a_flat_mesh(self, size):
        mesh = DeviceMesh("cpu", torch.arange(4))
        total = funcol.all_reduce(torch.ones(size), "sum", mesh)
        self.assertEqual(total, torch.full((size,), 4.0))

    @parametrize("size", [1, 2, 3, 4, 5])
    def test_gather_along_one_dim_of_a_square_mesh(self, size):
        mesh = DeviceMesh("cpu", torch.arange(4).view(2, 2))
        gathered = funcol.all_gather_tensor(torch.ones(size), 0, (mesh, 0))
        self.assertEqual(gathered, torch.ones(2 * size))

    def test_rank_0_broadcasts(self):
        mine = torch.ones(3) if dist.get_rank() == 0 else torch.zeros(3)
        mesh = DeviceMesh("cpu", torch.arange(4))
        self.assertEqual(funcol.broadcast(mine, 0, mesh), torch.ones(3))


class TwoThreads(OnThreads):
    world_size = 2

    def test_backward_through_a_sum(self):
        x = torch.rand(4, requires_grad=True)
        funcol.all_reduce(x, "sum", dist.group.WORLD).sum().backward()
        self.assertIsNotNone(x.grad)


class NoWorld(TestCase):
    def test_meta_tensors_keep_their_shape(self):
        x = torch.rand((2, 3), device="meta")
        self.assertEqual(funcol.all_reduce(x, "sum", "0").size(), x.size())


if __name__ == "__main__":
    run_tests()
'''


def first_rank_delay(stamps: Path) -> float | None:
    """Seconds from the test's setUp to the first rank in its body, if stamped."""
    if not stamps.exists():
        return None
    times: dict[str, list[float]] = {}
    for line in stamps.read_text().splitlines():
        what, seconds = line.split()
        times.setdefault("rank" if what.startswith("rank") else what, []).append(float(seconds))
    if "setUp" not in times or "rank" not in times:
        return None
    return min(times["rank"]) - min(times["setUp"])


def busy_cpu_s() -> float:
    """Busy CPU seconds of the whole machine since boot (user, nice, system, irq, softirq)."""
    with open("/proc/stat") as f:
        fields = f.readline().split()[1:]
    ticks = sum(int(fields[i]) for i in (0, 1, 2, 5, 6))
    return ticks / os.sysconf("SC_CLK_TCK")


def marked_processes(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if f"{MARKER_VAR}={marker}".encode() in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue  # ended meanwhile, or not ours to read
    return found


def one_run(test_file: Path, mode: str, timeout: float) -> dict[str, float] | None:
    """One pytest run's figures, or None where it ran past ``timeout`` (then it is ended)."""
    marker = uuid.uuid4().hex
    stamps = Path(tempfile.gettempdir()) / f"ds-bench-stamps-{marker}"
    env = {**os.environ, MARKER_VAR: marker, STAMPS_VAR: str(stamps)}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
               str(test_file), *MODES[mode]]
    # Output to a file, not a pipe: a process that outlives pytest holding
    # the pipe would make pytest's own time look longer (what a caller reading
    # the pipe, a CI runner, does wait for is wall + outlived).
    with tempfile.TemporaryFile("w+") as output:
        cpu_before, started = busy_cpu_s(), time.monotonic()
        proc = subprocess.Popen(command, env=env, cwd=test_file.parent, stdout=output,
                                stderr=subprocess.STDOUT)
        try:
            returncode = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            # A hung run (upstream's threaded world can hang in a store
            # barrier) is counted, not waited for: end it and all it started.
            returncode = None
            for pid in [proc.pid, *marked_processes(marker)]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.wait()
        ended = time.monotonic()
        while marked_processes(marker):
            time.sleep(0.02)
        if returncode is None:
            return None
        # 1: some tests failed, as in real files that fail on every harness
        # (the exit codes are shown per mode); 5: every test deselected or
        # skipped at module level.
        if returncode not in (0, 1, 5):
            output.seek(0)
            raise SystemExit(f"pytest {mode} failed:\n{output.read()}")
    figures = {"wall": ended - started, "outlived": time.monotonic() - ended,
               "cpu": busy_cpu_s() - cpu_before, "exit": returncode}
    delay = first_rank_delay(stamps)
    stamps.unlink(missing_ok=True)
    if delay is not None:
        figures["first rank"] = delay
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--file", type=Path, help="the test file (default: see above)")
    parser.add_argument("--first-rank", action="store_true",
                        help="run a file whose one test starts two ranks, and add how long "
                             "its first rank took to start (see above)")
    parser.add_argument("--threads", action="store_true",
                        help="run a file of rank threads only (see above)")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each mode (default 3)")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds after which a run is ended and counted as hung "
                             "(default 120)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds={args.rounds}: give a whole number >= 1")
    chosen = [flag for flag, on in (("--file", args.file), ("--first-rank", args.first_rank),
                                    ("--threads", args.threads)) if on]
    if len(chosen) > 1:
        parser.error(f"{' and '.join(chosen)}: each names the file to run; give one of them")
    if args.timeout <= 0:
        parser.error(f"--timeout={args.timeout}: give a number of seconds > 0")
    with tempfile.TemporaryDirectory(prefix="ds-bench-") as tmp:
        if args.file:
            test_file = args.file.resolve()
        elif args.first_rank:
            test_file = Path(tmp) / "test_two_ranks.py"
            test_file.write_text(FIRST_RANK_FILE)
        elif args.threads:
            test_file = Path(tmp) / "test_rank_threads.py"
            test_file.write_text(THREADS_FILE)
        else:
            test_file = Path(tmp) / "test_no_rank.py"
            test_file.write_text(DEFAULT_FILE)
        results: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
        hung = {mode: 0 for mode in MODES}
        for _ in range(args.rounds):
            for mode in MODES:
                run = one_run(test_file, mode, args.timeout)
                if run is None:
                    hung[mode] += 1
                else:
                    results[mode].append(run)
    print(f"{test_file.name}, {args.rounds} rounds; medians (min-max) of the runs that ended")
    columns = ["wall", "outlived", "cpu"] + (["first rank"] if args.first_rank else [])
    print(f"{'mode':<12}{'wall s':>21}{'outlived s':>21}{'busy CPU s':>21}"
          + (f"{'first rank s':>21}" if args.first_rank else "")
          + f"{f'past {args.timeout:g} s':>14}{'exit codes':>12}")
    for mode, runs in results.items():
        cells = []
        for key in columns:
            values = [run[key] for run in runs if key in run]
            cells.append(f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"
                         if values else "-")
        codes = ",".join(str(code) for code in sorted({run["exit"] for run in runs})) or "-"
        print(f"{mode:<12}" + "".join(f"{cell:>21}" for cell in cells) + f"{hung[mode]:>14}"
              f"{codes:>12}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
