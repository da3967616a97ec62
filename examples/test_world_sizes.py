"""A pytest-style distributed test: plain asserts, and a marker for the world sizes.

``python -m pytest examples/test_world_sizes.py -v`` shows one item per size
(``test_all_gather[ws2]``, ``test_all_gather[ws3]``, ...); ``-k ws3`` runs one
size. Sizes above what the machine can give are skipped with the reason
(``--distspawn-max-world-size`` or ``DISTSPAWN_MAX_WORLD_SIZE`` sets the cap).
Needs the distspawn pytest plugin, which is active whenever distspawn is
installed; under plain unittest each test runs once, at the class's world_size.
"""

import pytest
import torch
import torch.distributed as dist

from distspawn import MultiProcessTestCase, MultiThreadedTestCase


class TestCollectivesAtEverySize(MultiProcessTestCase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def init_gloo(self):
        dist.init_process_group("gloo", rank=self.rank, world_size=self.world_size,
                                init_method=f"file://{self.file_name}")

    @pytest.mark.world_size(2, 3, 4)
    def test_all_gather(self):
        self.init_gloo()
        gathered = [torch.zeros(2) for _ in range(self.world_size)]
        dist.all_gather(gathered, torch.full((2,), float(self.rank)))
        assert [t[0].item() for t in gathered] == list(range(self.world_size))

    @pytest.mark.world_size(2, 4)
    def test_reduce_scatter_sums_each_chunk(self):
        self.init_gloo()
        out = torch.zeros(1)
        dist.reduce_scatter(out, [torch.full((1,), float(i)) for i in range(self.world_size)])
        assert out.item() == self.rank * self.world_size


@pytest.mark.world_size(2, 8)
class TestThreadedAtEverySize(MultiThreadedTestCase):
    """Threads are cheap: the same marker on a class sizes every test in it."""

    def setUp(self):
        super().setUp()
        self._spawn_threads()

    def test_broadcast_from_last_rank(self):
        t = torch.full((3,), float(self.rank))
        dist.broadcast(t, src=self.world_size - 1)
        assert t.tolist() == [self.world_size - 1.0] * 3
