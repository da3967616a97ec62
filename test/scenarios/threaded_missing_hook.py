"""A torch without the thread-isolation hook: threaded tests skip and say which hook."""

import torch

del torch._C._distributed_c10d._set_thread_isolation_mode  # simulate an older torch

from distspawn import MultiThreadedTestCase, TestCase, run_tests, spawn_threads_and_init_comms  # noqa: E402


class NeedsHook(MultiThreadedTestCase):
    def setUp(self):
        super().setUp()
        self._spawn_threads()

    def test_anything(self):
        raise AssertionError("must not run")


class NeedsHookDecorated(TestCase):
    @spawn_threads_and_init_comms(world_size=2)
    def test_decorated(self):
        raise AssertionError("must not run")


if __name__ == "__main__":
    run_tests()
