"""Ranks report torch's thread count; EXPECT_THREADS says what it must be."""

import os

import torch

from distspawn import MultiProcContinuousTest, MultiProcessTestCase, run_tests


class FreshRanks(MultiProcessTestCase):
    world_size = 4

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def test_thread_count(self):
        assert torch.get_num_threads() == int(os.environ["EXPECT_THREADS"]), \
            (torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS"))


class ReusedRanks(MultiProcContinuousTest):
    world_size = 4

    def test_thread_count(self):
        assert torch.get_num_threads() == int(os.environ["EXPECT_THREADS"]), \
            (torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS"))


if __name__ == "__main__":
    run_tests()
