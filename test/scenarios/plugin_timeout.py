"""A reused-rank class whose first test hangs, for a plugin's timeout to stop.

Run under pytest with pytest-timeout (``--timeout 10 --timeout-method
signal``) by benchmarks/plugin_timeout.py. PLUGIN_TIMEOUT_BASE=upstream
takes the base from upstream's harness (run it plain, or with
``--distspawn-stand-in``); anything else from distspawn.
"""

import os
import time

import torch
import torch.distributed as dist

if os.environ.get("PLUGIN_TIMEOUT_BASE") == "upstream":
    from torch.testing._internal.common_distributed import MultiProcContinuousTest
else:
    from distspawn import MultiProcContinuousTest


class StoppedByAPlugin(MultiProcContinuousTest):
    world_size = 2

    @classmethod
    def backend_str(cls):
        return "gloo"

    def test_a_hang(self):
        # Rank 0 waits in a collective rank 1 never joins.
        if self.rank == 0:
            dist.all_reduce(torch.ones(2))
        else:
            time.sleep(300)

    def test_b_after(self):
        total = torch.ones(2)
        dist.all_reduce(total)
        self.assertEqual(total, torch.full((2,), 2.0))

    def test_c_after(self):
        dist.barrier()
