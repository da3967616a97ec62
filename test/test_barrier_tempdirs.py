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


def test_second_initialise_removes_the_first_and_keeps_custom_init_method(monkeypatch):
    monkeypatch.delenv("TEMP_DIR", raising=False)
    first = initialize_temp_directories()
    second = initialize_temp_directories(init_method="env://")
    try:
        assert not os.path.exists(first)
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
