"""The per-test directory tree the conformance suite runs in.

``initialize_temp_directories`` makes a fresh ``TEMP_DIR`` with ``barrier/``,
``test_dir/`` and ``init_dir/`` inside and points ``TEMP_DIR`` and
``INIT_METHOD`` at it, as upstream does; rank processes started afterwards
inherit both. ``cleanup_temp_dir`` removes it and, unlike upstream, puts the
two variables back as they were, so nothing points at a deleted directory.
"""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from typing import Iterator

import torch.distributed as dist

from .environment import FILE_SCHEMA, restore_environ

# The live directory, or None. Module state, as upstream has it (tests read it).
tmp_dir: tempfile.TemporaryDirectory | None = None

_ENV_KEYS = ("TEMP_DIR", "INIT_METHOD")
_saved_env: dict[str, str | None] | None = None


def initialize_temp_directories(init_method: str | None = None) -> str:
    """Create a fresh TEMP_DIR tree, export TEMP_DIR / INIT_METHOD, return its path.

    ``init_method`` defaults to a ``file://`` URL inside ``init_dir/``.
    """
    global tmp_dir, _saved_env
    if tmp_dir is not None:
        tmp_dir.cleanup()  # a second call without clean-up must not leak the first
    elif _saved_env is None:
        _saved_env = {key: os.environ.get(key) for key in _ENV_KEYS}
    tmp_dir = tempfile.TemporaryDirectory(prefix="distspawn-tempdir-")
    root = tmp_dir.name
    for sub in ("barrier", "test_dir", "init_dir"):
        os.mkdir(os.path.join(root, sub))
    os.environ["TEMP_DIR"] = root
    if init_method is None:
        init_method = FILE_SCHEMA + os.path.join(root, "init_dir", "shared_init_file")
    os.environ["INIT_METHOD"] = init_method
    return root


def cleanup_temp_dir() -> None:
    """Remove the tree from ``initialize_temp_directories`` and restore the variables."""
    global tmp_dir, _saved_env
    if tmp_dir is not None:
        tmp_dir.cleanup()
        tmp_dir = None
    if _saved_env is not None:
        restore_environ(_saved_env)
        _saved_env = None


@contextmanager
def rank_temp_file() -> Iterator[str]:
    """A temp file path shared by all ranks: rank 0 creates and removes it.

    Needs an initialised default process group (the name is broadcast).
    """
    creator = dist.get_rank() == 0
    name = None
    if creator:
        fd, name = tempfile.mkstemp(prefix="distspawn-rank-")
        os.close(fd)
    holder = [name]
    dist.broadcast_object_list(holder)
    name = holder[0]
    try:
        yield name
    finally:
        if creator:
            try:
                os.remove(name)
            except FileNotFoundError:
                pass


# Upstream's private spelling, used by conformance tests.
_rank_temp_file = rank_temp_file
