"""A torch whose ``_World`` gained state (as 2.15's did: flight-recorder hooks
set in ``_World.__init__``): every rank thread has its own, with no list to
update. WORLD_CHANGE=field adds an instance field, =global a property over a
module global, =broken makes ``_World()`` need an argument."""

import os

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

CHANGE = os.environ.get("WORLD_CHANGE", "field")
_original_init = c10d._World.__init__

if CHANGE == "field":
    def _init_with_hooks(self):
        _original_init(self)
        self._recorder_hooks = {}

    c10d._World.__init__ = _init_with_hooks
    c10d._World.recorder_hooks = property(lambda self: self._recorder_hooks)
elif CHANGE == "global":
    c10d._group_notes = {}
    c10d._World.group_notes = property(lambda self: c10d._group_notes)
else:
    def _init_needing_an_argument(self, required):
        _original_init(self)

    c10d._World.__init__ = _init_needing_an_argument

from distspawn import MultiThreadedTestCase, run_tests  # noqa: E402


class NewWorldState(MultiThreadedTestCase):
    @property
    def world_size(self):
        return 3

    def setUp(self):
        super().setUp()
        self._spawn_threads()

    def test_each_rank_thread_has_its_own(self):
        name = "recorder_hooks" if CHANGE == "field" else "group_notes"
        mine = getattr(c10d._world, name)
        assert mine == {}, mine
        mine[self.rank] = f"rank {self.rank}"
        dist.barrier()
        assert getattr(c10d._world, name) == {self.rank: f"rank {self.rank}"}
        mine.clear()  # as destroy_process_group clears 2.15's hooks


if __name__ == "__main__":
    run_tests()
