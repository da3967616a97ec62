"""A test process that forks after its rank server started, as pytest-forked
does for each test: the forked child runs a rank test of its own.

The child inherits the parent's record of the server, but not the thread that
talks to it, and the server answers the parent alone. Its ranks must start
all the same (afresh), never wait on the parent's server.

Each forking test passes when the child's rank test passed and the child
ended within CHILD_LIMIT_S; the child's output is in the parent's, after
"child:".
"""

import io
import os
import select
import signal
import time
import unittest

import torch
import torch.distributed as dist

from two_ranks import TwoRankTestCase

CHILD_LIMIT_S = float(os.environ.get("FORKED_CHILD_LIMIT_S", "120"))


class SumOnTwoRanks(TwoRankTestCase):
    def test_all_reduce(self):
        dist.init_process_group("gloo", init_method=f"file://{self.file_name}",
                                rank=self.rank, world_size=self.world_size)
        total = torch.ones(1)
        dist.all_reduce(total)
        self.assertEqual(total.item(), 2)
        dist.destroy_process_group()


class ForkedTestProcess(unittest.TestCase):
    # Under pytest the server starts while the file is collected: the first
    # child forks before the parent asked its server anything. Then the
    # parent's own ranks, then a child forked after them.
    def test_1_a_child_forked_before_the_parent_used_its_server(self):
        self._child_runs_its_own_ranks()

    def test_2_the_parent_runs_its_ranks(self):
        outcome = unittest.TextTestRunner(stream=io.StringIO()).run(
            SumOnTwoRanks("test_all_reduce"))
        self.assertTrue(outcome.wasSuccessful())

    def test_3_a_child_forked_after_the_parent_ran_ranks(self):
        self._child_runs_its_own_ranks()

    def _child_runs_its_own_ranks(self):
        read_end, write_end = os.pipe()
        child = os.fork()
        if child == 0:
            os.close(read_end)
            report = io.StringIO()
            outcome = unittest.TextTestRunner(stream=report, verbosity=2).run(
                SumOnTwoRanks("test_all_reduce"))
            os.write(write_end, report.getvalue().encode())
            os._exit(0 if outcome.wasSuccessful() else 1)  # as pytest-forked's child ends
        os.close(write_end)
        # The pipe ends when the child does (its ranks, started afresh, do not
        # inherit it): its end is the event waited on, with the limit.
        report = b""
        deadline = time.monotonic() + CHILD_LIMIT_S
        with os.fdopen(read_end, "rb") as pipe:
            while chunk := self._read_before(pipe, deadline, child):
                report += chunk
        _, status = os.waitpid(child, 0)
        print("child:", report.decode())
        self.assertEqual(os.waitstatus_to_exitcode(status), 0)

    def _read_before(self, pipe, deadline, child):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([pipe], [], [], left)[0]:
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
            self.fail(f"the forked child did not end within {CHILD_LIMIT_S} s")
        return os.read(pipe.fileno(), 65536)


if __name__ == "__main__":
    unittest.main()
