"""MultiProcContinuousTest: reused workers, failures that fail alone, any order.

scenarios/continuous_faults.py runs once per order (forward, reverse, shuffled);
the verdicts must be the same each time, and nothing may be left behind.
"""

import collections
import sys

import pytest

import distspawn
from harness import needs_gpus, run_python, run_python_on_upstream

EXPECTED = {
    "test_a_pass": "ok",
    "test_b_fail_on_rank1": "FAIL",
    "test_c_pass_after_failure": "ok",
    "test_d_crash_on_rank0": "FAIL",
    "test_e_skip_everywhere": "skipped 'not on this pool'",
    "test_f_skip_some_fail_others": "FAIL",
    "test_g_leaves_a_thread": "FAIL",
    "test_h_destroys_the_group": "FAIL",
    "test_i_pid_is_reused": "ok",
    "test_j_exit_with_skip_code": f"skipped '{needs_gpus(4)}'",
    "test_one": "ok",
    "test_two": "ok",
}


@pytest.fixture(scope="module", params=["forward", "reverse", "shuffle"])
def run(request, tmp_path_factory):
    pid_log = tmp_path_factory.mktemp("pids") / "pids.txt"
    result = run_python(["continuous_faults.py", "-v"], timeout=300, env={
        "DISTSPAWN_TEST_ORDER": request.param, "DISTSPAWN_PID_LOG": str(pid_log)})
    result.pids = collections.defaultdict(set)
    for line in pid_log.read_text().splitlines():
        test, _rank, pid = line.split()
        result.pids[test].add(int(pid))
    return result


def test_same_verdicts_in_every_order_and_nothing_left(run):
    for test, verdict in EXPECTED.items():
        assert run.verdict_line(test).endswith(verdict), run.output
    assert run.leftover_pids == []
    assert run.leftover_files == []


def test_failure_names_rank_and_the_next_test_gets_a_fresh_pool(run):
    report = run.report("test_b_fail_on_rank1")
    assert "1 of 2 ranks failed (rank 1)" in report
    assert "rank one disagrees" in report
    assert "a fresh pool serves the next test" in report
    # The tests after a failure ran in other processes than the ones before it.
    assert run.pids["test_a_pass"].isdisjoint(run.pids["test_c_pass_after_failure"])


def test_passing_tests_share_their_workers(run):
    assert len(run.pids["test_one"]) == 2
    assert run.pids["test_one"] == run.pids["test_two"]


def test_crash_is_named(run):
    report = run.report("test_d_crash_on_rank0")
    assert "rank 0: exited with code 3 without reporting a result" in report


def test_skip_on_some_and_failure_on_others_reports_the_failure(run):
    report = run.report("test_f_skip_some_fail_others")
    assert "RuntimeError: rank 1 fails" in report


def test_leftovers_fail_the_test_that_left_them(run):
    assert "1 thread(s) still running: forgotten-sleeper" in run.report(
        "test_g_leaves_a_thread")
    assert "the class's default process group was destroyed or replaced" in run.report(
        "test_h_destroys_the_group")


def test_runs_under_pytest_too():
    result = run_python(["-m", "pytest", "-q", "-p", "no:cacheprovider",
                         "continuous_faults.py", "-k", "test_a_pass or test_b_fail or test_c_pass"],
                        timeout=300)
    assert "1 failed, 2 passed" in result.output, result.output
    assert result.leftover_pids == []


def test_upstream_names():
    assert distspawn.MultiProcContinousTest is distspawn.MultiProcContinuousTest
    assert issubclass(distspawn.C10dTorchCommsTestBase, distspawn.MultiProcContinuousTest)
    for name in ("backend_str", "opts", "device_type", "run_rank", "_init_pg",
                 "_run_test_given_id"):
        assert callable(getattr(distspawn.MultiProcContinuousTest, name)), name


def test_run_rank_under_mp_spawn():
    result = run_python(["continuous_run_rank.py"], timeout=120)
    assert result.returncode == 0, result.output
    assert "rank 0 of 2 ran test_all_reduce" in result.output
    assert "rank 1 of 2 ran test_all_reduce" in result.output
    assert result.leftover_pids == []


