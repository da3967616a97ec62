"""Rank 1 finishes at once; rank 0 then checks that rank 1 is still there.

A rank that finished first, its process group still open, must stay until
every rank of the test is done: a peer still connecting to it would otherwise
see it vanish. (distspawn destroys the group once all ranks are done.)
"""

import os
import select

import torch.distributed as dist

from distspawn import run_tests
from two_ranks import TwoRankTestCase


class LeaveTogether(TwoRankTestCase):
    def _handoff(self):
        return os.path.join(os.path.dirname(self.file_name), "handoff")

    def _spawn_processes(self):
        # The parent makes the hand-off FIFO before the ranks start.
        os.mkfifo(self._handoff())
        super()._spawn_processes()

    def test_first_to_finish_waits_for_the_rest(self):
        dist.init_process_group("gloo", rank=self.rank, world_size=self.world_size,
                                init_method=f"file://{self.file_name}")
        if self.rank == 1:
            with open(self._handoff(), "w") as fifo:  # waits for rank 0 to open it
                fifo.write(str(os.getpid()))
            return  # done, its group still open (as upstream-style tests leave it)
        with open(self._handoff()) as fifo:
            peer = int(fifo.read())
        pidfd = os.pidfd_open(peer)
        try:
            left, _, _ = select.select([pidfd], [], [], 1.5)
        finally:
            os.close(pidfd)
        self.assertEqual(left, [], "rank 1 exited while rank 0 was still running its test")


if __name__ == "__main__":
    run_tests()
