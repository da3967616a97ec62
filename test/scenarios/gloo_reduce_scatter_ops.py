"""Whether this torch's gloo reduce_scatter sums whatever reduce op it is given.

Prints ``ALWAYS_SUMS 1`` where ReduceOp.AVG and ReduceOp.MAX give the sum
(torch 2.8's gloo: no error, a wrong result), else ``ALWAYS_SUMS 0``.
"""

import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _rank(rank, directory):
    dist.init_process_group("gloo", rank=rank, world_size=2,
                            init_method=f"file://{directory}/store")
    found = []
    for op in (dist.ReduceOp.AVG, dist.ReduceOp.MAX):
        out = torch.zeros(1)
        dist.reduce_scatter_tensor(out, torch.full((2,), 2.0), op=op)
        found.append(out.item())
    dist.destroy_process_group()
    if rank == 0:
        with open(os.path.join(directory, "result"), "w") as f:
            f.write(" ".join(map(str, found)))


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as directory:
        mp.start_processes(_rank, args=(directory,), nprocs=2, start_method="spawn")
        with open(os.path.join(directory, "result")) as f:
            values = [float(v) for v in f.read().split()]
    # Two ranks each give 2.0: the sum is 4.0, the average and the maximum 2.0.
    print(f"ALWAYS_SUMS {int(values == [4.0, 4.0])}")
    sys.exit(0 if values in ([2.0, 2.0], [4.0, 4.0]) else 1)
