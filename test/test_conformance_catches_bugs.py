"""The conformance suite catches a real backend bug, with messages that point at it.

examples/wrapped_gloo.py registers ``dropping_gloo``: gloo behind a Python
process group whose all_reduce loses rank 1's data. Everything built on
all_reduce must fail; what does not use it must still pass.
"""

import re
import tempfile
from pathlib import Path

from harness import run_python

ROOT = Path(__file__).resolve().parent.parent


def test_a_backend_that_drops_a_rank_fails_the_relevant_tests():
    with tempfile.TemporaryDirectory() as temp_dir:
        run = run_python(
            ["-m", "pytest", "examples/plugin_conformance.py", "-v", "-p", "no:cacheprovider",
             "-k", "all_reduce_sum_world or broadcast_world or gather_world "
                   "or ddp_gradients_match or send_recv_every_pair"],
            env={"BACKEND": "dropping_gloo", "WORLD_SIZE": "2", "TEMP_DIR": temp_dir},
            cwd=ROOT, timeout=300)
    outcome = dict(re.findall(r"::(test_\w+) (PASSED|FAILED)", run.output))
    assert outcome == {
        "test_all_reduce_sum_world": "FAILED", "test_all_reduce_sum_world_async": "FAILED",
        "test_ddp_gradients_match_a_single_process": "FAILED",
        "test_broadcast_world": "PASSED", "test_broadcast_world_async": "PASSED",
        "test_all_gather_world": "PASSED", "test_all_gather_world_async": "PASSED",
        "test_gather_world": "PASSED", "test_send_recv_every_pair": "PASSED",
    }, run.output
    assert run.returncode == 1
    # The report says which ranks saw what: rank 0 got 1 (its own) instead of 1 + 2.
    report = run.output.split("test_all_reduce_sum_world ___")[1]
    assert "2 of 2 ranks failed (ranks 0, 1)" in report
    assert ("all_reduce(sum) on the world group, ranks [0, 1] contributing [1.0, 2.0]: "
            "expected 3.0, rank 0 got [1.0, 1.0, 1.0]") in report
    assert run.leftover_pids == []
