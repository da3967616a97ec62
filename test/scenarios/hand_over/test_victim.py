"""A user's test, run under pytest while something else on the machine goes
after the rank server's hand-over (``intruder.py``, ``forged_report.py``).

Its ranks all-reduce, and check that they were forked from the server (the
module found loaded) or imported the module themselves, as VICTIM_RANKS says:
``preloaded`` or ``imported``."""

import os

import torch
import torch.distributed as dist

from distspawn import MultiProcessTestCase

IMPORTED_IN = os.getpid()


class Victim(MultiProcessTestCase):
    world_size = 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def test_all_reduce(self):
        dist.init_process_group("gloo", init_method=f"file://{self.file_name}",
                                rank=self.rank, world_size=self.world_size)
        tensor = torch.ones(2)
        dist.all_reduce(tensor)
        assert tensor.tolist() == [2.0, 2.0]
        found = "preloaded" if IMPORTED_IN != os.getpid() else "imported"
        assert found == os.environ["VICTIM_RANKS"], f"rank {self.rank}: module {found}"
        dist.destroy_process_group()
