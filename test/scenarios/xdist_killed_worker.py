"""An xdist worker killed outright (SIGKILL) after its rank server started: run with -n 1."""

import os
import signal
import tempfile

import torch
import torch.distributed as dist

from two_ranks import TwoRankTestCase


class Ranks(TwoRankTestCase):
    def test_a_ranks_start(self):
        store = dist.FileStore(self.file_name, self.world_size)
        dist.init_process_group("gloo", rank=self.rank, world_size=self.world_size, store=store)
        t = torch.ones(1)
        dist.all_reduce(t)
        assert t.item() == 2


def test_b_worker_killed():
    # What a worker leaves when it cannot end by itself: a file of the test's
    # in the worker's TMPDIR, beside the rank server's socket folder.
    with open(os.path.join(tempfile.gettempdir(), "left-by-the-killed-worker"), "w") as f:
        f.write("x")
    os.kill(os.getpid(), signal.SIGKILL)


def test_c_after_the_crash():
    # Runs on the worker xdist starts in the killed one's place.
    assert os.path.isdir(tempfile.gettempdir())