def test_run_rank_under_torchrun():
    result = run_python(["-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                         "2", "continuous_run_rank.py"], timeout=120)
    assert result.returncode == 0, result.output
    assert result.output.count("Ran 2 tests") == 2, result.output
    assert "rank 1 of 2 ran test_all_reduce" in result.output
    if sys.platform == "linux":  # the group and its threads are gone before shutdown
        assert result.output.count("gloo threads at exit: 0") == 2, result.output
    assert result.leftover_pids == []


def test_two_torchrun_nodes_on_loopback(tmp_path):
    """Two torchrun agents on this machine act as two nodes (static rendezvous)."""
    import os
    import signal
    import subprocess
    import sys
    import uuid

    from distspawn import find_free_port
    from harness import MARKER_VAR, SCENARIOS, processes_with_marker

    port = str(find_free_port())
    # Unique: a second suite may run this test at once on the same machine.
    marker = f"two-nodes-{uuid.uuid4().hex}"
    # torchrun's agents leave their torchelastic_* folders (seen on 2.15): in
    # the test's own folder, not the machine's temp folder.
    env = {**os.environ, MARKER_VAR: marker, "TMPDIR": str(tmp_path)}
    agents = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node",
         "1", "--node-rank", str(node), "--master-addr", "127.0.0.1", "--master-port", port,
         "--rdzv-backend", "static", "continuous_run_rank.py"],
        cwd=SCENARIOS, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)  # each agent and its workers: one group to end
        for node in (0, 1)]
    try:
        outputs = [agent.communicate(timeout=120)[0] for agent in agents]
    except subprocess.TimeoutExpired:
        # Seen with torch 2.14 under load: one agent waits in torchrun's exit
        # barrier (300 s) for the other. End both, whole groups, and show both.
        for agent in agents:
            try:
                os.killpg(agent.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        outputs = [agent.communicate()[0] for agent in agents]
        pytest.fail("the two nodes ran past 120 s:\n" + "\n".join(
            f"--- node {node} ---\n{output[-5000:]}" for node, output in enumerate(outputs)))
    for node, (agent, output) in enumerate(zip(agents, outputs)):
        assert agent.returncode == 0, output
        assert f"rank {node} of 2 ran test_all_reduce" in output  # each node, its own rank
        assert "Ran 2 tests" in output and "OK" in output
    assert processes_with_marker(marker) == []


def upstream_lets_nccl_share_devices() -> bool:
    """Whether the installed release's reused workers set the variable (2.15 on).
    Read from its source, not imported: the test process keeps upstream's out."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("torch.testing._internal.common_distributed")
    return "NCCL_MULTI_RANK_GPU_ENABLE" in Path(spec.origin).read_text()


def test_a_reused_nccl_world_larger_than_the_gpu_count_may_share_devices():
    # On a machine with at least 2 GPUs the world fits: nothing is set, as upstream.
    import torch

    if torch.accelerator.device_count() >= 2:
        pytest.skip("the world of 2 fits on this machine's GPUs")
    nccl_built = torch.distributed.is_nccl_available()
    runs = {"distspawn": run_python(["nccl_shared_device.py", "-v"])}
    if nccl_built and upstream_lets_nccl_share_devices():
        runs["upstream"] = run_python_on_upstream(["nccl_shared_device.py", "-v"],
                                                  env={"UPSTREAM_HARNESS": "1"})
    for harness, run in runs.items():
        nccl_verdict = run.verdict_line("test_ranks_may_share_a_device").rsplit(" ... ", 1)[1]
        if nccl_built:
            assert nccl_verdict == "ok", (harness, run.output)
        else:  # a CPU build: the class skips before any rank starts, as on upstream
            assert nccl_verdict.startswith("skipped"), (harness, run.output)
        assert run.verdict_line("test_nothing_set_for_gloo").endswith("ok"), (harness, run.output)
        assert run.leftover_pids == [], harness
