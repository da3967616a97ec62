"""run_rank(): each process started by mp.spawn (or torchrun) is one rank.

Usage: python continuous_run_rank.py   (spawns 2 ranks; exits non-zero if any failed)
"""

import atexit
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from distspawn import MultiProcContinuousTest


class InRank(MultiProcContinuousTest):
    @classmethod
    def backend_str(cls):
        return "gloo"

    def test_all_reduce(self):
        t = torch.ones(1)
        dist.all_reduce(t)
        self.assertEqual(t.item(), float(self.world_size))
        print(f"rank {self.rank} of {self.world_size} ran test_all_reduce in pid {os.getpid()}")

    def test_rank_is_set(self):
        self.assertEqual(dist.get_rank(), self.rank)


def report_gloo_threads_at_exit():
    # gloo threads alive at interpreter shutdown can abort the rank there
    # (torch 2.14: "terminate called without an active exception"), rarely;
    # the group must be gone, and its threads with it, before then.
    tasks = f"/proc/{os.getpid()}/task"
    if os.path.isdir(tasks):
        names = []
        for task in os.listdir(tasks):
            try:
                with open(os.path.join(tasks, task, "comm")) as comm:
                    names.append(comm.read().strip())
            except OSError:
                pass
        alive = sum("gloo" in name for name in names)
        print(f"rank {os.environ.get('RANK')}: gloo threads at exit: {alive}", flush=True)


if __name__ == "__main__":
    rank = int(os.environ.get("RANK", -1))
    world_size = int(os.environ.get("WORLD_SIZE", 2))
    if rank >= 0:  # under torchrun
        atexit.register(report_gloo_threads_at_exit)
        InRank.run_rank(rank, world_size)
    else:
        with tempfile.TemporaryDirectory() as directory:
            sys.argv = sys.argv[:1]
            mp.spawn(InRank.run_rank, nprocs=world_size,
                     args=(world_size, os.path.join(directory, "rdvz")))
