"""One command for a machine with a GPU: nccl faults, stalls and costs, checked.

Runs ``benchmarks/gpu_check_cases.py`` under pytest, as users run tests, with
nccl on CUDA at 2 and 4 ranks on one device (NCCL_MULTI_RANK_GPU_ENABLE=1,
NCCL_NVLS_ENABLE=0, NCCL_MAX_CTAS=2, which NCCL 2.30 needs for several ranks
on one GPU), on each tier (fresh ranks from the forkserver, spawned ranks,
reused ranks), and prints one table: each check, its verdict, its time, and
upstream's verdict on the same file where upstream's harness runs it. Also:
the examples' DTensor and FSDP files on the machine, the per-test cost of a
one-collective test against upstream's harness, and what each run left in
``/dev/shm`` and its temp folder.

    python benchmarks/gpu_check.py                 # the GPU run (about 5 minutes on one H100)
    python benchmarks/gpu_check.py --cpu           # the same checks with gloo on the CPU
    python benchmarks/gpu_check.py --save gpu.json

On a machine without a GPU (or whose NCCL is older than 2.30) it says
"no GPU: N checks skipped" and exits 0; ``--cpu`` then rehearses every check
with gloo, which proves the check itself (test/test_gpu_check.py runs both).
Exit status 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
CASES = HERE / "gpu_check_cases.py"
ROOT = HERE.parent
NCCL_SHARED_GPU = {"NCCL_MULTI_RANK_GPU_ENABLE": "1", "NCCL_NVLS_ENABLE": "0",
                   "NCCL_MAX_CTAS": "2"}
FAULTS = ("test_pass", "test_raise", "test_exit_code", "test_segfault", "test_hang", "test_skip")
STALLS = ("test_stall_shapes_differ", "test_stall_ops_differ",
          "test_stall_a_rank_skips_a_collective", "test_stall_send_facing_send",
          "test_slow_but_matching")
STALL_LIMIT_S = 15.0  # a stall must be named within this (issue 73)
# Every run's deadline: a stall not named by STALL_LIMIT_S fails its check at
# the deadline, and upstream's harness, which names none, waits this long
# (its default, 300 s, would make the upstream column take half an hour).
DEADLINE_S = 20


@dataclass
class Expect:
    verdict: str  # passed / failed / skipped
    says: tuple[str, ...] = ()  # words the failure message must hold
    within_s: float | None = None


EXPECTED = {
    "test_pass": Expect("passed"),
    "test_raise": Expect("failed", ("rank 1: raised an exception", "boom from rank 1")),
    "test_exit_code": Expect("failed", ("rank 1: called sys.exit(3)",)),
    "test_segfault": Expect("failed", ("rank 1: crashed with SIGSEGV",)),
    "test_hang": Expect("failed", ("did not finish before the deadline",)),
    "test_skip": Expect("skipped", ("skipped on every rank",)),
    "test_stall_shapes_differ": Expect("failed", ("shapes differ",), STALL_LIMIT_S),
    # (reused ranks number their collectives on from the tests before)
    "test_stall_ops_differ": Expect("failed", ("(ops differ)",), STALL_LIMIT_S),
    "test_stall_a_rank_skips_a_collective": Expect(
        "failed", ("rank 1 never reached collective #",), STALL_LIMIT_S),
    "test_stall_send_facing_send": Expect("failed", ("send facing send",), STALL_LIMIT_S),
    "test_slow_but_matching": Expect("passed"),
}


@dataclass
class Row:
    check: str
    verdict: str = "-"
    seconds: float = 0.0
    ok: bool | None = None  # None: skipped, not judged
    upstream: str = ""
    note: str = ""


@dataclass
class Run:
    cases: dict[str, tuple[str, float, str]] = field(default_factory=dict)
    seconds: float = 0.0
    left_in_shm: list[str] = field(default_factory=list)
    left_in_tmp: list[str] = field(default_factory=list)
    output: str = ""


def machine() -> dict:
    """What this machine has: GPUs, NCCL, and whether the nccl checks can run."""
    env = {**os.environ, "PYTORCH_NVML_BASED_CUDA_CHECK": "1"}  # ask NVML, never init CUDA
    code = ("import json, torch, torch.distributed as d\n"
            "n = torch.cuda.device_count()\n"
            "v = torch.cuda.nccl.version() if n and d.is_nccl_available() else None\n"
            "print(json.dumps({'gpus': n, 'nccl': list(v) if isinstance(v, tuple) else v,\n"
            "  'torch': torch.__version__,\n"
            "  'name': torch.cuda.get_device_name(0) if n else None}))")
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env=env, timeout=300)
    info = json.loads(found.stdout.strip().splitlines()[-1]) if found.returncode == 0 else {
        "gpus": 0, "nccl": None, "torch": "?", "name": None}
    nccl = tuple(info["nccl"] or ())
    info["why_not"] = (None if info["gpus"] and nccl >= (2, 30) else
                       "no GPU" if not info["gpus"] else
                       f"NCCL {'.'.join(map(str, nccl)) or 'absent'} is older than 2.30, which "
                       "several nccl ranks on one GPU need")
    return info


def _shm() -> set[str]:
    try:
        return set(os.listdir("/dev/shm"))
    except OSError:
        return set()


def run_cases(backend: str, tier: str, world: int, only: tuple[str, ...], upstream: bool = False,
              copies: int = 1, timeout: float = 600) -> Run:
    """One pytest run of the case file; each case's verdict, seconds and message."""
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        junit = Path(tmp) / "junit.xml"
        private = Path(tmp) / "tmp"
        private.mkdir()
        env = {**os.environ, "GPU_CHECK_BACKEND": backend, "GPU_CHECK_TIER": tier,
               "GPU_CHECK_WORLD": str(world), "GPU_CHECK_COPIES": str(copies),
               "TMPDIR": str(private), "UPSTREAM_HARNESS": "1" if upstream else "0",
               "DISTRIBUTED_TESTS_DEFAULT_TIMEOUT": str(DEADLINE_S),
               **(NCCL_SHARED_GPU if backend == "nccl" else {})}
        if tier == "spawn" and not upstream:
            env["DISTSPAWN_START_METHOD"] = "spawn"
        env.pop("CI", None)  # upstream's run_tests wants xmlrunner under CI
        keyword = " or ".join(only)
        before = _shm()
        started = time.monotonic()
        # In a session of its own: past the timeout the run goes with every rank
        # it started (upstream's spawned ranks outlive a killed test process).
        proc = subprocess.Popen(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
             "-o", "junit_family=xunit1", f"--junitxml={junit}", "-k", keyword, str(CASES),
             *(["-p", "no:distspawn"] if upstream else [])],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp,
            start_new_session=True)
        try:
            output = proc.communicate(timeout=timeout)[0]
        except subprocess.TimeoutExpired:  # every case of it is then "did not run"
            os.killpg(proc.pid, signal.SIGKILL)
            output = f"ran past {timeout} s: " + proc.communicate()[0]
        run = Run(seconds=time.monotonic() - started, output=output)
        time.sleep(0.5)  # a rank's last unlink after the test process exits
        run.left_in_shm = sorted(_shm() - before)
        run.left_in_tmp = sorted(str(p.relative_to(private)) for p in private.rglob("*")
                                 if not p.name.startswith(("torchinductor", "pytest-of")))
        if junit.exists():
            for case in ElementTree.parse(junit).iter("testcase"):
                failure = case.find("failure")
                if failure is None:
                    failure = case.find("error")
                skipped = case.find("skipped")
                verdict = ("failed" if failure is not None else
                           "skipped" if skipped is not None else "passed")
                node = failure if failure is not None else skipped
                message = "" if node is None else (node.get("message") or "") + (node.text or "")
                run.cases[case.get("name")] = (verdict, float(case.get("time", 0)), message)
    return run


