"""A small conformance-style suite run through TestDistBackend, with each fault kind.

Run as the entry file would be: BACKEND / WORLD_SIZE / TEMP_DIR come from the caller.
"""

import os
import sys
import unittest

import torch
import torch.distributed as dist

from distspawn import TestDistBackend, require_backend_is_available, require_world_size, run_tests


class Suite:
    class _DistTestBase:
        def test_world_matches_env(self):
            self.assertEqual(dist.get_world_size(), int(os.environ["WORLD_SIZE"]))
            self.assertIsInstance(self.world_size, int)
            self.assertEqual(dist.get_backend(), os.environ["BACKEND"])
            self.assertTrue(os.path.isdir(os.path.join(os.environ["TEMP_DIR"], "test_dir")))

        def test_all_reduce(self):
            tensor = torch.ones(3)
            dist.all_reduce(tensor)
            self.assertEqual(tensor, torch.full((3,), float(self.world_size)))

        def test_fails_on_rank1(self):
            self.assertEqual(dist.get_rank(), 0, "rank 1 reports a wrong value")

        @require_world_size(64)
        def test_needs_64_ranks(self):
            pass

        @require_backend_is_available(["mpi"])
        def test_mpi_only(self):
            pass

        def test_skip_everywhere(self):
            raise unittest.SkipTest("not on this backend, by design")

        def test_ddp_has_finalized(self):
            # Upstream expects this one to be taken down; its exit code is not judged.
            sys.stdout.flush()
            os._exit(6)


class TestSuiteWithBackend(TestDistBackend, Suite._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()


if __name__ == "__main__":
    run_tests()
