"""Runs scenario files in a subprocess and checks that nothing outlives them."""

from __future__ import annotations

import fcntl
import functools
import json
import os
import pickle
import re
import select
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import upstream_record
import warm_python

SCENARIOS = Path(__file__).parent / "scenarios"
MARKER_VAR = "DISTSPAWN_TEST_RUN_MARKER"
# What unittest -v writes after a test's " ... ".
_VERDICT_WORDS = re.compile(r"ok|FAIL|ERROR|skipped .*|expected failure|unexpected success")


class RanPastTimeout(AssertionError):
    """A scenario run did not finish within its timeout (it was interrupted)."""


# How long ``python -S -c pass`` takes on this project's 2-core machine when
# nothing else runs (median of 5: 4.8 ms, measured with load_factor's own code).
QUIET_PYTHON_START_S = 0.005
MAX_LOAD_FACTOR = 10.0  # the most load_factor() gives, however loaded the machine


_COMPUTED: dict = {}


def computed_once(tmp_path_factory, key: str, compute):
    """``compute()``, worked out once per pytest run and shared.

    A module-scoped fixture is worked out again on every xdist worker that runs
    one of its tests, and again each time a worker comes back to the module
    (worksteal interleaves modules): test_stalls' three-tier run was made five
    times in one suite run. Under xdist the first worker to ask computes it
    while the others wait on a lock in the run's shared temp folder, then read
    it back (``compute`` must return something picklable). A compute that
    raises (a skip, a timeout) stores nothing, so the next one asking tries.
    """
    if key not in _COMPUTED:
        if not os.environ.get("PYTEST_XDIST_WORKER"):
            _COMPUTED[key] = compute()
        else:
            # Each worker's basetemp is a folder of the controller's own, which
            # is new for every run: nothing is shared between runs.
            shared = tmp_path_factory.getbasetemp().parent
            stored = shared / f"computed-{key}.pickle"
            with open(shared / f"computed-{key}.lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                if stored.exists():
                    _COMPUTED[key] = pickle.loads(stored.read_bytes())
                else:
                    _COMPUTED[key] = compute()
                    stored.write_bytes(pickle.dumps(_COMPUTED[key]))
    return _COMPUTED[key]


def load_factor() -> float:
    """How many times slower than when quiet this machine starts a process now.

    Bounds that encode a promise ("every rank ends within 2 s of SIGKILL") are
    the promise on a quiet machine and scale by this on a loaded one (users'
    CI runners often are), so load changes no verdict while real slowness
    still fails: 1 at least, MAX_LOAD_FACTOR at most.
    """
    times = []
    for _ in range(5):
        started = time.monotonic()
        subprocess.run([sys.executable, "-S", "-c", "pass"], check=True)
        times.append(time.monotonic() - started)
    return min(MAX_LOAD_FACTOR, max(1.0, sorted(times)[2] / QUIET_PYTHON_START_S))


@dataclass
class Run:
    returncode: int
    output: str
    leftover_files: list[str]
    leftover_pids: list[int]
    elapsed: float

    def verdict_line(self, test_name: str) -> str:
        """unittest -v's line for a test, e.g. 'test_x (...) ... FAIL'.

        Where other output came between the test's name and its verdict (a
        thread's traceback printed while the test ran), the verdict is the
        first later line that is one alone, and is joined back to the name.
        """
        lines = self.output.splitlines()
        for at, line in enumerate(lines):
            if not (line.startswith(test_name + " ") and " ... " in line):
                continue
            head, _, rest = line.partition(" ... ")
            if _VERDICT_WORDS.fullmatch(rest.strip()):
                return line
            for later in lines[at + 1:]:
                if _VERDICT_WORDS.fullmatch(later.strip()):
                    return f"{head} ... {later.strip()}"
                if later.startswith("test") and " ... " in later:
                    break  # the next test's line: this one's verdict was not found
            return line
        raise AssertionError(f"no verdict line for {test_name} in:\n{self.output}")

    def report(self, test_name: str) -> str:
        """The failure block unittest printed for a test ('FAIL: test_x (...)' onwards)."""
        for block in self.output.split("=" * 70):
            words = block.strip().split(" ", 2)
            if len(words) > 1 and words[0] in ("FAIL:", "ERROR:") and words[1] == test_name:
                return block
        raise AssertionError(f"no report for {test_name} in:\n{self.output}")


def processes_with_marker(marker: str, settle_s: float = 5.0,
                          session: int | None = None) -> list[int]:
    """Live processes started under ``marker`` (or in ``session``: a run forked
    by warm_python), after giving exiting ones ``settle_s``.

    multiprocessing's resource tracker, for one, exits just after its parent.
    """
    deadline = time.monotonic() + settle_s
    while True:
        # Listed again after each wait: one may have started meanwhile (a rank
        # its server was forking when the parent died).
        pids = _marked_now(marker, session)
        if not pids or time.monotonic() >= deadline:
            return pids
        for pid in pids:
            try:
                pidfd = os.pidfd_open(pid)
            except OSError:
                continue  # already gone
            try:
                select.select([pidfd], [], [], max(0.0, deadline - time.monotonic()))
            finally:
                os.close(pidfd)


def end_marked(proc: subprocess.Popen | warm_python.WarmProcess, marker: str) -> None:
    """Kill ``proc`` and every live process started under ``marker``."""
    proc.kill()
    proc.wait()
    for pid in _marked_now(marker, getattr(proc, "session", None)):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass  # gone meanwhile


def _marked_now(marker: str, session: int | None = None) -> list[int]:
    from distspawn.early.rank_server_boot import proc_stat_fields

    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        # State, parent, process group, session, ...
        fields = proc_stat_fields(int(entry.name))
        if fields and fields[0] != b"Z" and (
                f"{MARKER_VAR}={marker}".encode() in environ
                or (session is not None and int(fields[3]) == session)):
            found.append(int(entry.name))
    return found


def is_torch_cache(relative: Path) -> bool:
    # torch's persistent compile cache ($TMPDIR/torchinductor_$USER), made by
    # any import of torch._dynamo (DDP imports it): not a test's temp file.
    return relative.parts[0].startswith("torchinductor_")


# torch 2.8 makes this folder as torch.distributed.nn is imported (torch._dynamo
# imports it) and removes it only at a normal exit: a rank killed by SIGTERM
# (a reused worker whose test failed, on any harness) cannot, where one that
# leaves by itself does (engine.forked_exit).
TORCH_IMPORT_FOLDER_FILE = "_remote_module_non_scriptable.py"


def is_torch_import_folder(tmp: Path, relative: Path) -> bool:
    folder = tmp / relative.parts[0]
    return folder.is_dir() and [p.name for p in folder.iterdir()] == [TORCH_IMPORT_FOLDER_FILE]


def short_temp_dir() -> tempfile.TemporaryDirectory:
    """A private temp folder with a short name, to be a run's TMPDIR.

    The rank server's socket goes below TMPDIR, and a Unix socket path takes at
    most 107 bytes: under pytest -n (an xdist worker's folder, then this one,
    then a nested run's worker's), or below pytest's tmp_path, a longer name
    passes that, and the socket's folder goes to /tmp instead, outside the
    folder whose leftovers the run reports.
    """
    return tempfile.TemporaryDirectory(prefix="ds-")


def run_python(args: list[str], env: dict[str, str] | None = None, timeout: float = 300,
               cwd: Path = SCENARIOS, warm: bool = True) -> Run:
    """Run ``python *args`` with a private TMPDIR; report what it left behind.

    The run is forked from this process's warm interpreter (``warm_python``)
    where nothing it could see differs from a fresh one; ``warm=False`` (a test
    of what a process imports) always starts a fresh interpreter.
    """
    marker = uuid.uuid4().hex
    with short_temp_dir() as tmp:
        # CI is the CI runner's flag, not the scenario's: with it set, upstream's
        # run_tests writes XML reports and needs xmlrunner (upstream drops it for
        # the test processes it starts, too).
        inherited = {k: v for k, v in os.environ.items() if k != "CI"}
        full_env = {**inherited, "TMPDIR": tmp, MARKER_VAR: marker, **(env or {})}
        started = time.monotonic()
        # A run that hangs past its timeout gets Ctrl-C first (its traceback says
        # where it waited; the harness ends its ranks), then is killed; the
        # failure shows its output either way.
        proc = warm_python.ZYGOTE.start(args, full_env, cwd) if warm else None
        if proc is None:
            proc = subprocess.Popen([sys.executable, *args], cwd=cwd, env=full_env,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            output, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)
            try:
                output, _ = proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                output, _ = proc.communicate()
            raise RanPastTimeout(
                f"python {' '.join(args)} ran past {timeout} s; its output, up to and "
                f"after a Ctrl-C:\n{output[-20000:]}") from None
        except BaseException:
            # This test process is being ended (Ctrl-C, a suite's time limit):
            # the run and all it started go too. An interrupted suite on a GPU
            # machine left a scenario run and its spawned ranks behind.
            end_marked(proc, marker)
            raise
        elapsed = time.monotonic() - started
        # What the run started gets its settling time before the files are
        # listed: a test process that ended by os._exit (pytest-timeout's thread
        # method) leaves its ranks' files to its watcher (engine.leftovers), which
        # removes them as it ends, just after the test process; on a loaded
        # machine, after the output's pipe closed.
        still_running = processes_with_marker(marker, session=getattr(proc, "session", None))
        leftovers = sorted(str(p.relative_to(tmp)) for p in Path(tmp).rglob("*")
                           if not is_torch_cache(p.relative_to(tmp))
                           and not is_torch_import_folder(Path(tmp), p.relative_to(tmp)))
    return Run(proc.returncode, without_release_noise(output), leftovers,
               still_running, elapsed)


# Lines older releases print from every rank, which can land in the middle of
# unittest's "test_x (...) ... ok" line; they say nothing about the test:
# - a CUDA build of torch 2.8 with no CUDA toolkit, at import of cpp_extension;
# - torch 2.8's gloo, as each rank connects.
_NOISE = (r"W\d{4} [\d:.]+ +\d+ \S*cpp_extension\.py:\d+\] No CUDA runtime is found[^\n]*"
          r"|(?:\[rank ?\d+\]:? ?)?\[Gloo\] Rank \d+ is connected to \d+ peer ranks\. "
          r"Expected number of connected peer ranks is : \d+")
# A whole line of it goes, indentation and all; inside a line, just the text
# and the line break after it (which joins "test_x ... " to its verdict).
_RELEASE_NOISE = re.compile(rf"^[ \t]*(?:{_NOISE})[ \t]*\n|(?:{_NOISE})\n?", re.M)


def without_release_noise(output: str) -> str:
    """``output`` less the lines older releases print from every process."""
    return _RELEASE_NOISE.sub("", output)


# Upstream's modules the tests ask about. Each costs its own import of torch
# and common_utils (5-7 s of CPU) when probed alone, once per xdist worker;
# probed together in one interpreter they cost about one.
UPSTREAM_MODULES_ASKED_ABOUT = (
    "torch.testing._internal.common_utils",
    "torch.testing._internal.common_distributed",
    "torch.testing._internal.common_fsdp",
    "torch.testing._internal.distributed._tensor.common_dtensor",
    "torch.testing._internal.distributed.fake_pg",
    "torch.testing._internal.distributed.rpc_utils",
)
_PROBE = """
import importlib, json, sys
found = {}
for module in sys.argv[1:]:
    try:
        found[module] = sorted(dir(importlib.import_module(module)))
    except Exception:
        found[module] = None
print("PROBED " + json.dumps(found))
"""


@functools.lru_cache(maxsize=None)
def _upstream_names() -> dict[str, list[str] | None]:
    """For each of UPSTREAM_MODULES_ASKED_ABOUT, the names it defines, or None
    where it does not import; asked of one fresh interpreter, so the test
    process never imports upstream's harness. {} if the probe itself died."""
    probe = subprocess.run([sys.executable, "-c", _PROBE, *UPSTREAM_MODULES_ASKED_ABOUT],
                           capture_output=True, text=True)
    lines = [line for line in probe.stdout.splitlines() if line.startswith("PROBED ")]
    return json.loads(lines[-1][len("PROBED "):]) if lines else {}


@functools.lru_cache(maxsize=None)
def upstream_module_imports(module: str) -> bool:
    """Whether ``module`` (one of upstream's harness modules) imports here, asked in
    a fresh interpreter so the test process does not import it."""
    known = _upstream_names()
    if module in known:
        return known[module] is not None
    probe = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True)
    return probe.returncode == 0


