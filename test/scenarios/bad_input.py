"""Mistakes a user can make; each must fail with a clear message before any rank starts."""

from distspawn import (
    MultiProcContinuousTest,
    MultiProcessTestCase,
    MultiThreadedTestCase,
    run_tests,
)


class WordWorldSize(MultiProcessTestCase):
    @property
    def world_size(self):
        return "two"

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def test_x(self):
        pass


class NegativeWorldSize(WordWorldSize):
    # (0 is not a mistake: upstream passes a world of no ranks, distspawn
    # skips it; see empty_world.py.)
    @property
    def world_size(self):
        return -1


class StringWorldSize(WordWorldSize):
    # Upstream's TestDistBackend returns a string; it must keep working.
    @property
    def world_size(self):
        return "2"

    def test_x(self):
        self.assertIn(self.rank, (0, 1))


class NeverSpawned(MultiProcessTestCase):
    def test_x(self):
        pass


class BadStartMethod(MultiProcessTestCase):
    start_method = "teleport"

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def test_x(self):
        pass


class HugeWorldSize(WordWorldSize):
    # About what WORLD_SIZE=10000 gives: refused before any rank starts.
    @property
    def world_size(self):
        return 10000


class HugeThreadedWorld(MultiThreadedTestCase):
    world_size = 10_000_000

    def setUp(self):
        super().setUp()
        self._spawn_threads()

    def test_x(self):
        pass


class HugeReusedWorld(MultiProcContinuousTest):
    world_size = 10000

    def test_x(self):
        pass


if __name__ == "__main__":
    run_tests()
