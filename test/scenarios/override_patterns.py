"""Upstream's override points, used the way downstream suites use them.

UPSTREAM_HARNESS=1 runs this file on torch.testing._internal (where that
imports); otherwise on distspawn. The verdicts must agree, and every
``assertRaises`` below must catch the same exception type on both.
"""

import os
import sys
import threading

import torch
import torch.distributed as dist

if os.environ.get("UPSTREAM_HARNESS") == "1":
    from torch.testing._internal.common_distributed import (
        TEST_SKIPS,
        TIMEOUT_OVERRIDE,
        MultiProcContinuousTest,
        MultiProcessTestCase,
        MultiThreadedTestCase,
        TestSkip,
        spawn_threads_and_init_comms,
    )
    from torch.testing._internal.common_utils import TestCase, run_tests
else:
    from distspawn import TestCase, run_tests
    from distspawn.compat import (
        TEST_SKIPS,
        TIMEOUT_OVERRIDE,
        MultiProcContinuousTest,
        MultiProcessTestCase,
        MultiThreadedTestCase,
        TestSkip,
        spawn_threads_and_init_comms,
    )

# A project's own skip reason, added the way upstream's table is meant to be extended.
TEST_SKIPS["project_skip"] = TestSkip(90, "needs the project's licence server")
TIMEOUT_OVERRIDE["test_rank0_hangs"] = 4


def hang_here():
    threading.Event().wait()


def init_gloo(case):
    store = dist.FileStore(case.file_name, case.world_size)
    dist.init_process_group("gloo", store=store, rank=case.rank, world_size=case.world_size)


class OwnStartProcesses(MultiProcessTestCase):
    """Starts its ranks itself (veScale-style): upstream's _start_processes contract."""

    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def _start_processes(self, proc):
        self.processes = []
        for rank in range(self.world_size):
            parent_conn, child_conn = torch.multiprocessing.Pipe()
            process = proc(
                target=self.__class__._run,
                name=f"process {rank}",
                args=(rank, self._current_test_name(), self.file_name, child_conn),
            )
            process.start()
            self.pid_to_pipe[process.pid] = parent_conn
            self.processes.append(process)

    def test_all_reduce(self):
        init_gloo(self)
        tensor = torch.ones(1)
        dist.all_reduce(tensor)
        self.assertEqual(tensor.item(), 2.0)

    def test_rank1_raises(self):
        if self.rank == 1:
            raise ValueError("rank 1 cannot go on")

    def test_project_skip(self):
        sys.exit(TEST_SKIPS["project_skip"].exit_code)

    def test_rank0_hangs(self):
        if self.rank == 0:
            hang_here()


class OwnRun(MultiProcessTestCase):
    """Overrides the classmethod each rank process starts in."""

    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    @classmethod
    def _run(cls, rank, test_name, file_name, parent_pipe, **kwargs):
        os.environ["OWN_RUN_RANK"] = str(rank)
        super()._run(rank, test_name, file_name, parent_pipe, **kwargs)

    def test_own_run_was_used(self):
        self.assertEqual(os.environ.get("OWN_RUN_RANK"), str(self.rank))

    def test_own_run_then_failure(self):
        self.assertEqual(os.environ.get("OWN_RUN_RANK"), "no such rank")


class OwnRunTest(MultiProcessTestCase):
    """Overrides run_test, the rank-side method that runs one test."""

    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def run_test(self, test_name, parent_pipe):
        self.around_the_test = "set by run_test"
        super().run_test(test_name, parent_pipe)

    def test_run_test_was_used(self):
        self.assertEqual(getattr(self, "around_the_test", None), "set by run_test")


class OwnJoin(MultiProcessTestCase):
    """Overrides the parent's join, waiting its own way before the usual one."""

    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def _join_processes(self, fn):
        for process in self.processes:
            process.join(60)
        super()._join_processes(fn)

    def test_join_then_pass(self):
        pass

    def test_join_then_fail(self):
        if self.rank == 0:
            raise RuntimeError("rank 0 failed")


class OwnReturnCodeCheck(MultiProcessTestCase):
    """Overrides _check_return_codes to turn one expected failure into a pass."""

    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def _check_return_codes(self, fn, elapsed_time):
        if fn.__name__ == "test_expected_to_fail":
            with self.assertRaises(RuntimeError):
                super()._check_return_codes(fn, elapsed_time)
            return
        super()._check_return_codes(fn, elapsed_time)

    def test_expected_to_fail(self):
        raise ValueError("this failure is what the test expects")

    def test_plain_pass(self):
        pass


class WrappedThreadedFailures(TestCase):
    """pytorch's test_multi_threaded_pg.py: failing threaded tests wrapped in assertRaises."""

    def test_runtime_error_is_caught(self):
        @spawn_threads_and_init_comms(world_size=4)
        def failing(self):
            if dist.get_rank() == 0:
                raise AssertionError("Mimic real test failure.")

        with self.assertRaises(RuntimeError):
            failing(self)

    def test_runtime_error_carries_the_message(self):
        @spawn_threads_and_init_comms(world_size=4)
        def failing(self):
            tensors = [torch.empty(1) for _ in range(4)]
            dist.all_gather(tensors, torch.ones(1))
            if dist.get_rank() > 0:
                raise AssertionError("Mimic real test failure.")

        with self.assertRaisesRegex(RuntimeError, "Mimic real test failure."):
            failing(self)

    def test_upstream_thread_words(self):
        @spawn_threads_and_init_comms(world_size=2)
        def failing(self):
            if dist.get_rank() == 1:
                raise ValueError("thread one")

        with self.assertRaisesRegex(RuntimeError, "Thread 1 exited with exception"):
            failing(self)


class ThreadedProjectSkip(MultiThreadedTestCase):
    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_threads()

    def test_project_skip(self):
        sys.exit(TEST_SKIPS["project_skip"].exit_code)


class ReusedProjectSkip(MultiProcContinuousTest):
    world_size = 2

    @classmethod
    def backend_str(cls):
        return "gloo"

    @classmethod
    def device_type(cls):
        return "cpu"

    def test_project_skip(self):
        sys.exit(TEST_SKIPS["project_skip"].exit_code)

    def test_after_the_skip(self):
        tensor = torch.ones(1)
        dist.all_reduce(tensor)
        self.assertEqual(tensor.item(), 2.0)


class ProcessFailureCaught(MultiProcessTestCase):
    """A process test's failure, caught the way upstream's message reads."""

    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def _check_return_codes(self, fn, elapsed_time):
        if fn.__name__ == "test_rank0_raises":
            with self.assertRaisesRegex(RuntimeError, "Process 0 exited with error code 10"):
                super()._check_return_codes(fn, elapsed_time)
            return
        super()._check_return_codes(fn, elapsed_time)

    def test_rank0_raises(self):
        if self.rank == 0:
            raise KeyError("rank 0")


if __name__ == "__main__":
    run_tests()