@functools.lru_cache(maxsize=None)
def upstream_lacks(module: str, names: tuple[str, ...]) -> list[str]:
    """Which of ``names`` the installed release's ``module`` (upstream's) does not
    define: a file importing them cannot run on that release's harness, so a
    comparison with it is skipped, naming them. Asked in a fresh interpreter."""
    known = _upstream_names()
    if module in known:
        if known[module] is None:  # it does not import: it defines none of them
            return list(names)
        if set(names) <= set(known[module]):
            return []
    # Not probed, or a name dir() does not list: ask the module itself.
    probe = subprocess.run(
        [sys.executable, "-c", f"import json, {module} as m; "
         f"print(json.dumps([n for n in {list(names)!r} if not hasattr(m, n)]))"],
        capture_output=True, text=True)
    if probe.returncode != 0:
        return list(names)
    return json.loads(probe.stdout.splitlines()[-1])


def upstream_names_imported_by(scenario: str) -> dict[str, tuple[str, ...]]:
    """Upstream module -> the names ``scenario`` (a file in SCENARIOS) imports from it."""
    import ast

    tree = ast.parse((SCENARIOS / scenario).read_text())
    found: dict[str, list[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "torch.testing._internal"):
            found.setdefault(node.module, []).extend(a.name for a in node.names)
    return {module: tuple(names) for module, names in found.items()}


def skip_unless_upstream_runs(scenario: str) -> None:
    """Skip the calling test where the installed release's harness lacks a name
    ``scenario`` imports from it (an older release: the file is newer than it)."""
    import pytest
    import torch

    for module, names in upstream_names_imported_by(scenario).items():
        missing = upstream_lacks(module, names)
        if missing:
            pytest.skip(f"{scenario} imports {', '.join(missing)} from {module}, which torch "
                        f"{torch.__version__} lacks: that release's harness cannot run it")


@functools.lru_cache(maxsize=None)
def gloo_reduce_scatter_always_sums() -> bool:
    """Whether the installed torch's gloo reduce_scatter sums whatever reduce
    op it is given (torch 2.8: silently; with ReduceOp.AVG, which FSDP2 uses,
    FSDP2 on CPU then trains on gradients world-size times too big). A test
    comparing with gloo accounts for it there. Asked of two gloo ranks, once."""
    run = run_python(["gloo_reduce_scatter_ops.py"], timeout=120)
    found = re.search(r"^ALWAYS_SUMS ([01])$", run.output, re.M)
    assert run.returncode == 0 and found, run.output
    return found.group(1) == "1"


# Upstream's spawned ranks shut the interpreter down with gloo groups still
# alive, and now and then a gloo thread aborts a rank there (SIGABRT out of
# ProcessGroupGloo::runLoop, "terminate called without an active exception"):
# upstream's harness then fails a test that passed. distspawn's ranks cannot
# (see engine.worker). Comparisons with upstream's verdicts run upstream's side
# once more when that is what happened, so that its bug does not fail ours.
UPSTREAM_EXIT_ABORT = ("SIGABRT", "ProcessGroupGloo::runLoop")


# Upstream's harness pays a fresh interpreter per rank per test, and each one
# imports the test file's harness modules (common_dtensor alone costs 7 s of
# CPU on torch 2.13): dtensor_suite.py takes 280 s there on a quiet 2-core
# machine, and more beside a second xdist worker. Its runs get this long.
UPSTREAM_TIMEOUT = 1200.0


def run_python_on_upstream(args: list[str], env: dict[str, str] | None = None,
                           timeout: float = UPSTREAM_TIMEOUT, **kwargs) -> Run:
    """``run_python`` for a run on upstream's harness (see UPSTREAM_EXIT_ABORT
    and UPSTREAM_TIMEOUT).

    A run that does not end in ``timeout`` is upstream's slowness, not a wrong
    verdict of ours: the comparison is skipped saying "upstream did not
    finish", never failed, and not tried again (a second try on the same
    loaded machine would only double the wait).
    """
    cwd = Path(kwargs.get("cwd", SCENARIOS))
    record = upstream_record.replayed(args, env, cwd)
    if record is not None:
        return Run(record["returncode"], record["output"], record["leftover_files"],
                   [], record["elapsed"])
    for attempt in (1, 2):
        try:
            run = run_python(args, env=env, timeout=timeout, **kwargs)
        except RanPastTimeout as exc:
            import pytest

            pytest.skip(f"upstream did not finish (load average "
                        f"{os.getloadavg()[0]:.1f}): {str(exc).splitlines()[0]}")
        if not all(marker in run.output for marker in UPSTREAM_EXIT_ABORT) or attempt == 2:
            upstream_record.write(args, env, cwd, {
                "returncode": run.returncode, "output": run.output,
                "leftover_files": run.leftover_files, "elapsed": run.elapsed})
            return run
    raise AssertionError("unreachable")


def scenario_verdicts(module: str, env: dict[str, str] | None = None) -> tuple[dict, Run]:
    """Run scenario ``module`` through verdicts_json.py (on upstream's harness when
    ``env`` sets UPSTREAM_HARNESS); its verdicts by test, and the run."""
    runner = run_python_on_upstream if (env or {}).get("UPSTREAM_HARNESS") else run_python
    run = runner(["verdicts_json.py", module], env=env)
    lines = [line for line in run.output.splitlines() if line.startswith("VERDICTS ")]
    assert lines, run.output
    return json.loads(lines[-1][len("VERDICTS "):]), run


def needs_gpus(count: int) -> str:
    """The words a "needs ``count`` GPUs" skip has on the installed torch release
    ("... CUDA devices" up to 2.13, "... accelerator devices" from 2.14)."""
    from distspawn.fixtures.skips import gpu_count_skip

    return gpu_count_skip(count).message


def conformance_counts(world_size: int, skip_messages: list[str]) -> tuple[int, int]:
    """How many of the conformance suite's 174 tests (test_distributed_spawn.py
    on gloo) must pass and skip at ``world_size``, given the run's skip messages.

    Two tests need 3 ranks. At every size PREMUL_SUM (nccl only) and
    SyncBatchNorm (a GPU per rank) skip; the two resnet tests skip where
    torchvision does not import; and what gloo lacks on the installed release
    (torch 2.8: all_to_all, complex broadcast) skips, naming the backend, the op
    and the release. Only ops gloo is known to lack somewhere in the window may.
    """
    from distspawn.fixtures.optional import torchvision_problem

    lacks = [m for m in skip_messages if "BACKEND=gloo on torch " in m]
    assert all(re.search(r"cannot do (all_to_all\w*|\w+ on complex\d+)", m) for m in lacks), lacks
    vision = 0 if torchvision_problem() is None else 2
    needs_three = 2 if world_size == 2 else 0
    passed = 172 - needs_three - vision - len(lacks)
    return passed, 174 - passed
