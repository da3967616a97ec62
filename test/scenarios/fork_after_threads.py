"""A threaded test, then fork-based children that run autograd, in one process.

pytorch's own test_multiprocessing forks after autograd in a process that may
have run threaded tests before. A CUDA build with no device is where the
threaded backend could break that (backends.threaded_pg). Prints ``FORKED``
and the children's results, or ``FORK FAILED`` and the error.
"""

import multiprocessing
import unittest

import torch
import torch.distributed as dist

from distspawn import MultiThreadedTestCase


def backward_once(scale):
    torch.rand(3).requires_grad_(True).mean().backward()
    return scale * scale


class Threaded(MultiThreadedTestCase):
    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_threads()

    def test_all_reduce(self):
        t = torch.ones(2)
        dist.all_reduce(t)
        self.assertEqual(t[0].item(), 2.0)


if __name__ == "__main__":
    program = unittest.main(exit=False, verbosity=0)
    assert program.result.wasSuccessful()
    backward_once(1)  # autograd in this process first, as pytorch's test does
    try:
        with multiprocessing.get_context("fork").Pool(2) as pool:
            print("FORKED", pool.map(backward_once, [1, 2]))
    except RuntimeError as error:
        print("FORK FAILED", error)
