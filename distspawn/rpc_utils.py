"""Upstream's RPC test generator (``distributed/rpc_utils`` under
``torch/testing/_internal/`` in the torch wheel) on distspawn's rank processes.

pytorch's RPC test files build their classes with ``generate_tests``, which
mixes each of torch RPC's test suites with an agent fixture and the base that
starts the ranks. Take ``generate_tests`` (and ``SpawnHelper``) from here and
keep taking the suites and fixtures from upstream's modules: they are torch
RPC's own tests, not harness::

    from torch.testing._internal.distributed.rpc_utils import FAULTY_AGENT_TESTS
    from distspawn.rpc_utils import generate_tests

    globals().update(generate_tests("Faulty", FaultyRpcAgentTestFixture,
                                    FAULTY_AGENT_TESTS, __name__))
"""

from __future__ import annotations

from .cases.multiprocess import MultiProcessTestCase
from .cases.rpc_suites import (
    SpawnHelper,
    _check_and_set_tcp_init,
    _check_and_unset_tcp_init,
    generate_tests,
)
from .fixtures.environment import IS_SANDCASTLE, TEST_WITH_DEV_DBG_ASAN
from .fixtures.stores import find_free_port

__all__ = ["SpawnHelper", "generate_tests",
           # from the rest of the harness, as upstream's module has them
           "MultiProcessTestCase", "IS_SANDCASTLE", "TEST_WITH_DEV_DBG_ASAN",
           "find_free_port"]
