"""distspawn.multi_threaded_pg: upstream's module names work over our backend."""

import threading

import torch
import torch.distributed as dist

from distspawn.multi_threaded_pg import (
    ProcessLocalGroup,
    ThreadLocalWorld,
    _install_threaded_pg,
    _uninstall_threaded_pg,
)


def test_install_run_uninstall_like_upstream_code_does():
    before = dist.distributed_c10d._world
    world = _install_threaded_pg()
    try:
        assert isinstance(world, ThreadLocalWorld)
        store, results, names = dist.HashStore(), {}, {}

        def rank_main(rank):
            dist.init_process_group("threaded", rank=rank, world_size=2, store=store)
            t = torch.ones(1) * (rank + 1)
            dist.all_reduce(t)
            results[rank] = t.item()
            assert isinstance(dist.group.WORLD, ProcessLocalGroup)
            names[rank] = world._get_world().pg_names[dist.group.WORLD]
            dist.destroy_process_group()

        threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert results == {0: 3.0, 1: 3.0}
        assert names[0] == names[1]
        ProcessLocalGroup.reset()
    finally:
        _uninstall_threaded_pg()
    assert dist.distributed_c10d._world is before
