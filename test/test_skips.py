"""Skip codes and decorators: upstream's values, no KeyError, env restored exactly."""

import json
import os
import subprocess
import sys
import unittest

import pytest

import distspawn
from distspawn import TEST_SKIPS, skip_if_lt_x_gpu, with_nccl_blocking_wait
from distspawn.engine.exit_codes import skip_message_for
from distspawn.fixtures.skips import environ_overrides, gpu_count_skip


GPU_COUNT_CODES = {1: 75, 2: 77, 3: 80, 4: 81, 5: 82, 6: 83, 7: 84, 8: 85}


def test_codes_and_messages_are_upstreams_in_both_spellings():
    # multi-gpu-N up to torch 2.13, multi-device-N from 2.14: files written
    # for either release find theirs.
    codes = {name: skip.exit_code for name, skip in TEST_SKIPS.items()}
    assert codes == {
        "backend_unavailable": 72, "small_worldsize": 73, "odd_worldsize": 87, "no_cuda": 74,
        "nccl": 76, "skipIfRocm": 78, "no_peer_access": 79, "generic": 86, "importerror": 88,
        "no_accelerator": 89,
        **{f"multi-gpu-{n}": code for n, code in GPU_COUNT_CODES.items()},
        **{f"multi-device-{n}": code for n, code in GPU_COUNT_CODES.items()},
    }
    assert TEST_SKIPS["multi-gpu-2"].message == "Need at least 2 CUDA devices"
    assert TEST_SKIPS["multi-device-2"].message == "Need at least 2 accelerator devices"
    assert TEST_SKIPS["multi-device-1"].message == "Need at least 1 accelerator device"
    assert distspawn.TEST_ERROR_EXIT_CODE == 10
    assert distspawn.DEFAULT_WORLD_SIZE == 4


def _upstreams_skips():
    probe = subprocess.run(
        [sys.executable, "-c", "import json; from torch.testing._internal.common_distributed "
         "import TEST_SKIPS as T; print(json.dumps({k: [v.exit_code, v.message] "
         "for k, v in T.items()}))"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip("upstream's harness does not import here")
    return json.loads(probe.stdout.splitlines()[-1])


def test_every_upstream_skip_is_here_and_a_code_reads_as_the_installed_release_says():
    upstream = _upstreams_skips()
    for name, (code, message) in upstream.items():
        assert (TEST_SKIPS[name].exit_code, TEST_SKIPS[name].message) == (code, message), name
        assert skip_message_for(code) == message, name
    count_key = next(k for k in upstream if k.endswith("-2") and k.startswith("multi-"))
    assert gpu_count_skip(2) == TEST_SKIPS[count_key]


def test_more_than_eight_gpus_does_not_keyerror():
    assert gpu_count_skip(16).message in ("Need at least 16 CUDA devices",
                                          "Need at least 16 accelerator devices")
    assert gpu_count_skip(16).exit_code == 85

    @skip_if_lt_x_gpu(16)
    def needs_many():
        raise AssertionError("must not run")

    with pytest.raises(unittest.SkipTest, match="Need at least 16 (CUDA|accelerator) devices"):
        needs_many()  # outside a rank process a skip is a SkipTest, not sys.exit


def test_allow_cpu_runs_on_a_cpu_only_machine():
    ran = []
    skip_if_lt_x_gpu(2, allow_cpu=True)(lambda: ran.append(1))()
    assert ran == [1]


@pytest.mark.parametrize("before", [None, "0"])
def test_nccl_blocking_wait_restores_exactly(monkeypatch, before):
    for name in ("TORCH_NCCL_BLOCKING_WAIT", "TORCH_NCCL_ASYNC_ERROR_HANDLING"):
        if before is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, before)
    seen = {}

    @with_nccl_blocking_wait
    def body():
        seen["blocking"] = os.environ.get("TORCH_NCCL_BLOCKING_WAIT")
        seen["async"] = os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING")

    body()
    assert seen == {"blocking": "1", "async": None}
    assert os.environ.get("TORCH_NCCL_BLOCKING_WAIT") == before
    assert os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING") == before


def test_environ_overrides_restore_after_an_exception(monkeypatch):
    monkeypatch.delenv("DISTSPAWN_X", raising=False)
    with pytest.raises(RuntimeError):
        with environ_overrides({"DISTSPAWN_X": "1"}):
            raise RuntimeError
    assert "DISTSPAWN_X" not in os.environ


def test_small_and_odd_worldsize_read_the_environment(monkeypatch):
    monkeypatch.setenv("BACKEND", "gloo")
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(unittest.SkipTest, match="odd world size"):
        distspawn.skip_if_odd_worldsize(lambda: None)()
    with pytest.raises(unittest.SkipTest, match="small world size"):
        distspawn.skip_if_small_worldsize(lambda: None)()
    monkeypatch.setenv("WORLD_SIZE", "many")
    with pytest.raises(ValueError, match="WORLD_SIZE='many' is not an integer"):
        distspawn.skip_if_odd_worldsize(lambda: None)()


def test_small_and_odd_worldsize_fail_as_upstreams_where_the_environment_lacks_them(monkeypatch):
    class Ours:
        world_size = 2

    class RunUnchanged(Ours):  # the stand-in mode's classes give upstream's verdicts
        upstream_verdicts = True

    def outcome(decorator, test):
        try:
            decorator(lambda self: None)(test)
        except unittest.SkipTest:
            return "skip"
        except KeyError as missing:
            return f"KeyError {missing}"
        return "ran"

    small, odd = distspawn.skip_if_small_worldsize, distspawn.skip_if_odd_worldsize
    monkeypatch.delenv("BACKEND", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert [outcome(small, RunUnchanged()), outcome(odd, RunUnchanged())] == [
        "KeyError 'BACKEND'"] * 2
    # distspawn's own read the class's world size: 2 is small, and even.
    assert [outcome(small, Ours()), outcome(odd, Ours())] == ["skip", "ran"]
    monkeypatch.setenv("BACKEND", "gloo")
    assert outcome(odd, RunUnchanged()) == "KeyError 'WORLD_SIZE'"
    monkeypatch.setenv("BACKEND", "mpi")  # upstream reads no WORLD_SIZE for MPI
    assert outcome(odd, RunUnchanged()) == "ran"


def test_requires_decorators_skip_missing_backends():
    nccl = distspawn.requires_nccl()(lambda: None)
    assert getattr(nccl, "__unittest_skip__", False) is not distspawn.fixtures.skips.c10d.is_nccl_available()


def test_get_timeout_uses_overrides():
    assert distspawn.get_timeout("a.B.test_ddp_uneven_inputs") == 400
    assert distspawn.get_timeout("a.B.test_other") == distspawn.TIMEOUT_DEFAULT
