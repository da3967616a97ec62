"""benchmarks/corpus.py switches a file's imports as README's migration table says."""

import ast
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from corpus import HARNESSES, compare, pytest_command, switch_imports  # noqa: E402

UPSTREAM_STYLE = '''\
import os
import torch.testing._internal.common_distributed as common_distributed
from torch.testing._internal.common_distributed import (
    MultiProcessTestCase,
    skip_if_lt_x_gpu,
)
from torch.testing._internal.common_utils import TestCase, instantiate_parametrized_tests, run_tests
from torch.testing._internal.distributed._tensor.common_dtensor import DTensorTestBase as Base
from torch.testing._internal.distributed._tensor.common_dtensor import (
    MLPModule, generate_shard_orders as orders)
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.testing._internal.distributed.rpc_utils import (
    FAULTY_AGENT_TESTS,
    generate_tests,
)

if True:
    from torch.testing._internal.common_fsdp import FSDPTest
'''


def test_upstream_imports_become_distspawns_and_the_rest_stay():
    switched = switch_imports(UPSTREAM_STYLE)
    ast.parse(switched)
    assert "import distspawn.compat as common_distributed" in switched
    assert "from distspawn.compat import MultiProcessTestCase, skip_if_lt_x_gpu" in switched
    assert ("from distspawn import TestCase, run_tests; from torch.testing._internal."
            "common_utils import instantiate_parametrized_tests") in switched
    assert "from distspawn.dtensor import DTensorTestBase as Base" in switched
    # README: DTensor op-test helpers are not harness, and stay upstream's.
    assert ("from distspawn.dtensor import MLPModule; from torch.testing._internal.distributed."
            "_tensor.common_dtensor import generate_shard_orders as orders") in switched
    assert "from distspawn.fake_pg import FakeStore" in switched
    # README: torch RPC's suites are its own tests; the generator is harness.
    assert ("from distspawn.rpc_utils import generate_tests; from torch.testing._internal."
            "distributed.rpc_utils import FAULTY_AGENT_TESTS") in switched
    assert "    from distspawn.fsdp import FSDPTest\n" in switched
    assert switched.startswith("import os\n")


def test_verdicts_compare_by_kind_and_a_skip_turned_pass_is_better():
    upstream = {"A.a": "pass", "A.b": "skip: Need at least 2 CUDA devices", "A.c": "fail",
                "A.d": "pass"}
    ours = {"A.a": "pass", "A.b": "pass", "A.c": "fail", "A.d": "skip: no"}
    assert compare(upstream, ours, {"A.c"}) == {"same": ["A.a"], "better": ["A.b"],
                                                "differ": ["A.d"]}


def test_a_file_that_is_not_the_pinned_version_is_named(tmp_path):
    from corpus import Entry, content_mismatches

    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "test_a.py").write_text("print('a')\n")
    pinned = "5b5d3f0f8ff3a5a0f2b1b0a3a0d0c3c4e1a2b3c4d5e6f708192a3b4c5d6e7f80"
    entries = [Entry("proj", "owner/proj", None, "test_a.py", sha256=pinned),
               Entry("proj", "owner/proj", "abc", "test_a.py")]
    assert content_mismatches(entries, tmp_path) == [
        "proj/test_a.py (sha256 62bdb208de6d..., expected 5b5d3f0f8ff3...)"]


def test_what_a_run_leaves_in_the_temp_folder_is_counted(tmp_path, monkeypatch):
    import tempfile

    from corpus import Entry, run_file

    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))  # the run inherits it
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "test_leaves.py").write_text(
        "import tempfile\n"
        "def test_leaves_a_file():\n"
        "    tempfile.mkstemp(prefix='left-')\n"
        "def test_uses_tmp_path(tmp_path):\n"
        "    (tmp_path / 'kept-by-pytest').write_text('')\n")
    run = run_file(Entry("proj", "owner/proj", "abc", "test_leaves.py"), tmp_path / "proj",
                   "upstream", timeout=120)
    assert run.verdicts == {"test_leaves.py": {"test_leaves.test_leaves_a_file": "pass",
                                               "test_leaves.test_uses_tmp_path": "pass"}}, \
        run.verdicts
    assert len(run.left_behind) == 1 and run.left_behind[0].startswith("left-")


def test_a_projects_files_share_sessions_and_each_verdict_finds_its_file(tmp_path):
    from corpus import Entry, run_files, sessions

    project = tmp_path / "proj"
    for folder in ("tests/a", "tests/b"):
        (project / folder).mkdir(parents=True)
    (project / "tests" / "a" / "test_one.py").write_text(
        "import unittest\n"
        "class TestShared(unittest.TestCase):\n"
        "    def test_x(self):\n        pass\n")
    (project / "tests" / "b" / "test_two.py").write_text(
        "import unittest\n"
        "class TestShared(unittest.TestCase):\n"
        "    def test_x(self):\n        self.fail('two')\n"
        "def test_plain():\n    pass\n")
    (project / "tests" / "b" / "test_one.py").write_text("def test_y():\n    pass\n")
    one, two, same_name = (Entry("proj", "owner/proj", "abc", path) for path in (
        "tests/a/test_one.py", "tests/b/test_two.py", "tests/b/test_one.py"))
    other = Entry("other", "owner/other", "abc", "test_z.py")
    # Two files of one name cannot share a session (pytest imports a file by
    # its name); another project's file never does.
    assert sessions([one, two, same_name, other], together=True) == [
        [one, two], [same_name], [other]]
    assert sessions([one, two], together=False) == [[one], [two]]

    run = run_files([one, two], project, "upstream", timeout=120)
    assert run.verdicts == {
        "tests/a/test_one.py": {"TestShared.test_x": "pass"},
        "tests/b/test_two.py": {"TestShared.test_x": "fail", "test_two.test_plain": "pass"},
    }, run.verdicts
    # Each test's seconds, filed the same way (the time of tests that fail on
    # every harness is reported apart).
    assert {path: set(times) for path, times in run.test_seconds.items()} == {
        path: set(found) for path, found in run.verdicts.items()}


def test_the_floor_run_collects_and_runs_no_test(tmp_path):
    from corpus import COLLECT_ONLY, Entry, run_file

    (tmp_path / "proj").mkdir()
    ran = tmp_path / "ran"
    (tmp_path / "proj" / "test_marks.py").write_text(
        "from pathlib import Path\n"
        f"def test_marks():\n    Path({str(ran)!r}).write_text('')\n")
    entry = Entry("proj", "owner/proj", "abc", "test_marks.py")
    floor = run_file(entry, tmp_path / "proj", COLLECT_ONLY, timeout=120)
    assert floor.verdicts == {"test_marks.py": {}} and not ran.exists()
    assert run_file(entry, tmp_path / "proj", "upstream", timeout=120).verdicts == {
        "test_marks.py": {"test_marks.test_marks": "pass"}}
    assert ran.exists()


def test_every_harness_runs_the_tests_in_file_order():
    # pytest-randomly (where installed) would give each harness's session an
    # order of its own, and order-dependent verdicts would differ by run.
    files, junit = [Path("a/test_x.py"), Path("b/test_y.py")], Path("junit.xml")
    for harness in HARNESSES:
        for workers in (0, 2):
            command = pytest_command(files, junit, harness, workers)
            assert command[command.index("no:randomly") - 1] == "-p", command
            assert command[3:5] == ["a/test_x.py", "b/test_y.py"], command
    assert "--distspawn-stand-in" in pytest_command(files, junit, "stand-in")
    assert "--distspawn-stand-in" not in pytest_command(files, junit, "switched")