def judge(name: str, found: tuple[str, float, str] | None) -> tuple[bool, str]:
    expect = EXPECTED[name.split("[")[0] if not name.startswith("test_pass_") else "test_pass"]
    if found is None:
        return False, "did not run"
    verdict, seconds, message = found
    if verdict != expect.verdict:
        return False, f"expected {expect.verdict}"
    missing = [words for words in expect.says if words not in message]
    if missing:
        return False, f"message lacks {missing[0]!r}"
    if expect.within_s is not None and seconds > expect.within_s:
        return False, f"named after {seconds:.1f} s, more than {expect.within_s:.0f} s"
    return True, ""


TIERS = ("forkserver", "spawn", "reused")
WORLD_SIZES = (2, 4)


def fault_and_stall_rows(backend: str, with_upstream: bool, tiers=TIERS,
                         world_sizes=WORLD_SIZES) -> list[Row]:
    rows = []
    for tier in tiers:
        for world in world_sizes:
            only = FAULTS + (STALLS if tier != "spawn" else ())
            run = run_cases(backend, tier, world, only)
            up = (run_cases(backend, "spawn", world, only, upstream=True)
                  if with_upstream and tier == "forkserver" and world == 2 else None)
            for name in only:
                found = run.cases.get(name)
                ok, note = judge(name, found)
                row = Row(f"{name.removeprefix('test_')} ({tier}, {world} ranks)",
                          verdict=found[0] if found else "-",
                          seconds=found[1] if found else 0.0, ok=ok, note=note)
                if up is not None:
                    row.upstream = up.cases.get(name, ("-",))[0]
                rows.append(row)
            left = [f"/dev/shm/{n}" for n in run.left_in_shm] + run.left_in_tmp
            rows.append(Row(f"nothing left behind ({tier}, {world} ranks)",
                            verdict="clean" if not left else f"{len(left)} left",
                            seconds=run.seconds, ok=not left, note=", ".join(left[:3])))
    return rows


