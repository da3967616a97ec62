"""A reused-worker suite launched by torchrun, on one machine or across several.

Every process torchrun starts is one rank; it runs the whole suite with the
others and reports its own results. On two machines (node 0 at HOST)::

    torchrun --nnodes 2 --nproc-per-node 2 --node-rank 0 --master-addr HOST \\
        --master-port 29500 --rdzv-backend static examples/torchrun_nodes.py
    torchrun --nnodes 2 --nproc-per-node 2 --node-rank 1 --master-addr HOST \\
        --master-port 29500 --rdzv-backend static examples/torchrun_nodes.py

Each agent exits 0 only if every test passed on every rank of its node.
``examples/test_torchrun_nodes.py`` runs two agents on this machine as two
nodes. distspawn ships no launcher of its own: torchrun is the launcher.
"""

import os
import socket

import torch
import torch.distributed as dist

from distspawn import MultiProcContinuousTest


class AcrossNodes(MultiProcContinuousTest):
    @classmethod
    def backend_str(cls):
        return "gloo"

    def test_all_reduce_counts_every_rank(self):
        t = torch.ones(1)
        dist.all_reduce(t)
        assert t.item() == self.world_size
        node = os.environ.get("GROUP_RANK", "?")
        print(f"node {node} rank {self.rank} of {self.world_size} on {socket.gethostname()}: "
              "all_reduce ok", flush=True)

    def test_all_gather_sees_each_rank_once(self):
        gathered = [torch.zeros(1) for _ in range(self.world_size)]
        dist.all_gather(gathered, torch.tensor([float(self.rank)]))
        assert sorted(t.item() for t in gathered) == list(map(float, range(self.world_size)))


if __name__ == "__main__":
    AcrossNodes.run_rank(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
