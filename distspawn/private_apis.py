"""Every private torch, pytest or Python API distspawn touches, in one list.

Each use in the package sits behind a guard; this list says where each name
is used and what happens when a release no longer has it. ``test/test_private_apis.py``
checks the list both ways: every name here resolves on the installed releases
(or is marked as allowed to be missing), and every private name the package
reaches for is listed here. ``python -m distspawn.private_apis`` prints what is
missing on this machine.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PrivateAPI:
    """One private name: where distspawn uses it and what missing it costs."""

    path: str  # dotted, from an importable module
    used_by: str
    when_missing: str
    may_be_missing: bool = False  # e.g. only in some builds (symmetric memory, torchcomms)
    # Parameters distspawn passes by keyword: a release that renames one breaks
    # the call even though the name itself still resolves.
    takes: tuple[str, ...] = ()


PRIVATE_APIS: tuple[PrivateAPI, ...] = (
    PrivateAPI("torch.distributed.distributed_c10d._World", "backends.threaded_pg",
               "threaded tests skip, naming the missing hook"),
    PrivateAPI("torch.distributed.distributed_c10d._world", "backends.threaded_pg, "
               "multi_threaded_pg, engine.group_keeper, engine.collective_log, engine.reduce_ops",
               "threaded tests skip, naming the missing hook; a rank keeps only the groups "
               "destroy_process_group() is given by name (see engine.group_keeper)"),
    PrivateAPI("torch._C._distributed_c10d._set_thread_isolation_mode", "backends.threaded_pg",
               "threaded tests skip, naming the missing hook"),
    PrivateAPI("torch.distributed.Backend._plugins", "backends.threaded_pg, "
               "backends.fake_backend",
               "the threaded backend is registered again at every install, and the fake "
               "backend's creator replaces torch's own (both harmless)"),
    PrivateAPI("torch._C._distributed_c10d.FakeProcessGroup", "backends.fake_backend",
               "distspawn.fake_pg cannot make fake groups; tests using them fail with "
               "torch's 'unknown backend' error"),
    PrivateAPI("torch._C._distributed_c10d.FakeProcessGroup._create_internal",
               "backends.fake_backend",
               "fake groups are made with the older (rank, size) constructor",
               may_be_missing=True),
    PrivateAPI("torch._C._distributed_c10d._dump_fr_trace_json", "engine.collective_log",
               "process ranks record no collectives: a stall is judged at the deadline "
               "only, and reports show stacks without the calls each rank made"),
    PrivateAPI("torch.distributed.ProcessGroup._get_sequence_number_for_group",
               "engine.reduce_ops", "reduce ops that differ in calls that complete go unseen "
               "(the test passes, as on upstream's harness)"),
    PrivateAPI("torch.distributed._functional_collectives.traceable_collective_remaps",
               "engine.reduce_ops", "as for _get_sequence_number_for_group: the calls are "
               "not wrapped, since torch.compile would trace a wrapper it cannot rewrite"),
    PrivateAPI("torch._C._distributed_c10d._dump_nccl_trace_json", "engine.collective_log",
               "as for _dump_fr_trace_json, for nccl groups (CUDA builds only)",
               may_be_missing=True),
    PrivateAPI("torch._C._ensureCUDADeviceGuardSet", "backends.threaded_pg",
               "a CUDA build with no device: a rank thread's first torch.compile swaps "
               "the CUDA device guard while other rank threads run ops (SIGSEGV on 2.10; "
               "2.8 has no such swap)", may_be_missing=True),
    PrivateAPI("torch._C._set_print_stack_traces_on_fatal_signal", "engine.worker",
               "a crashed rank's report has its Python stack and output, no native frames"),
    PrivateAPI("multiprocessing.forkserver._forkserver._forkserver_alive_fd", "engine.worker",
               "under forkserver, ranks of a SIGKILLed test process end with their test "
               "body instead of at once"),
    PrivateAPI("multiprocessing.forkserver._forkserver._stop",
               "engine.rank_server, early.rank_server_boot",
               "a rank server whose preloaded modules no longer fit the environment "
               "cannot be restarted: ranks start afresh (spawn) for the rest of the run; "
               "one started early for a run that starts no rank goes on importing until "
               "done, then ends by itself"),
    PrivateAPI("multiprocessing.forkserver._forkserver._forkserver_pid",
               "engine.rank_server, early.rank_server_boot",
               "a rank server started early for a run that starts no rank goes on "
               "importing torch after collection, and outlives the test process by "
               "seconds, until done"),
    PrivateAPI("weakref.finalize._registry", "engine.forked_exit",
               "a forked rank leaves without running the at-exit clean-ups of what it "
               "made (a tempfile.TemporaryDirectory left to the exit outlives the test)"),
    PrivateAPI("sys._current_frames", "cases.threaded, engine.collective_log",
               "a rank thread stuck at the deadline is reported without its stack; on "
               "gloo, a send facing a send is judged at the deadline only"),
    PrivateAPI("torch._dynamo.utils.unwrap_if_wrapper", "backends.thread_rng",
               "(read through the wrappers' _torchdynamo_inline attribute) torch.compile "
               "inside a rank thread inlines the random-function wrappers instead, and a "
               "first compile during a threaded test leaves torch.compile unaware of "
               "torch.rand and friends for the rest of the process"),
    PrivateAPI("torch._C._len_torch_function_stack", "backends.thread_rng, cases.global_state",
               "a rank thread's draws all swap its state into the default generator "
               "instead of being handed its generator (same numbers, slower); a test "
               "that leaves a torch function mode pushed passes"),
    PrivateAPI("torch._C._pop_torch_function_stack", "cases.global_state",
               "a test that leaves a torch function mode pushed passes"),
    PrivateAPI("torch._C._get_torch_function_state", "cases.global_state",
               "a test that leaves torch functions switched off passes"),
    PrivateAPI("torch._C._set_torch_function_state", "cases.global_state",
               "a test that leaves torch functions switched off passes"),
    PrivateAPI("torch._C._len_torch_dispatch_stack", "backends.thread_rng",
               "a rank thread's draws all swap its state into the default generator "
               "instead of being handed its generator (same numbers, slower)"),
    PrivateAPI("torch._dynamo.trace_rules.get_tensor_method", "backends.thread_rng",
               "(looked up in sys.modules) a first compile during a threaded test leaves "
               "torch.compile unaware of Tensor.uniform_ and friends for the rest of the "
               "process"),
    PrivateAPI("torch._dynamo.reset", "fixtures.helpers",
               "reset_dynamo does nothing (it only acts once a test imported dynamo)"),
    PrivateAPI("torch._logging._internal.trace_log", "cases.distributed_base",
               "structured trace logging is left as torch configures it"),
    PrivateAPI("torch._C._autograd.DeviceType", "fixtures.accelerators",
               "symmetric-memory support reads as unavailable"),
    PrivateAPI("torch._C._distributed_c10d._SymmetricMemory", "fixtures.accelerators",
               "symmetric-memory support reads as unavailable", may_be_missing=True),
    PrivateAPI("torch.distributed.distributed_c10d._TORCHCOMM_AVAILABLE",
               "fixtures.accelerators", "torchcomms backends read as unavailable",
               may_be_missing=True),
    PrivateAPI("torch.distributed.distributed_c10d._BackendWrapper", "fixtures.accelerators",
               "torchcomms process groups (create_torchcomm_process_group) cannot be made",
               may_be_missing=True),
    PrivateAPI("torch.distributed.distributed_c10d._register_pg_in_world",
               "fixtures.accelerators", "as for _BackendWrapper (2.8 lacks it)",
               may_be_missing=True,
               takes=("backend_name", "store", "group_name", "backend_config", "rank_mapping")),
    PrivateAPI("torch.distributed.ProcessGroup._register_backend", "fixtures.accelerators",
               "as for _BackendWrapper"),
    PrivateAPI("torch.distributed._coalescing_manager", "conformance.collectives",
               "the coalescing conformance test skips", takes=("async_ops",)),
    PrivateAPI("torch.distributed._make_nccl_premul_sum", "conformance.collectives",
               "the premul-sum conformance test skips"),
    PrivateAPI("multiprocessing.Queue()._reader", "fixtures.helpers",
               "retrieve_result_from_completion_queue polls instead of waking on data"),
    PrivateAPI("torch.utils._pytree.tree_flatten", "cases.dtensor, fixtures.dtensor_converter",
               "the DTensor bases do not import (DTensor itself needs it too)"),
    PrivateAPI("torch.utils._pytree.tree_unflatten", "cases.dtensor, "
               "fixtures.dtensor_converter", "as for tree_flatten"),
    PrivateAPI("torch.distributed.tensor._sharding_prop.ShardingPropagator._fake_mode_lock",
               "cases.dtensor", "DTensorOpTestBase leaves sharding propagation unlocked "
               "(releases without the lock have no shared fake mode)", may_be_missing=True),
    PrivateAPI("torch._is_functional_tensor", "fixtures.dtensor_converter",
               "DTensorConverter also wraps functional tensors"),
    PrivateAPI("torch.distributed._local_tensor.LocalTensor", "fixtures.dtensor_converter",
               "DTensorConverter counts LocalTensor arguments as misses",
               may_be_missing=True),
    PrivateAPI("torch.distributed.fsdp._fully_shard._fsdp_param_group.FSDPParamGroup",
               "cases.fsdp", "patch_unshard / patch_reshard / patch_post_backward raise "
               "AttributeError naming it"),
    PrivateAPI("torch.distributed.fsdp._fully_shard._fsdp_param_group.foreach_all_gather",
               "cases.fsdp", "patch_foreach_all_gather raises AttributeError naming it"),
    PrivateAPI("torch.distributed.fsdp._fully_shard._fsdp_param_group.foreach_reduce",
               "cases.fsdp", "patch_foreach_reduce raises AttributeError naming it"),
    PrivateAPI("torch.distributed.fsdp._fully_shard._fsdp_param_group."
               "RegisterPostBackwardFunction", "cases.fsdp",
               "patch_register_post_backward_hook_backward raises AttributeError naming it"),
    PrivateAPI("torch.distributed._composable.checkpoint", "fixtures.fsdp_models",
               "MLPStack.parallelize(use_activation_checkpointing=True) raises ImportError"),
    PrivateAPI("torch.distributed.checkpoint._extension.StreamTransformExtension",
               "fixtures.checkpoint_extension",
               "distspawn.checkpoint_utils has no Rot13Example or get_test_extension_registry "
               "(an ImportError names the missing module), as upstream's module cannot import"),
    PrivateAPI("torch.distributed.checkpoint._extension.ExtensionRegistry",
               "fixtures.checkpoint_extension", "as for StreamTransformExtension"),
    PrivateAPI("torch.cuda._sleep", "fixtures.fsdp_device",
               "the FSDP1 delay models hold up the host instead of the CUDA stream"),
    PrivateAPI("torch.distributed.fsdp._runtime_utils._reshard", "fixtures.fsdp1_models",
               "MixtureOfExperts(delay_before_free_ms > 0) on an accelerator raises "
               "AttributeError naming it (without a delay, or on CPU, it is not used)"),
    PrivateAPI("torch.distributed.fsdp.ShardingStrategy._HYBRID_SHARD_ZERO2",
               "fixtures.fsdp1_models, cases.fsdp_parity",
               "left out of the hybrid and keep-unsharded strategy sets (read with getattr)"),
    PrivateAPI("torch.distributed.device_mesh.DeviceMesh._concatenate",
               "fixtures.dtensor_plans", "ExpertParallelWithTP raises NotImplementedError "
               "naming it (tensor or expert parallelism alone still work)",
               may_be_missing=True),
    PrivateAPI("torch.distributed._local_tensor.LocalTensorMode", "cases.local_dtensor",
               "the local-tensor DTensor bases skip their tests, saying this torch lacks it",
               may_be_missing=True),
    PrivateAPI("torch.distributed._local_tensor.LocalIntNode", "cases.local_dtensor",
               "as for LocalTensorMode", may_be_missing=True),
    PrivateAPI("torch.distributed._local_tensor.maybe_disable_local_tensor_mode",
               "cases.local_dtensor", "as for LocalTensorMode", may_be_missing=True),
    PrivateAPI("torch.distributed._local_tensor.maybe_run_for_local_tensor",
               "cases.local_dtensor", "map_local_*_for_rank call the function once, on "
               "what they are given", may_be_missing=True),
    PrivateAPI("torch.autograd._enable_record_function", "cases.local_dtensor",
               "profiler ranges stay on in local-tensor tests (harmless)",
               may_be_missing=True),
    PrivateAPI("torch.distributed.tensor._random._rng_tracker", "cases.local_dtensor",
               "the DTensor RNG tracker is not reset between local-tensor tests",
               may_be_missing=True),
    PrivateAPI("torch._inductor.config.compile_threads", "cases.fsdp",
               "compiled_fsdp_test's compiled run fails with AttributeError naming it "
               "(its eager run is unaffected)"),
    PrivateAPI("torch.utils._triton.has_triton", "cases.fsdp",
               "compiled_fsdp_test leaves its compiled run out, with a warning",
               may_be_missing=True),
    PrivateAPI("torch.testing._internal.common_distributed", "integrations.stand_in",
               "the zero-change mode says it cannot take over and upstream's harness "
               "runs unchanged (imported only when the mode is asked for)",
               may_be_missing=True),
    PrivateAPI("torch.testing._internal.distributed.multi_threaded_pg",
               "integrations.stand_in", "as for common_distributed", may_be_missing=True),
    PrivateAPI("torch.testing._internal.common_utils.TestCase", "integrations.stand_in, "
               "cases.testcase", "as for common_distributed; with imports switched, a class "
               "mixing it in is not re-based (only looked up where a test file imported it)",
               may_be_missing=True),
    PrivateAPI("torch.distributed.distributed_c10d._World().default_pg", "backends.threaded_pg",
               "the per-thread world is built from what a new _World() sets and shares; "
               "where it no longer builds, threaded tests skip naming it"),
    PrivateAPI("torch.testing._internal.distributed._tensor.common_dtensor",
               "integrations.stand_in", "named only: imported before the mode could act, "
               "it is why the mode cannot take over", may_be_missing=True),
    PrivateAPI("_pytest.unittest.TestCaseFunction", "integrations.pytest_plugin",
               "classes that ask for world sizes are a collection error naming the "
               "pytest version; others run as pytest collects them"),
    PrivateAPI("_pytest.unittest.UnitTestCase", "integrations.pytest_plugin",
               "as for TestCaseFunction"),
    PrivateAPI("_pytest.python.Function._getobj", "integrations.pytest_plugin",
               "as for TestCaseFunction (the override point pytest documents)"),
)


_ABSENT = object()


def lookup(path: str) -> Any:
    """The object at ``path`` (``Cls()`` in it: on an instance), else ``_ABSENT``."""
    parts = path.split(".")
    for split in range(len(parts), 0, -1):
        try:
            found: Any = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for name in parts[split:]:
            make = name.endswith("()")
            found = getattr(found, name.rstrip("()"), _ABSENT)
            if found is _ABSENT:
                return _ABSENT
            if make:
                found = found()
        return found
    return _ABSENT


def missing() -> list[PrivateAPI]:
    """The listed names this machine's releases lack."""
    return [api for api in PRIVATE_APIS if lookup(api.path) is _ABSENT]


def unaccepted(api: PrivateAPI) -> list[str]:
    """Of the keywords distspawn passes to ``api``, those its signature refuses.

    Empty when the name is absent (``missing`` reports that) or when its
    signature cannot be read (a C function).
    """
    found = lookup(api.path)
    if found is _ABSENT or not api.takes:
        return []
    try:
        parameters = inspect.signature(found).parameters
    except (TypeError, ValueError):
        return []
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return []
    return [name for name in api.takes if name not in parameters
            or parameters[name].kind is inspect.Parameter.POSITIONAL_ONLY]


def reshaped() -> dict[str, list[str]]:
    """Listed names present on this machine whose signatures refuse what distspawn passes."""
    return {api.path: bad for api in PRIVATE_APIS if (bad := unaccepted(api))}


if __name__ == "__main__":
    gone = missing()
    for api in gone:
        print(f"{api.path} (used by distspawn.{api.used_by}): {api.when_missing}")
    for path, refused in reshaped().items():
        print(f"{path} no longer takes {', '.join(refused)}")
    print(f"{len(PRIVATE_APIS) - len(gone)} of {len(PRIVATE_APIS)} private APIs present")