def example_rows() -> list[Row]:
    """The examples' DTensor and FSDP files, as the machine runs them."""
    rows = []
    for example in ("test_dtensor.py", "test_fsdp.py"):
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               str(ROOT / "examples" / example)],
                              capture_output=True, text=True, timeout=600)
        summary = (done.stdout.strip().splitlines() or ["?"])[-1]
        rows.append(Row(f"examples/{example}", verdict=summary,
                        seconds=time.monotonic() - started, ok=done.returncode == 0))
    return rows


CUDA_AT_IMPORT = """
import torch
import torch.distributed as dist

from distspawn import MultiProcessTestCase

ON_THE_GPU_AT_IMPORT = torch.ones(1, device="cuda")  # as some of pytorch's test files do


class CudaAtImport(MultiProcessTestCase):
    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def test_a_rank_uses_cuda(self):
        torch.cuda.set_device(0)
        assert torch.ones(2, device="cuda").sum().item() == 2.0
"""


def fork_rule_row(backend: str) -> Row:
    """A test module that initialises CUDA at import must not break forked
    ranks: the rank server refuses to hold it, says so once, and its ranks
    import it themselves."""
    check = "CUDA initialised at import: ranks still use CUDA"
    if backend != "nccl":
        return Row(check, verdict="needs CUDA", note="not rehearsed on the CPU")
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        (Path(tmp) / "test_cuda_at_import.py").write_text(CUDA_AT_IMPORT)
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               "test_cuda_at_import.py"], capture_output=True, text=True,
                              cwd=tmp, timeout=300, env={**os.environ, "TMPDIR": tmp})
    output = done.stdout + done.stderr
    said = output.count("importing it initialised CUDA")
    ok = done.returncode == 0 and said == 1
    return Row(check, verdict=(output.strip().splitlines() or ["?"])[-1],
               seconds=time.monotonic() - started, ok=ok,
               note="" if ok else f"the refusal said {said} times; exit {done.returncode}")


def cost_rows(backend: str, with_upstream: bool, copies: int = 8) -> list[Row]:
    """The first test and the steady per-test cost of a one-collective test."""
    rows = []
    for harness in ("distspawn", "upstream") if with_upstream else ("distspawn",):
        run = run_cases(backend, "forkserver", 2, ("test_pass",), upstream=harness == "upstream",
                        copies=copies)
        times = [t for verdict, t, _ in run.cases.values() if verdict == "passed"]
        ok = len(times) == copies
        steady = statistics.median(times[1:]) if len(times) > 1 else float("nan")
        rows.append(Row(f"per-test cost, 2 ranks ({harness})",
                        verdict=f"first {times[0]:.2f} s, then {steady:.3f} s" if times else "-",
                        seconds=run.seconds, ok=ok))
    return rows


# Files written for upstream's harness, run unchanged in the stand-in mode and
# on upstream's harness (benchmarks/corpus.json names their commits): two of
# pytorch's DTensor files and a torchtitan file whose tests start ranks.
CORPUS_FILES = (("pytorch", "test/distributed/tensor/test_dtensor.py"),
                ("pytorch", "test/distributed/tensor/test_init.py"),
                ("torchtitan", "tests/unit_tests/test_fsdp_moe_sharding.py"))


def corpus_rows(corpus: Path | None) -> list[Row]:
    """Each corpus file in the stand-in mode against upstream's harness, as
    benchmarks/corpus.py runs them: every verdict the same, or better."""
    sys.path.insert(0, str(HERE))
    from corpus import MANIFEST, compare, kind, load_manifest, run_files

    entries = {(e.project, e.path): e for e in load_manifest(MANIFEST)}
    rows = []
    for project, path in CORPUS_FILES:
        check = f"stand-in mode: {project}/{path.rsplit('/', 1)[-1]}"
        if corpus is None or not (corpus / project / path).is_file():
            rows.append(Row(check, verdict="not fetched", note=(
                "give --corpus DIR (see docs/results/corpus.rst)" if corpus is None
                else f"not in {corpus / project}")))
            continue
        entry = entries[(project, path)]
        runs = {h: run_files([entry], corpus / project, h, timeout=900)
                for h in ("stand-in", "upstream")}
        verdicts = {h: run.verdicts[path] for h, run in runs.items()}
        failing = {n for n in verdicts["upstream"] if kind(verdicts["upstream"][n]) == "fail"
                   and kind(verdicts["stand-in"].get(n)) == "fail"}
        outcome = compare(verdicts["upstream"], verdicts["stand-in"], failing)
        counted = sum(len(v) for v in outcome.values())
        note = (", ".join(outcome["differ"][:3]) if counted else
                f"no test ran on either harness: {sorted(failing)[:2]} (its project's "
                "dependencies installed?)")
        rows.append(Row(check, verdict=(f"{len(outcome['same'])} same, "
                                        f"{len(outcome['better'])} better, "
                                        f"{len(outcome['differ'])} differ"),
                        seconds=runs["stand-in"].seconds,
                        upstream=f"{runs['upstream'].seconds:.0f} s",
                        ok=counted > 0 and not outcome["differ"], note=note))
    return rows


