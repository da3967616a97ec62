"""The zero-change mode: a file written for upstream's harness (and the bases on
it) runs on distspawn's engine without an edit, with upstream's verdicts.

Each run is compared with the same file on upstream's harness, in this run.
"""

import re

import pytest

from harness import (
    needs_gpus,
    run_python,
    run_python_on_upstream,
    skip_unless_upstream_runs,
    upstream_lacks,
)

pytest.importorskip("torch.testing._internal.common_utils",
                    reason="upstream's harness does not import here (expecttest missing?)")

FILE = "upstream_derived.py"
EXPECTED = {
    "DTensorOnRanks::test_shard_then_replicate": "PASSED",
    "DTensorOnRanks::test_rank_2_disagrees": "FAILED",
    "DTensorOnRanks::test_wants_eight_gpus": "SKIPPED",
    "PerDeviceTypeCPU::test_mesh_on_cpu": "PASSED",
    "AllRanksInOneProcess::test_local_tensor_mode": "PASSED",
    "DTensorOnThreads::test_shard_on_threads": "PASSED",
    "PlainProcesses::test_all_reduce": "PASSED",
    "FSDPOnRanks::test_fully_shard": "SKIPPED",  # upstream's FSDPTest wants 2 GPUs
    "FSDPOnThreads::test_fully_shard_on_threads": "PASSED",
}
FSDP_TEST = "FSDPOnRanks::test_fully_shard"


def expected(upstream_fsdp_verdict: str) -> dict[str, str]:
    found = dict(EXPECTED)
    if upstream_lacks("torch.testing._internal.distributed._tensor.common_dtensor",
                      ("LocalDTensorTestBase",)):  # torch 2.8: the file leaves the class out
        del found["AllRanksInOneProcess::test_local_tensor_mode"]
    # torch 2.8's FSDPTest runs on CPU; later releases' skip without 2 GPUs.
    if upstream_fsdp_verdict == "PASSED":
        found[FSDP_TEST] = "PASSED"
    return found


# Only distspawn's failure report says this (upstream prints its own repro line).
DISTSPAWN_REPORT = "Re-run just this test:"
FALLBACK = "running on upstream's harness unchanged"


def verdicts(output: str) -> dict[str, str]:
    # A rank's warning can land between a test's name and its verdict (a CUDA
    # build without a GPU warns "No CUDA runtime is found" at import).
    return {name: verdict for name, verdict in re.findall(
        r"::(\w+::\w+) (?:[^\n]*\n)??[^\n]*?\b(PASSED|FAILED|SKIPPED)\b[^\n]*\[\s*\d+%\]", output)}


def pytest_run(*extra: str, env: dict | None = None):
    stand_in = "--distspawn-stand-in" in extra or "DISTSPAWN_STAND_IN" in (env or {})
    runner = run_python if stand_in else run_python_on_upstream
    return runner(["-m", "pytest", "-v", "-p", "no:cacheprovider", FILE, *extra], env=env)


def test_same_verdicts_as_upstream_on_distspawns_engine():
    upstream = pytest_run()
    stand_in = pytest_run("--distspawn-stand-in", "-rs")
    theirs = verdicts(upstream.output)
    assert theirs == expected(theirs.get(FSDP_TEST)), upstream.output
    assert verdicts(stand_in.output) == theirs, stand_in.output
    # The failure is reported by distspawn (the rank and its assertion), not upstream.
    assert DISTSPAWN_REPORT not in upstream.output
    assert DISTSPAWN_REPORT in stand_in.output
    assert "rank 2 disagrees" in stand_in.output
    if theirs[FSDP_TEST] == "SKIPPED":
        assert needs_gpus(2) in stand_in.output  # upstream FSDPTest's reason
    for run in (upstream, stand_in):
        assert FALLBACK not in run.output
        assert run.leftover_pids == []
    assert stand_in.leftover_files == []  # (upstream's run leaves temp dirs behind)


def test_the_environment_variable_asks_for_it_too():
    run = pytest_run("-k", "rank_2 or PlainProcesses", env={"DISTSPAWN_STAND_IN": "1"})
    assert verdicts(run.output) == {"DTensorOnRanks::test_rank_2_disagrees": "FAILED",
                                    "PlainProcesses::test_all_reduce": "PASSED"}, run.output
    assert DISTSPAWN_REPORT in run.output


def test_a_file_run_as_a_script():
    run = run_python(["-m", "distspawn.stand_in", FILE, "DTensorOnRanks", "PlainProcesses"],
                     timeout=300)
    assert run.returncode == 1, run.output
    assert "Ran 4 tests" in run.output and "FAILED (failures=1, skipped=1)" in run.output
    assert DISTSPAWN_REPORT in run.output and "rank 2 disagrees" in run.output
    assert run.leftover_pids == []


def test_too_late_to_stand_in_says_why_and_leaves_upstream_alone():
    # A plugin imported upstream's DTensor base before the mode could act.
    run = pytest_run("-p", "upstream_first", "--distspawn-stand-in", "-k", "rank_2")
    assert FALLBACK in run.output, run.output
    assert "common_dtensor was imported before" in run.output, run.output
    assert verdicts(run.output) == {"DTensorOnRanks::test_rank_2_disagrees": "FAILED"}
    assert DISTSPAWN_REPORT not in run.output  # upstream's harness ran it
    assert run.leftover_pids == []


