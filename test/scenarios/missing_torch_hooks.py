"""Private or newer torch APIs distspawn uses only when present, removed up front.

Simulates a torch without torch._C._set_print_stack_traces_on_fatal_signal
(ranks then still report, just without a native stack on a fatal signal).
Every rank imports this module, so each rank sees the same torch as the test
process. (torch.accelerator cannot be taken away: torch itself needs it.)
"""

import torch
import torch.distributed as dist

if hasattr(torch._C, "_set_print_stack_traces_on_fatal_signal"):
    del torch._C._set_print_stack_traces_on_fatal_signal

from distspawn import MultiProcContinuousTest, MultiProcessTestCase, run_tests  # noqa: E402
from distspawn.fixtures.device_probe import accelerator_type  # noqa: E402


class Fresh(MultiProcessTestCase):
    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def test_all_reduce(self):
        dist.init_process_group("gloo", rank=self.rank, world_size=2,
                                init_method=f"file://{self.file_name}")
        t = torch.ones(1)
        dist.all_reduce(t)
        self.assertEqual(t.item(), 2.0)
        assert not hasattr(torch._C, "_set_print_stack_traces_on_fatal_signal")

    def test_fails_with_a_report(self):
        if self.rank == 1:
            raise RuntimeError("reported without the fatal-signal hook")


class Reused(MultiProcContinuousTest):
    def test_default_device_type(self):
        # The machine's accelerator where there is one (upstream's rule), else the CPU.
        self.assertEqual(dist.get_world_size(), self.world_size)
        self.assertEqual(type(self).device_type(), accelerator_type() or "cpu")


if __name__ == "__main__":
    run_tests()
