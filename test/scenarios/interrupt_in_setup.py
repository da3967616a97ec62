"""Ctrl-C lands in setUp, after the ranks started (KeyboardInterrupt raised there).

unittest runs no clean-ups after a KeyboardInterrupt; the harness must still
end the ranks and remove the test's files.
"""

from distspawn import run_tests
from two_ranks import TwoRankTestCase


class InterruptedInSetUp(TwoRankTestCase):
    def setUp(self):
        super().setUp()  # the ranks are running now
        raise KeyboardInterrupt

    def test_never_joined(self):
        pass


if __name__ == "__main__":
    run_tests()
