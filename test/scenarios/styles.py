"""A passing and a failing test, run through each invocation style."""

from distspawn import run_tests
from two_ranks import TwoRankTestCase


class Styles(TwoRankTestCase):
    def test_ok(self):
        self.assertIn(self.rank, (0, 1))
        self.assertTrue(self.file_name)

    def test_bad(self):
        self.assertEqual(self.rank, 0, "only rank 0 is right")


if __name__ == "__main__":
    run_tests()
