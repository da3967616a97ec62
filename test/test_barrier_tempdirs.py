"""Barrier across real processes, its timeout message, and the temp-dir tree."""

import multiprocessing
import os
import time

import pytest
import torch.distributed as dist

from distspawn import Barrier, cleanup_temp_dir, initialize_temp_directories, rank_temp_file
from distspawn import tempdirs


@pytest.fixture
def temp_tree(monkeypatch):
    monkeypatch.delenv("TEMP_DIR", raising=False)
    monkeypatch.delenv("INIT_METHOD", raising=False)
    root = initialize_temp_directories()
    yield root
    cleanup_temp_dir()


def _arrive(index, count, rounds, errors):
    try:
        for round_number in range(1, rounds + 1):
            marker = os.path.join(os.environ["TEMP_DIR"], "test_dir", f"{round_number}-{index}")
            open(marker, "w").close()
            Barrier.sync(wait_for=count, timeout=30)
            # After the barrier every process's marker for this round exists.
            present = [os.path.exists(os.path.join(os.environ["TEMP_DIR"], "test_dir",
                                                   f"{round_number}-{other}"))
                       for other in range(count)]
            if not all(present):
                errors.put(f"process {index} passed round {round_number} early: {present}")
    except Exception as error:  # reported to the test, not lost in a child
        errors.put(f"process {index}: {error!r}")


def test_barrier_syncs_several_processes(temp_tree):
    Barrier.init()
    context = multiprocessing.get_context("fork")
    errors = context.Queue()
    count = 3
    procs = [context.Process(target=_arrive, args=(i, count, 4, errors)) for i in range(count)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(60)
    assert [proc.exitcode for proc in procs] == [0, 0, 0]
    found = []
    while not errors.empty():
        found.append(errors.get())
    assert found == []


def test_barrier_times_out_with_a_message(temp_tree):
    Barrier.init()
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=r"barrier timeout: 1 of 2 processes reached barrier 1"):
        Barrier.sync(wait_for=2, timeout=0.3)
    assert time.monotonic() - started < 5


def test_barrier_uses_upstreams_layout(temp_tree):
    # Another process (of either implementation) records its barrier number in a
    # file named by its pid; that counts as an arrival.
    Barrier.init()
    with open(os.path.join(temp_tree, "barrier", "999999"), "w") as handle:
        handle.write("1")
    Barrier.sync(wait_for=2, timeout=5)
    with open(os.path.join(temp_tree, "barrier", str(os.getpid()))) as handle:
        assert handle.read() == "1"
    assert os.path.exists(os.path.join(temp_tree, "lockfile"))


def test_barrier_without_temp_dir_says_what_is_missing(monkeypatch):
    monkeypatch.delenv("TEMP_DIR", raising=False)
    with pytest.raises(RuntimeError, match="Barrier needs TEMP_DIR"):
        Barrier.init()


def test_temp_dirs_appear_and_vanish(monkeypatch):
    monkeypatch.setenv("TEMP_DIR", "/users/own/dir")
    monkeypatch.delenv("INIT_METHOD", raising=False)
    root = initialize_temp_directories()
    assert os.environ["TEMP_DIR"] == root
    assert sorted(os.listdir(root)) == ["barrier", "init_dir", "test_dir"]
    assert os.environ["INIT_METHOD"] == "file://" + os.path.join(root, "init_dir",
                                                                  "shared_init_file")
    assert tempdirs.tmp_dir is not None
    cleanup_temp_dir()
    assert not os.path.exists(root)
    assert tempdirs.tmp_dir is None
    assert os.environ["TEMP_DIR"] == "/users/own/dir"  # restored, unlike upstream
    assert "INIT_METHOD" not in os.environ


def test_second_initialise_starts_a_fresh_tree_and_keeps_custom_init_method(monkeypatch):
    monkeypatch.delenv("TEMP_DIR", raising=False)
    first = initialize_temp_directories()
    left = os.path.join(first, "test_dir", "left-by-the-first")
    open(left, "w").close()
    second = initialize_temp_directories(init_method="env://")
    try:
        assert not os.path.exists(left)
        assert sorted(os.listdir(second)) == ["barrier", "init_dir", "test_dir"]
        assert os.environ["INIT_METHOD"] == "env://"
    finally:
        cleanup_temp_dir()
    assert not os.path.exists(second)
    assert "TEMP_DIR" not in os.environ


def test_rank_temp_file_is_shared_and_removed():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with rank_temp_file() as name:
            assert os.path.exists(name)
        assert not os.path.exists(name)
    finally:
        dist.destroy_process_group()


def test_every_tree_of_a_process_is_at_one_path_in_a_folder_only_the_user_can_enter(monkeypatch):
    # INIT_METHOD then names the same file for every test: a test module that
    # reads it at import (upstream's distributed_test) is preloaded once.
    monkeypatch.delenv("TEMP_DIR", raising=False)
    monkeypatch.delenv("INIT_METHOD", raising=False)
    first = initialize_temp_directories()
    first_method = os.environ["INIT_METHOD"]
    cleanup_temp_dir()
    second = initialize_temp_directories()
    try:
        assert second == first and os.environ["INIT_METHOD"] == first_method
        holder = os.stat(os.path.dirname(second))
        assert holder.st_uid == os.getuid() and holder.st_mode & 0o777 == 0o700
    finally:
        cleanup_temp_dir()


_UPSTREAM_BARRIER_CHECK = """
import os
from torch.testing._internal.distributed import distributed_test as upstream
from distspawn import cleanup_temp_dir, initialize_temp_directories
from distspawn.fixtures.barrier import sync_on_files, upstream_barrier_class

class Suite(upstream.DistributedTest._DistTestBase):
    pass

class OwnBarrier(upstream.DistributedTest._DistTestBase):
    def _barrier(self, *args, **kwargs):
        pass

assert upstream_barrier_class(Suite) is upstream.Barrier
assert upstream_barrier_class(OwnBarrier) is None
assert upstream_barrier_class(object) is None
root = initialize_temp_directories()
upstream.Barrier.init()
sync_on_files(upstream.Barrier, wait_for=1)
upstream.Barrier.sync(wait_for=1)  # upstream's own, after ours: one count
assert upstream.Barrier.barrier_id == 2, upstream.Barrier.barrier_id
with open(os.path.join(root, "barrier", str(os.getpid()))) as f:
    assert f.read() == "2"
cleanup_temp_dir()
print("checked")
"""


def test_the_conformance_suite_waits_on_upstreams_own_barrier_without_its_polls():
    # TestDistBackend syncs its ranks around each test through the suite's
    # _barrier; where that is upstream's as shipped, the same barrier (its
    # files, its count) is waited on every 0.01 s instead of every 0.1 s.
    # (In a fresh interpreter: the test process never imports upstream's harness.)
    from harness import run_python, upstream_module_imports

    if not upstream_module_imports("torch.testing._internal.common_distributed"):
        pytest.skip("upstream's harness does not import here")
    run = run_python(["-c", _UPSTREAM_BARRIER_CHECK], env={"BACKEND": "gloo", "WORLD_SIZE": "1"})
    assert run.returncode == 0 and "checked" in run.output, run.output
    assert run.leftover_files == []
