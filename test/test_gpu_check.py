"""benchmarks/gpu_check.py cannot rot: without a GPU it says what it skipped and
exits 0, and its checks, rehearsed with gloo on the CPU, find every case right."""

import re
from pathlib import Path

import pytest

from harness import run_python

CHECK = str(Path(__file__).resolve().parent.parent / "benchmarks" / "gpu_check.py")


def test_without_a_gpu_it_says_how_many_checks_it_skipped_and_exits_0():
    import torch

    if torch.cuda.device_count():
        pytest.skip("this machine has a GPU: the checks run instead")
    run = run_python([CHECK], timeout=120)
    assert run.returncode == 0, run.output
    assert re.search(r"^no GPU: 70 checks skipped \(torch ", run.output, re.M), run.output


def test_the_checks_rehearsed_on_the_cpu_find_every_case_right():
    # One tier and size, without upstream's harness and the examples (the
    # whole rehearsal, python benchmarks/gpu_check.py --cpu, takes minutes).
    run = run_python([CHECK, "--cpu", "--tiers", "forkserver", "--world-sizes", "2",
                      "--no-upstream", "--no-examples"], timeout=400)
    assert run.returncode == 0, run.output
    # 12 cases and the run's leftovers, the per-test cost, and the fork rule
    # (CUDA at import: not rehearsed on the CPU, so not judged)
    assert "14 checks in" in run.output, run.output
    assert "13 right, 0 wrong, 1 not judged" in run.output, run.output
    for check in ("raise (forkserver, 2 ranks)", "stall_shapes_differ (forkserver, 2 ranks)",
                  "nothing left behind (forkserver, 2 ranks)"):
        assert re.search(rf"^{re.escape(check)} .* yes", run.output, re.M), run.output
    assert run.leftover_files == [] and run.leftover_pids == []
