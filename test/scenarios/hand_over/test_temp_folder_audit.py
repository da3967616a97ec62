"""Run under pytest, in a TMPDIR of its own: while the ranks of each tier run,
everything distspawn has made in the temp folder is closed to other users.

Each test lists the temp folder from rank 0 (the rank server, the hand-over,
the environment file if still there, the test's own folder, the reused
workers' rendezvous file and folder) and fails naming any entry another
user could enter or read. torch's compile cache (``torchinductor_<user>``,
made by torch's import of dynamo, 0755) is torch's, and not counted."""

import os
import stat
import tempfile

from distspawn import MultiProcContinuousTest, MultiProcessTestCase


def open_entries():
    """Entries directly in the temp folder that are not this user's, or open to
    others; under xdist, also the folders between the run's TMPDIR (AUDIT_ROOT)
    and the worker's own."""
    root = tempfile.gettempdir()
    found = []
    folder = root
    while os.path.realpath(folder) != os.path.realpath(os.environ["AUDIT_ROOT"]):
        info = os.lstat(folder)
        if info.st_uid != os.getuid() or info.st_mode & 0o077:
            found.append(f"{folder} (uid {info.st_uid}, mode {stat.S_IMODE(info.st_mode):o})")
        folder = os.path.dirname(folder)
        assert folder != "/", f"{root} is not in AUDIT_ROOT {os.environ['AUDIT_ROOT']}"
    for name in sorted(os.listdir(root)):
        if name.startswith("torchinductor_"):
            continue
        info = os.lstat(os.path.join(root, name))
        if info.st_uid != os.getuid() or info.st_mode & 0o077:
            found.append(f"{name} (uid {info.st_uid}, mode {stat.S_IMODE(info.st_mode):o})")
    return found, sorted(os.listdir(root))


class Fresh(MultiProcessTestCase):
    world_size = 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def test_temp_folder_is_private(self):
        found, names = open_entries()
        assert not found, f"open to others: {found}"


class Reused(MultiProcContinuousTest):
    world_size = 2

    @classmethod
    def backend_str(cls):
        return "gloo"

    def test_temp_folder_is_private(self):
        found, names = open_entries()
        assert not found, f"open to others: {found}"
