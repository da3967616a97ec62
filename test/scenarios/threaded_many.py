"""100 threaded tests in a row; afterwards, no rank thread may be left alive.

Prints ``ALIVE n`` (threads other than the main one) after the run.
"""

import threading
import unittest

import torch
import torch.distributed as dist

from distspawn import MultiThreadedTestCase


class Many(MultiThreadedTestCase):
    @property
    def world_size(self):
        return 4

    def setUp(self):
        super().setUp()
        self._spawn_threads()


def _make(index):
    def test(self):
        t = torch.full((2,), float(self.rank + index))
        dist.all_reduce(t)
        self.assertEqual(t[0].item(), 4.0 * index + 6.0)
        if index % 10 == 9 and self.rank == index % 4:
            raise RuntimeError(f"planned failure {index}")
    return test


for _i in range(100):
    setattr(Many, f"test_{_i:03d}", _make(_i))


if __name__ == "__main__":
    program = unittest.main(exit=False, verbosity=0)
    alive = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    print(f"ALIVE {len(alive)} {alive}")
    result = program.result
    print(f"COUNTS run={result.testsRun} failures={len(result.failures)} "
          f"errors={len(result.errors)}")
