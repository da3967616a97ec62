"""A broken or missing torchvision becomes a skip; the Dynamo bases work without GPUs."""

import importlib.util

import pytest

from distspawn.fixtures.device_probe import has_accelerator
from harness import SCENARIOS, run_python


# The scenario's Dynamo bases expect no accelerator: with one, upstream's (and
# so distspawn's) set a device per rank and pick its backend.
ACCELERATOR = has_accelerator()


@pytest.fixture(scope="module")
def broken_vision_run():
    only = ["VisionTest"] if ACCELERATOR else []
    return run_python(["optional_and_dynamo.py", "-v", *only],
                      env={"PYTHONPATH": str(SCENARIOS / "broken_torchvision")})


def test_broken_torchvision_is_a_skip_with_its_error(broken_vision_run):
    run = broken_vision_run
    assert run.returncode == 0, run.output
    assert ("skipped 'no torchvision (RuntimeError: operator torchvision::nms does not exist)'"
            in run.verdict_line("test_uses_torchvision"))
    assert "HAS_TORCHVISION=False" in run.output


def test_missing_torchvision_is_a_skip():
    if importlib.util.find_spec("torchvision") is not None:
        pytest.skip("torchvision is installed here")
    run = run_python(["optional_and_dynamo.py", "-v", "VisionTest"])
    assert run.returncode == 0, run.output
    assert "no torchvision (ModuleNotFoundError: No module named" in run.verdict_line(
        "test_uses_torchvision")


@pytest.mark.skipif(ACCELERATOR, reason="the scenario's Dynamo bases expect no accelerator")
def test_dynamo_bases_without_accelerators(broken_vision_run):
    run = broken_vision_run
    assert run.verdict_line("test_world_of_one").endswith("... ok")
    assert run.verdict_line("test_per_rank_init").endswith("... ok")
    import torch
    if torch.accelerator.device_count() == 0:
        assert "torch.accelerator found none" in run.verdict_line("test_runs_per_accelerator")
    assert run.leftover_pids == [] and run.leftover_files == []