def planned_checks(tiers=TIERS, world_sizes=WORLD_SIZES, examples=True,
                   upstream=True) -> int:
    per_world = sum(len(FAULTS) + 1 + (len(STALLS) if tier != "spawn" else 0) for tier in tiers)
    return (len(world_sizes) * per_world + (2 if examples else 0) + (2 if upstream else 1)
            + 1 + (len(CORPUS_FILES) if upstream else 0))  # the fork rule, the corpus


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu", action="store_true",
                        help="rehearse every check with gloo on the CPU (no GPU needed)")
    parser.add_argument("--no-upstream", action="store_true",
                        help="leave out upstream's harness (it needs expecttest; it is slow)")
    parser.add_argument("--tiers", default=",".join(TIERS),
                        help=f"comma-separated, from {', '.join(TIERS)} (default: all)")
    parser.add_argument("--world-sizes", default=",".join(map(str, WORLD_SIZES)),
                        help="comma-separated (default: 2,4)")
    parser.add_argument("--no-examples", action="store_true",
                        help="leave out the examples' DTensor and FSDP files")
    parser.add_argument("--corpus", type=Path, metavar="DIR",
                        help="benchmarks/corpus.py's folder of fetched projects: runs "
                             f"{len(CORPUS_FILES)} of its files in the stand-in mode and on "
                             "upstream's harness")
    parser.add_argument("--save", type=Path, help="write the table as JSON here")
    args = parser.parse_args(argv)
    tiers = tuple(t for t in args.tiers.split(",") if t)
    if not tiers or set(tiers) - set(TIERS):
        parser.error(f"--tiers {args.tiers!r}: expected some of {', '.join(TIERS)}")
    try:
        world_sizes = tuple(int(w) for w in args.world_sizes.split(","))
    except ValueError:
        world_sizes = ()
    if not world_sizes or min(world_sizes) < 2:
        parser.error(f"--world-sizes {args.world_sizes!r}: expected sizes of 2 or more, "
                     "like 2,4")

    info = machine()
    if info["why_not"] and not args.cpu:
        count = planned_checks(tiers, world_sizes, not args.no_examples, not args.no_upstream)
        print(f"{info['why_not']}: {count} checks skipped "
              f"(torch {info['torch']}; --cpu rehearses them with gloo)")
        return 0
    backend = "gloo" if args.cpu else "nccl"
    with_upstream = not args.no_upstream
    if with_upstream:
        try:
            import torch.testing._internal.common_distributed  # noqa: F401
        except Exception as exc:  # noqa: BLE001 - any failure: upstream cannot run here
            print(f"upstream's harness does not import here ({exc}): its column is empty")
            with_upstream = False
    print(f"device: {info['name'] or 'CPU (rehearsal)'}; torch {info['torch']}; NCCL "
          f"{'.'.join(map(str, info['nccl'] or ())) or '-'}; backend {backend}", flush=True)
    started = time.monotonic()
    rows = (fault_and_stall_rows(backend, with_upstream, tiers, world_sizes)
            + ([] if args.no_examples else example_rows()) + [fork_rule_row(backend)]
            + cost_rows(backend, with_upstream)
            + (corpus_rows(args.corpus) if with_upstream else []))
    width = max(len(r.check) for r in rows)
    print(f"{'check':<{width}}  {'verdict':<40} {'s':>6}  {'upstream':<8} ok")
    for row in rows:
        mark = "-" if row.ok is None else "yes" if row.ok else "NO"
        print(f"{row.check:<{width}}  {row.verdict[:40]:<40} {row.seconds:6.1f}  "
              f"{row.upstream:<8} {mark} {row.note}")
    failed = [r for r in rows if r.ok is False]
    right = [r for r in rows if r.ok]
    print(f"{len(rows)} checks in {time.monotonic() - started:.0f} s: {len(right)} right, "
          f"{len(failed)} wrong, {len(rows) - len(right) - len(failed)} not judged")
    if args.save:
        args.save.write_text(json.dumps({"machine": info, "backend": backend,
                                         "rows": [r.__dict__ for r in rows]}, indent=1) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
