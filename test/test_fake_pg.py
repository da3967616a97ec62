"""distspawn.fake_pg: FakeStore and the fake backend, as upstream's fake_pg module."""

import json

import pytest

from harness import run_python, upstream_module_imports


def seen(*args):
    run = run_python(["fake_world.py", *args])
    line = [text for text in run.output.splitlines() if text.startswith("SEEN ")]
    assert line, run.output
    return json.loads(line[-1][len("SEEN "):])


def test_one_process_plays_rank_3_of_8_with_a_2d_mesh_and_dtensor():
    assert seen() == {
        "rank": 3, "world_size": 8, "backend": "fake",
        "mesh": [[0, 1, 2, 3], [4, 5, 6, 7]], "tp_coordinate": [0, 3],
        "local_shape": [2, 8], "global_shape": [8, 8], "gathered": 8,
    }


def upstream_fake_pg_imports() -> bool:
    return upstream_module_imports("torch.testing._internal.distributed.fake_pg")


@pytest.mark.skipif(not upstream_fake_pg_imports(), reason="upstream's fake_pg does not import")
def test_upstream_fake_pg_sees_the_same():
    assert seen("upstream") == seen()


@pytest.mark.skipif(not upstream_fake_pg_imports(), reason="upstream's fake_pg does not import")
def test_a_creator_already_registered_is_kept():
    probe = ("import torch.distributed as dist\n"
             "import torch.testing._internal.distributed.fake_pg as upstream\n"
             "import distspawn.fake_pg\n"
             "print(dist.Backend._plugins['FAKE'].creator_fn is upstream._create_fake_pg)\n")
    run = run_python(["-c", probe])
    assert run.output.strip().splitlines()[-1] == "True", run.output


def test_names_match_upstreams():
    import distspawn.fake_pg as ours
    import torch.distributed as dist

    assert issubclass(ours.FakeStore, dist.Store)
    assert callable(ours._create_fake_pg)
