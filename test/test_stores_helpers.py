"""Stores, retries, test-data helpers and DDP fixtures, checked directly."""

import multiprocessing
import socket
import sys
import unittest

import pytest

from harness import needs_gpus
import torch
import torch.distributed as dist

import distspawn
from distspawn import models, stores
from distspawn.fixtures.helpers import _build_multidim_tensor, _build_tensor


def test_find_free_port_can_be_bound():
    port = stores.find_free_port()
    with socket.socket() as sock:
        sock.bind(("localhost", port))


def test_retry_on_connect_failures_retries_only_connect_errors(monkeypatch):
    monkeypatch.setattr(stores.time, "sleep", lambda seconds: None)
    calls = []

    @distspawn.retry_on_connect_failures
    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise RuntimeError("bind: Address already in use")
        return "bound"

    assert flaky() == "bound" and len(calls) == 3

    other = []

    @distspawn.retry_on_connect_failures
    def broken():
        # Upstream's default iterates its error string character by character,
        # so an error containing an "A" or "d" was retried ten times.
        other.append(1)
        raise RuntimeError("A different error entirely")

    with pytest.raises(RuntimeError, match="A different error entirely"):
        broken()
    assert len(other) == 1


def test_retry_gives_up_after_ten_tries(monkeypatch):
    monkeypatch.setattr(stores.time, "sleep", lambda seconds: None)
    calls = []

    @distspawn.retry_on_connect_failures(connect_errors=distspawn.CONNECT_TIMEOUT)
    def never():
        calls.append(1)
        raise RuntimeError("connect() timed out.")

    with pytest.raises(RuntimeError, match="Failing after 10 retries"):
        never()
    assert len(calls) == 10


def test_retry_rejects_bad_connect_errors():
    with pytest.raises(ValueError, match="connect_errors must be"):
        distspawn.retry_on_connect_failures(connect_errors=[])


def test_create_tcp_store_works_on_an_os_chosen_port():
    store = distspawn.create_tcp_store()
    assert store.port > 0
    store.set("key", "value")
    assert store.get("key") == b"value"


def test_create_device_is_a_gloo_device():
    assert distspawn.create_device() is not None


def test_captured_output():
    with distspawn.captured_output() as (out, err):
        print("to stdout")
        print("to stderr", file=sys.stderr)
    assert out.getvalue() == "to stdout\n" and err.getvalue() == "to stderr\n"


@pytest.mark.parametrize("world_size, num_inputs", [(2, 1), (3, 2)])
def test_sparse_cases_sum_to_their_expected_values(world_size, num_inputs):
    per_rank = [distspawn.simple_sparse_reduce_tests(r, world_size, num_inputs)
                for r in range(world_size)]
    assert len(per_rank[0]) == 6
    for case in range(6):
        total = sum(inp.to_dense() for rank in per_rank for inp in rank[case][0])
        for expected in per_rank[0][case][1]:
            assert torch.equal(expected.to_dense(), total)


def test_init_multigpu_helper_skips_instead_of_empty_lists():
    if torch.cuda.device_count() >= 2:
        assert distspawn.init_multigpu_helper(2, "nccl") == {0: [0], 1: [1]}
        return
    with pytest.raises(unittest.SkipTest, match=needs_gpus(2)):
        distspawn.init_multigpu_helper(2, "nccl")


def test_verify_ddp_error_logged():
    class FakeDDP:
        def _get_ddp_logging_data(self):
            return {"iteration": 1, "has_error": 1, "error": "bad things happened"}

    distspawn.verify_ddp_error_logged(FakeDDP(), "bad things\nException raised from x")
    with pytest.raises(AssertionError, match="Did not find expected other"):
        distspawn.verify_ddp_error_logged(FakeDDP(), "other")


def test_run_subtests_runs_every_combination():
    seen = []

    class Case(unittest.TestCase):
        def runTest(self):
            distspawn.run_subtests(self, {"a": [1, 2], "b": ["x", "y"]},
                                   lambda tag, a, b: seen.append((tag, a, b)), "t")

    result = unittest.TestResult()
    Case().run(result)
    assert result.wasSuccessful()
    assert seen == [("t", 1, "x"), ("t", 1, "y"), ("t", 2, "x"), ("t", 2, "y")]


def test_efa_probe_and_transports():
    assert isinstance(distspawn.has_efa(), bool)
    assert distspawn.tp_transports() in (None, ["shm", "uv"])


def test_tensor_builders():
    assert torch.equal(_build_tensor(3), torch.full((3, 3, 3), 3.0))
    built = _build_multidim_tensor(4, 2, value=7, dtype=torch.int64)
    assert built.shape == (2, 2, 2, 2) and built.dtype == torch.int64 and (built == 7).all()


def _put_then_exit(q):
    q.put("result")


def _exit_silently(q):
    pass


def test_retrieve_result_from_completion_queue():
    context = multiprocessing.get_context("fork")
    q = context.Queue()
    proc = context.Process(target=_put_then_exit, args=(q,))
    proc.start()
    assert distspawn.retrieve_result_from_completion_queue(proc, q, timeout=30) == "result"
    proc.join()
    q2 = context.Queue()
    silent = context.Process(target=_exit_silently, args=(q2,))
    silent.start()
    silent.join()
    outcome = distspawn.retrieve_result_from_completion_queue(silent, q2, timeout=1)
    assert isinstance(outcome, RuntimeError) and "Exited with 0" in str(outcome)