def test_a_plugin_that_imported_distspawn_first_does_not_keep_the_mode_out():
    # -p plugins are imported before the flag sets DISTSPAWN_STAND_IN, so that
    # import of distspawn did not stand in: the file ran on upstream's harness,
    # its verdicts the same, without a word, at upstream's speed.
    run = pytest_run("-p", "distspawn_first", "--distspawn-stand-in", "-k", "rank_2")
    assert verdicts(run.output) == {"DTensorOnRanks::test_rank_2_disagrees": "FAILED"}
    assert DISTSPAWN_REPORT in run.output and FALLBACK not in run.output, run.output
    assert run.leftover_pids == [] and run.leftover_files == []


def test_a_bad_value_is_one_clear_error_before_anything_starts():
    run = run_python(["-m", "pytest", "-q", "-p", "no:cacheprovider", FILE],
                     env={"DISTSPAWN_STAND_IN": "maybe"}, timeout=120)
    assert run.returncode == 4  # pytest's usage error
    assert "DISTSPAWN_STAND_IN='maybe': expected 1" in run.output, run.output
    assert "Traceback" not in run.output
    assert run.leftover_pids == [] and run.leftover_files == []


@pytest.mark.parametrize("args, message", [
    ([], "usage: python -m distspawn.stand_in TEST_FILE.py"),
    (["no_such_file.py"], "TEST_FILE='no_such_file.py': no such file"),
])
def test_the_script_runner_says_what_it_needs(args, message):
    run = run_python(["-m", "distspawn.stand_in", *args], timeout=120)
    assert run.returncode == 2 and message in run.output, run.output


def test_a_run_that_never_imports_upstreams_harness_pays_nothing_for_the_mode():
    run = run_python(["-m", "pytest", "-q", "-p", "no:cacheprovider", "--distspawn-stand-in",
                      "stand_in_untouched.py"], timeout=120, warm=False)  # what it imports
    assert run.returncode == 0 and "1 passed" in run.output, run.output
    assert run.leftover_pids == [] and run.leftover_files == []


def test_switched_imports_beside_upstreams_device_type_bases_run_on_distspawn():
    # instantiate_device_type_tests puts upstream's TestCase first in the
    # class's MRO; its setUp calls no super(), and used to hide distspawn's.
    run = run_python(["-m", "pytest", "-q", "-p", "no:cacheprovider", "device_type_mix.py"],
                     timeout=120)
    assert run.returncode == 0 and "1 passed" in run.output, run.output
    assert run.leftover_pids == [] and run.leftover_files == []


DEVICE_FILE = "continuous_device_type.py"


def device_type_verdicts(run) -> dict[str, str]:
    found = dict(re.findall(r"::(\w+::\w+) (PASSED|FAILED|SKIPPED)", run.output))
    assert len(found) == 2, run.output
    return found


def test_reused_ranks_take_upstreams_device_type_in_the_stand_in_mode():
    # Upstream's MultiProcContinuousTest.device_type() names the build's
    # accelerator, device or not; distspawn's names one ranks can use.
    import torch

    from distspawn.fixtures.device_probe import accelerator_type, build_accelerator_type

    if accelerator_type() is not None:
        pytest.skip("a machine with an accelerator: both rules name it")
    skip_unless_upstream_runs(DEVICE_FILE)
    command = ["-m", "pytest", "-v", "-p", "no:cacheprovider", DEVICE_FILE]
    upstream = device_type_verdicts(run_python_on_upstream(command))
    stand_in = device_type_verdicts(run_python([*command, "--distspawn-stand-in"],
                                               timeout=300))
    switched = device_type_verdicts(run_python(command, env={"SWITCHED": "1"}, timeout=300))
    assert stand_in == upstream
    assert switched == {"OneRankPerDevice::test_all_reduce": "PASSED",
                        "TwoRanks::test_tensor_on_the_device_type": "PASSED"}
    if build_accelerator_type() is None:  # a CPU build: the rules agree
        assert upstream == switched
    else:  # e.g. a CUDA build without a GPU, most CI runners
        assert upstream == {"OneRankPerDevice::test_all_reduce": "SKIPPED",
                            "TwoRanks::test_tensor_on_the_device_type": "FAILED"}, \
            torch.__version__


