"""Mistakes a user can make; each must fail with a clear message before any rank starts."""

from distspawn import MultiProcessTestCase, run_tests


class WordWorldSize(MultiProcessTestCase):
    @property
    def world_size(self):
        return "two"

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def test_x(self):
        pass


class ZeroWorldSize(WordWorldSize):
    @property
    def world_size(self):
        return 0


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


if __name__ == "__main__":
    run_tests()