@pytest.mark.parametrize("build, inputs", [
    (models.Net, lambda: torch.randn(4, 2)),
    (models.LargeNet, lambda: torch.randn(2, 1000)),
    (models.Task, lambda: torch.randn(2, 2)),
    (models.BatchNormNet, lambda: torch.randn(8, 2)),
    (lambda: models.BatchNormNet(affine=False), lambda: torch.randn(8, 2)),
    (models.NetWithBuffers, lambda: torch.randn(3, 10)),
    (models.TwoLinLayerNet, lambda: torch.randn(3, 10)),
    (models.UnusedParamTwoLinLayerNet, lambda: torch.randn(3, 10)),
    (models.DictOutputModule, lambda: torch.randn(3, 10)),
    (lambda: models.EmbeddingNetDifferentParams(0), lambda: torch.tensor([1, 2, 3])),
    (lambda: models.EmbeddingNetDifferentParams(1, diff_num_params=True),
     lambda: torch.tensor([1, 2])),
    (models.ControlFlowToyModel, lambda: torch.ones(20, 10)),
    (models.ControlFlowToyModel, lambda: torch.zeros(20, 10)),
    (lambda: models.SaveForwardInputsModel({}, cast_forward_inputs=True),
     lambda: torch.randn(2, 100, dtype=torch.float64)),
])
def test_models_run_forward_and_backward(build, inputs):
    model = build()
    out = model(inputs())
    if isinstance(out, dict):
        out = out["loss"]
    if isinstance(out, tuple):
        out = sum(o.sum() for o in out)
    out.sum().backward()
    assert any(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_model_fixture_shapes_match_upstream():
    net = models.Net()
    assert not net.fc2.fc.bias.requires_grad and not net.no_grad_param.requires_grad
    assert models.EmbeddingNetDifferentParams(0).embedding.embedding_dim == 500
    assert models.EmbeddingNetDifferentParams(1).embedding.embedding_dim == 50
    forward_inputs = {}
    model = models.SaveForwardInputsModel(forward_inputs, cast_forward_inputs=False)
    model(torch.randn(1, 100))
    assert set(forward_inputs) == {model, model.c1, model.c2}


def test_shared_instances_are_lazy_and_built_once():
    assert "DDP_NET" not in vars(models)
    assert models.DDP_NET is models.DDP_NET
    assert isinstance(models.ONLY_SBN_NET, torch.nn.SyncBatchNorm)
    assert models.COLLECTIVES_OBJECT_TEST_LIST[1] == models.f
    assert models.Foo(torch.ones(2)) == models.Foo(torch.ones(2))
    assert not models.Foo(torch.ones(2)) == models.Foo(torch.zeros(2))


def test_named_tuple_inputs_are_not_collected_as_tests():
    assert models.TestNamedTupleInput_0.__test__ is False
    assert models.TestNamedTupleInput_1(torch.ones(1), torch.ones(1)).a is not None


def test_lazy_flags_probe_once():
    calls = []
    flag = distspawn.LazyFlag(lambda: calls.append(1) or True, "FLAG")
    assert "not yet probed" in repr(flag)
    assert flag and flag == True and calls == [1]  # noqa: E712 - comparing the flag itself
    assert repr(flag) == "<FLAG: True>"


def test_accelerator_flags_are_false_without_devices():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert not distspawn.HAS_ACCELERATOR
    assert not distspawn.PLATFORM_SUPPORTS_SYMM_MEM
    assert distspawn.evaluate_platform_supports_symm_mem() is False


def test_dist_test_cases_tables():
    cases = distspawn.DistTestCases
    assert cases.skip_collective["sendrecv anysource"] == {"nccl", "ucc", "xccl"}
    assert cases.backend_feature["ddp"] == {"nccl", "gloo", "ucc"}
    assert cases.backend_feature["plugin"] == set()


def test_plugin_backend_counts_as_available(monkeypatch):
    from distspawn import dist_backend

    monkeypatch.setitem(dist_backend.DistTestCases.backend_feature, "plugin", {"mybackend"})
    assert dist_backend.backend_is_available("mybackend")
    assert "mybackend" in dist_backend.known_backends()
    assert not dist_backend.backend_is_available("mpi") or dist.is_mpi_available()


@pytest.mark.parametrize("make", ["_create_torch_profiler", "_create_autograd_profiler"])
def test_profiler_helpers_find_the_collective(make, tmp_path, monkeypatch):
    from distspawn import helpers

    monkeypatch.setattr(helpers.tempfile, "tempdir", str(tmp_path))
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with getattr(helpers, make)() as prof:
            dist.all_reduce(torch.ones(3))
        names = [event.name for event in helpers.get_profiling_event("gloo:all_reduce", prof)]
        assert names == ["gloo:all_reduce"]
        if make == "_create_torch_profiler":
            assert isinstance(helpers.get_profiler_nccl_meta(prof), list)
            assert list(tmp_path.glob("distspawn-trace-*")) == []  # the exported trace is removed
    finally:
        dist.destroy_process_group()


def test_get_timeout_reads_the_override_table():
    from distspawn import distributed_test

    assert distributed_test.CUSTOMIZED_TIMEOUT is distspawn.TIMEOUT_OVERRIDE
    assert distspawn.get_timeout("mod.Cls.test_DistributedDataParallel") == 500
    assert distspawn.get_timeout("mod.Cls.test_other") == distspawn.TIMEOUT_DEFAULT


def _hang(q):
    import time as _time
    _time.sleep(60)


def test_completion_queue_times_out_and_wakes_promptly():
    import time

    context = multiprocessing.get_context("fork")
    q = context.Queue()
    proc = context.Process(target=_hang, args=(q,))
    proc.start()
    try:
        started = time.monotonic()
        outcome = distspawn.retrieve_result_from_completion_queue(proc, q, timeout=1)
        assert isinstance(outcome, RuntimeError) and "timed out" in str(outcome)
        assert time.monotonic() - started < 5
    finally:
        proc.kill()
        proc.join()
