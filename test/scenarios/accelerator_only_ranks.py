"""Rank tests written for accelerators, beside a plain test.

Every multi-process test here skips on a machine without an accelerator: by
a class decorator, by a decorator on each test, by a pytest mark, or by a
world of as many ranks as there are GPUs (none). pytest
should start no rank server for the file (a server importing torch would
only compete with collection for the CPUs); run with ``-p count_server_starts``,
the run ends with how many it started.
"""

import unittest

import pytest
import torch

from distspawn import MultiProcessTestCase, TestCase


@unittest.skipUnless(torch.cuda.device_count() >= 2, "needs two GPUs")
class WholeClassNeedsGPUs(MultiProcessTestCase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def test_all_reduce(self):
        pass


class EachTestNeedsGPUs(MultiProcessTestCase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()

    @unittest.skipIf(not torch.cuda.is_available(), "needs a GPU")
    def test_broadcast(self):
        pass

    @pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
    def test_all_gather(self):
        pass


class RankPerGPU(MultiProcessTestCase):
    @property
    def world_size(self):
        return min(torch.cuda.device_count(), 4)

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def test_reduce_scatter(self):
        pass


class Plain(TestCase):
    def test_runs(self):
        pass


if __name__ == "__main__":
    unittest.main()