def test_reused_ranks_without_a_world_size_get_upstreams_one_per_device_on_the_cpu(tmp_path):
    # Upstream's MultiProcContinuousTest with no world_size starts one rank per
    # device: torch.cpu.device_count() is 1. The stand-in mode keeps that (as
    # pytorch's tensor/test_optimizers.py, whose 2-D mesh test fails on one
    # rank); distspawn's own rule starts four on the CPU. Either way the rank
    # server, started while pytest collects, stays up for the class: it was
    # stopped at the end of collection as if the class started no rank.
    from distspawn.fixtures.device_probe import accelerator_type, build_accelerator_type

    if accelerator_type() is not None:
        pytest.skip("a machine with an accelerator: one rank per device there")
    plain = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "OneRankPerDevice", DEVICE_FILE]
    command = [*plain, "-p", "count_server_starts"]

    def world_sizes(run, log):
        assert run.returncode == 0, run.output
        assert run.leftover_pids == [] and run.leftover_files == []
        return log.read_text().split() if log.exists() else []

    log = tmp_path / "switched.log"
    run = run_python(command, env={"SWITCHED": "1", "WORLD_SIZE_LOG": str(log)}, timeout=300,
                     warm=False)  # it counts the server's early starts
    assert world_sizes(run, log) == ["4"], run.output
    assert "rank server starts: 1," in run.output, run.output
    if build_accelerator_type() is not None:
        return  # a CUDA build without a GPU: upstream's class skips (the test above)
    log = tmp_path / "stand_in.log"
    run = run_python([*command, "--distspawn-stand-in"], env={"WORLD_SIZE_LOG": str(log)},
                     timeout=300)
    assert world_sizes(run, log) == ["1"], run.output
    assert "rank server starts: 1," in run.output, run.output
    skip_unless_upstream_runs(DEVICE_FILE)
    log = tmp_path / "upstream.log"
    run = run_python_on_upstream(plain, env={"WORLD_SIZE_LOG": str(log)})
    assert world_sizes(run, log) == ["1"], run.output


def test_a_run_whose_rank_tests_all_skip_ends_the_server_started_on_a_guess():
    # pytest starts the rank server as it reaches a file naming a rank class,
    # before it knows whether a test will run: the file's test checks that the
    # server is gone once collection showed none starts ranks.
    run = run_python(["-m", "pytest", "-q", "-p", "no:cacheprovider", "--distspawn-stand-in",
                      "upstream_all_skipped.py"], timeout=120)
    assert run.returncode == 0 and "1 passed, 1 skipped" in run.output, run.output
    assert run.leftover_pids == [] and run.leftover_files == []


def test_a_skip_name_of_another_release_fails_as_on_upstream():
    # distspawn's TEST_SKIPS spells "needs N devices" both ways (files of either
    # release run with its imports); files run unchanged see the installed
    # release's table only, as upstream's harness gives them.
    from distspawn.engine.releases import upstream_says_multi_device

    names = ["multi-device-2", "multi-gpu-2"]
    if not upstream_says_multi_device():
        names.reverse()
    env = {"SKIP_NAMES": ",".join(names)}
    run = [runner(["-m", "pytest", "-v", "-p", "no:cacheprovider", "skip_names_by_release.py",
                   *extra], env=env)
           for runner, extra in ((run_python_on_upstream, []),
                                 (run_python, ["--distspawn-stand-in"]))]
    wanted = {"SkipsByName::test_installed_releases_name": "SKIPPED",
              "SkipsByName::test_other_releases_name": "FAILED"}
    assert verdicts(run[0].output) == wanted, run[0].output
    assert verdicts(run[1].output) == wanted, run[1].output
    assert f"KeyError: '{names[1]}" in run[1].output, run[1].output


def test_a_file_with_distspawns_imports_keeps_both_skip_names_in_a_stand_in_run():
    # The same run collects a file run unchanged (upstream's table: the other
    # release's name fails) and one with distspawn's imports (both skip).
    from distspawn.engine.releases import upstream_says_multi_device

    names = ["multi-device-2", "multi-gpu-2"]
    if not upstream_says_multi_device():
        names.reverse()
    run = run_python(["-m", "pytest", "-v", "-p", "no:cacheprovider", "--distspawn-stand-in",
                      "skip_names_by_release.py", "skip_names_with_distspawn.py"],
                     env={"SKIP_NAMES": ",".join(names)}, timeout=300)
    assert verdicts(run.output) == {
        "SkipsByName::test_installed_releases_name": "SKIPPED",
        "SkipsByName::test_other_releases_name": "FAILED",
        "SkipsByNameWithDistspawn::test_installed_releases_name": "SKIPPED",
        "SkipsByNameWithDistspawn::test_other_releases_name": "SKIPPED"}, run.output
    assert run.leftover_pids == [] and run.leftover_files == []


INFINITIES = "assert_equal_infinities.py"


def test_assert_equal_is_upstreams_in_the_stand_in_mode():
    # Re-based on upstream's TestCase, distspawn's defers to upstream's
    # assertEqual: its wording ("Scalars are not close!") shows which one ran.
    command = ["-m", "pytest", "-v", "-p", "no:cacheprovider", "-p", "no:randomly", INFINITIES]
    upstream = run_python_on_upstream(command)
    stand_in = run_python([*command, "--distspawn-stand-in"], timeout=300)
    switched = run_python(command, env={"SWITCHED": "1"}, timeout=300)
    found = {"Infinities::test_equal_infinities": "PASSED",
             "Infinities::test_opposite_infinities": "FAILED"}
    for run in (upstream, stand_in, switched):
        assert verdicts(run.output) == found, run.output
        assert run.leftover_pids == []
    assert "Scalars are not close!" in stand_in.output
    assert "scalars are not close: inf != -inf" in switched.output
