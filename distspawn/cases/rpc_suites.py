"""The harness half of upstream's RPC test generator (``rpc_utils``).

pytorch's RPC test files make their classes by mixing three things: a suite of
tests written against any agent (``RpcTest``, ``FaultyAgentRpcTest``, ...), a
fixture for one agent (``TensorPipeRpcAgentTestFixture``, ...) and a base that
starts the rank processes. The suites and fixtures are torch RPC's own tests
and stay upstream's; the base is the harness, and here it is distspawn's
``MultiProcessTestCase``, so a file whose ``generate_tests`` comes from
distspawn runs its ranks on distspawn's engine.
"""

from __future__ import annotations

import os
import sys
import unittest

from ..fixtures.environment import IS_SANDCASTLE, TEST_WITH_DEV_DBG_ASAN
from ..fixtures.stores import find_free_port
from .multiprocess import MultiProcessTestCase

# Set to "1" to rendezvous over TCP (MASTER_ADDR / MASTER_PORT) instead of a file.
TCP_INIT_VAR = "RPC_INIT_WITH_TCP"


def _check_and_set_tcp_init() -> None:
    # One port for every rank: chosen in the test process, before any rank starts.
    if os.environ.get(TCP_INIT_VAR) == "1":
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(find_free_port())


def _check_and_unset_tcp_init() -> None:
    if os.environ.get(TCP_INIT_VAR) == "1":
        os.environ.pop("MASTER_ADDR", None)
        os.environ.pop("MASTER_PORT", None)


# The skip's words are upstream's, so a run reports the same reason.
@unittest.skipIf(TEST_WITH_DEV_DBG_ASAN,
                 "Skip ASAN as torch + multiprocessing spawn have known issues")
class SpawnHelper(MultiProcessTestCase):
    """Rank processes for the RPC suites, started in ``setUp`` (world size: the fixture's)."""

    def setUp(self) -> None:
        super().setUp()
        _check_and_set_tcp_init()
        self._spawn_processes()

    def tearDown(self) -> None:
        _check_and_unset_tcp_init()
        super().tearDown()


def generate_tests(prefix: str, mixin: type, tests: list[type],
                   module_name: str) -> dict[str, type]:
    """One class per suite in ``tests``, each the suite on the agent fixture
    ``mixin`` on distspawn's rank processes, named ``prefix`` + the suite's name.

    The classes claim ``module_name`` as their module: put them in that module's
    globals (``globals().update(generate_tests(..., __name__))``), where each
    rank finds its class by name.
    """
    _check_generate_tests_arguments(prefix, mixin, tests, module_name)
    classes: dict[str, type] = {}
    for suite in tests:
        if IS_SANDCASTLE and TEST_WITH_DEV_DBG_ASAN:
            # as upstream's: no class at all there, said on stderr
            print(f"generate_tests: no {prefix}{suite.__name__} on sandcastle under dev-asan "
                  "(spawned ranks and dev-asan do not mix)", file=sys.stderr)
            continue
        name = f"{prefix}{suite.__name__}"
        made = type(name, (suite, mixin, SpawnHelper), {})
        made.__module__ = module_name
        classes[name] = made
    return classes


def _check_generate_tests_arguments(prefix: object, mixin: object, tests: object,
                                    module_name: object) -> None:
    # Wrong arguments would otherwise surface in every rank of every test, as a
    # class that cannot be found or a TypeError from type().
    if not isinstance(prefix, str):
        raise TypeError(f"generate_tests: prefix={prefix!r} must be a str (the start of "
                        "each class's name)")
    if not isinstance(mixin, type):
        raise TypeError(f"generate_tests: mixin={mixin!r} must be a class (an RPC agent "
                        "fixture, such as TensorPipeRpcAgentTestFixture)")
    if (isinstance(tests, (str, bytes, type)) or not hasattr(tests, "__iter__")
            or not all(isinstance(t, type) for t in tests)):
        raise TypeError(f"generate_tests: tests={tests!r} must be a list of test suite "
                        "classes (such as rpc_utils.GENERIC_TESTS)")
    if not isinstance(module_name, str) or not module_name:
        raise TypeError(f"generate_tests: module_name={module_name!r} must be the calling "
                        "module's name (pass __name__)")
