"""The threaded backend gives the same results as gloo for every collective and op.

scenarios/collective_parity.py runs the same checks (every collective, reduce
op, sync and async, world group, a subgroup and a group the rank is not in)
once on rank threads and once on gloo rank processes.
"""

import json

import pytest

from harness import run_python


def _results(backend, world_size):
    run = run_python(["collective_parity.py", backend, str(world_size)], timeout=300)
    assert run.returncode == 0, run.output
    assert run.leftover_pids == []
    line = next(line for line in run.output.splitlines() if line.startswith("RESULTS "))
    return json.loads(line[len("RESULTS "):])


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_threaded_matches_gloo(world_size):
    threaded = _results("threaded", world_size)
    gloo = _results("gloo", world_size)
    assert sorted(threaded) == [str(r) for r in range(world_size)]
    for rank in threaded:
        assert "error" not in threaded[rank], threaded[rank].get("error")
        assert len(threaded[rank]) >= 80
        differences = {name: (value, gloo[rank].get(name))
                       for name, value in threaded[rank].items()
                       if gloo[rank].get(name) != value}
        assert differences == {}, f"rank {rank}"
        assert set(threaded[rank]) == set(gloo[rank])
