"""The pytest plugin: world-size items, caps, rank-labelled reports, -k, --lf, node ids, xdist."""

import os
import re
import xml.etree.ElementTree as ET

import pytest

from harness import run_python, skip_unless_upstream_runs

FILE = "plugin_sizes.py"
SIZED = ["Processes::test_sum[ws2]", "Processes::test_sum[ws3]",
         "Processes::test_too_big[ws2]", "Processes::test_plain",
         "Threads::test_world[ws2]", "Threads::test_world[ws4]",
         "Reused::test_world[ws2]", "Reused::test_world[ws3]",
         "Reused::test_again[ws2]", "Reused::test_again[ws3]"]


def pytest_run(*args, env=None):
    # A run counting the rank server's starts is about its early start, made
    # while the test process imports torch: it starts in a fresh interpreter
    # (warm_python's runs have torch imported already).
    return run_python(["-m", "pytest", *args], env=env, timeout=300,
                      warm="count_server_starts" not in args)


def outcomes(output):
    """{node id: PASSED/FAILED/SKIPPED} from pytest -v (also -n: '[gw0] PASSED id')."""
    found = {}
    for line in output.splitlines():
        match = re.search(r"(\S+\.py::\S+) (PASSED|FAILED|SKIPPED|ERROR)", line) or \
            re.search(r"(PASSED|FAILED|SKIPPED|ERROR) (\S+\.py::\S+)", line)
        if match:
            a, b = match.groups()
            node, verdict = (a, b) if "::" in a else (b, a)
            found[node.split("::", 1)[1]] = verdict
    return found


def test_one_item_per_world_size_with_a_cap_and_rank_sections():
    run = pytest_run(FILE, "-v", "-rfs", "-p", "no:cacheprovider")
    assert run.returncode == 1, run.output
    seen = outcomes(run.output)
    for node in SIZED:
        assert seen.get(node) == "PASSED", (node, run.output)
    assert seen["Processes::test_too_big[ws512]"] == "SKIPPED"
    assert seen["Processes::test_fails_on_rank_1"] == "FAILED"
    assert "world size 512 is more than this machine can give" in run.output
    assert "1 failed, 10 passed, 1 skipped" in run.output
    # The failing rank has its own section, titled with the rank and what it did.
    assert re.search(r"-{5,} rank 1: raised an exception -{5,}", run.output), run.output
    section = run.output.split("rank 1: raised an exception -")[1]
    assert 'raise ValueError("rank one broke")' in section
    assert "[rank 1] rank 1 is about to fail" in section
    # The verdict comes first (pytest >= 8 also puts it on the one-line summary).
    assert "\n1 of 3 ranks failed (rank 1):\nrank 1: raised an exception\n" in run.output
    assert "FAILED plugin_sizes.py::Processes::test_fails_on_rank_1" in run.output
    assert "python -m pytest 'plugin_sizes.py::Processes::test_fails_on_rank_1'" in run.output
    assert run.leftover_pids == [] and run.leftover_files == []


def test_k_and_parametrized_node_ids_select_sizes():
    run = pytest_run(FILE, "-v", "-k", "ws3", "-p", "no:cacheprovider")
    assert run.returncode == 0, run.output
    assert set(outcomes(run.output)) == {"Processes::test_sum[ws3]", "Reused::test_world[ws3]",
                                         "Reused::test_again[ws3]"}
    run = pytest_run("-v", "-p", "no:cacheprovider", f"{FILE}::Threads::test_world[ws4]",
                     f"{FILE}::Reused::test_again[ws2]")
    assert run.returncode == 0, run.output
    assert outcomes(run.output) == {"Threads::test_world[ws4]": "PASSED",
                                    "Reused::test_again[ws2]": "PASSED"}


def test_last_failed_reruns_only_the_failure(tmp_path):
    cache = f"cache_dir={tmp_path / 'cache'}"
    first = pytest_run(FILE, "-q", "-o", cache)
    assert first.returncode == 1, first.output
    again = pytest_run(FILE, "-v", "--lf", "-o", cache)
    assert again.returncode == 1, again.output
    assert outcomes(again.output) == {"Processes::test_fails_on_rank_1": "FAILED"}


def test_xdist_workers_give_the_same_outcomes_and_junit_keeps_rank_details(tmp_path):
    xml = tmp_path / "report.xml"
    run = pytest_run(FILE, "-v", "-n", "2", "-p", "no:cacheprovider", f"--junitxml={xml}",
                     env={"MASTER_PORT": "29500"})
    assert run.returncode == 1, run.output
    seen = outcomes(run.output)
    assert all(seen.get(node) == "PASSED" for node in SIZED), run.output
    assert seen["Processes::test_fails_on_rank_1"] == "FAILED"
    assert "rank 1: raised an exception" in run.output
    suite = ET.parse(xml).getroot().find("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("12", "1", "1")
    failure = next(case.find("failure") for case in suite
                   if case.get("name") == "test_fails_on_rank_1")
    assert "rank one broke" in failure.text
    # The run ends cleanly: no worker's exit trips over a removed temp dir.
    assert "FileNotFoundError" not in run.output and "Error in atexit" not in run.output
    # Each worker's private TMPDIR is removed with it; only pytest's own base
    # temp dir (made by xdist's controller) stays.
    assert run.leftover_pids == []
    assert [f for f in run.leftover_files if not f.startswith("pytest-of-")] == []


def test_a_pytest_run_started_from_an_xdist_worker_is_not_taken_for_one():
    # It inherits the worker's PYTEST_XDIST_WORKER; isolating it as a worker
    # again nested TMPDIRs until the rank server's socket path was too long.
    run = pytest_run("inherited_xdist_env.py", "-q", "-p", "no:cacheprovider",
                     env={"PYTEST_XDIST_WORKER": "gw-inherited"})
    assert run.returncode == 0 and "1 passed" in run.output, run.output


def test_the_cap_can_be_set_and_bad_markers_are_clear_errors():
    run = pytest_run(FILE, "-v", "-rs", "-p", "no:cacheprovider", "-k", "sum",
                     env={"DISTSPAWN_MAX_WORLD_SIZE": "2"})
    assert run.returncode == 0, run.output
    assert outcomes(run.output) == {"Processes::test_sum[ws2]": "PASSED",
                                    "Processes::test_sum[ws3]": "SKIPPED"}
    assert "(DISTSPAWN_MAX_WORLD_SIZE=2)" in run.output
    bad = pytest_run("plugin_bad_marker.py", "-p", "no:cacheprovider")
    assert bad.returncode == 2, bad.output
    assert ("@pytest.mark.world_size on BadMarker.test_never_runs: world sizes must be "
            "integers >= 1, got 'four'") in bad.output
    assert "Traceback" not in bad.output


def test_plain_pytest_runs_do_not_import_torch_and_unittest_ignores_markers():
    run = run_python(["-m", "pytest", "plugin_no_torch.py", "-q", "-p", "no:cacheprovider"],
                     timeout=300, warm=False)  # what the test process imports
    assert run.returncode == 0, run.output
    run = run_python(["-m", "unittest", "plugin_sizes.Processes.test_sum",
                      "plugin_sizes.Threads"], timeout=300)
    assert run.returncode == 0, run.output


def test_a_pytest_without_the_private_items_gets_a_message_naming_it():
    run = pytest_run("moved_pytest/test_sizes.py", "-v", "-p", "no:cacheprovider")
    assert run.returncode == 2, run.output  # a collection error, not a silent pass
    assert ("Sized asks for world sizes, and distspawn cannot make world-size items on "
            "pytest ") in run.output, run.output
    assert "(ImportError: cannot import name 'UnitTestCase'" in run.output
    plain = pytest_run("moved_pytest/test_sizes.py::Plain", "-v", "-p", "no:cacheprovider")
    assert plain.returncode == 0, plain.output
    assert outcomes(plain.output) == {"Plain::test_runs_as_pytest_collects_it": "PASSED"}


def test_a_threads_only_file_starts_no_rank_server_and_a_mixed_run_does():
    # The server imports torch in the background; beside rank threads it only
    # competes for the CPUs. The threaded test checks for the server.
    alone = pytest_run("threads_only_file.py", "-q", "-p", "no:cacheprovider")
    assert alone.returncode == 0 and "1 passed" in alone.output, alone.output
    # Beside a file with a multi-process test that runs (and some that skip).
    mixed = pytest_run("threads_only_file.py", "skipped_rank_classes.py", "-q", "-p",
                       "no:cacheprovider", env={"MIXED_IN_PROCESSES": "1", "RUNNABLE_TOO": "1"})
    assert mixed.returncode == 0 and "4 passed, 5 skipped" in mixed.output, mixed.output
    for run in (alone, mixed):
        assert run.leftover_pids == [] and run.leftover_files == []


@pytest.mark.parametrize("runnable_too", ["0", "1"])
def test_a_file_whose_rank_tests_all_skip_by_decorator_is_not_preloaded(runnable_too):
    # unittest.skip / skipIf and pytest's skip / skipif marks decide before the
    # test runs; the file's test asks the rank server's list (see there).
    run = pytest_run("skipped_rank_classes.py", "-q", "-p", "no:cacheprovider",
                     env={"RUNNABLE_TOO": runnable_too})
    passed = 3 if runnable_too == "1" else 2
    assert run.returncode == 0 and f"{passed} passed, 5 skipped" in run.output, run.output
    assert run.leftover_pids == [] and run.leftover_files == []


def test_a_file_whose_rank_tests_all_need_an_accelerator_starts_no_rank_server():
    # On a machine without one, the file's text shows every rank test skips
    # (class decorator, test decorator, pytest mark): no server is started.
    from distspawn.early import source_scan as distspawn_source_scan

    run = pytest_run("accelerator_only_ranks.py", "-q", "-p", "no:cacheprovider",
                     "-p", "count_server_starts")
    if distspawn_source_scan.accelerator_device_present():
        pytest.skip("this machine has an accelerator device: the rank tests may run here")
    assert run.returncode == 0 and "1 passed, 4 skipped" in run.output, run.output
    assert "rank server starts: 0" in run.output, run.output
    assert run.leftover_pids == [] and run.leftover_files == []


def test_a_file_whose_ranks_all_run_in_the_test_process_starts_no_rank_server():
    # Written for upstream's harness, as pytorch's tensor/parallel/test_tp_style.py:
    # per-device classes for every device but the CPU, and a LocalTensorMode copy
    # (upstream's local base, built on distspawn's classes in the stand-in mode).
    # No rank process starts: neither plugin starts the server.
    from distspawn.early import source_scan as distspawn_source_scan

    skip_unless_upstream_runs("local_tensor_only.py")
    if distspawn_source_scan.accelerator_device_present():
        pytest.skip("this machine has an accelerator device: its per-device class starts ranks")
    run = pytest_run("local_tensor_only.py", "-q", "-p", "no:cacheprovider",
                     "-p", "count_server_starts", "--distspawn-stand-in")
    assert run.returncode == 0 and "1 passed" in run.output, run.output
    assert "rank server starts: 0" in run.output, run.output
    assert run.leftover_pids == [] and run.leftover_files == []



def test_a_file_naming_distspawn_only_for_helpers_starts_no_rank_server():
    # Its TestCase and the fake backend (pytorch's tensor/debug/test_comm_mode.py
    # with its imports switched): no class of it starts rank processes.
    run = pytest_run("fake_world_only.py", "-q", "-p", "no:cacheprovider",
                     "-p", "count_server_starts")
    assert run.returncode == 0 and "1 passed" in run.output, run.output
    assert "rank server starts: 0" in run.output, run.output
    assert run.leftover_pids == [] and run.leftover_files == []


@pytest.mark.parametrize("upstream", ["0", "1"], ids=["distspawn", "stand-in"])
def test_a_file_naming_a_rank_class_no_class_derives_from_starts_no_rank_server(upstream):
    # The name alone started the server while pytest collected the file (both
    # CPUs busy for about 3 s, for no rank: 5.95 s wall against 4.48 s with
    # the plugin off, in the stand-in mode). Its source shows no class that
    # derives from it, nor one made as the file runs.
    if upstream == "1":
        skip_unless_upstream_runs("rank_class_named_only.py")
    extra = ["--distspawn-stand-in"] if upstream == "1" else []
    run = pytest_run("rank_class_named_only.py", "-q", "-p", "no:cacheprovider",
                     "-p", "count_server_starts", *extra, env={"UPSTREAM_HARNESS": upstream})
    assert run.returncode == 0 and "1 passed" in run.output, run.output
    assert "rank server starts: 0" in run.output, run.output
    assert run.leftover_pids == [] and run.leftover_files == []


def test_a_rank_class_from_the_projects_own_helpers_starts_the_server_early():
    # The file names neither distspawn nor a rank class: its base comes from
    # the project's helpers package, re-exported there (as torchao's tests
    # take theirs from torchao.testing.utils). The server starts while pytest
    # imports the file, before this process has imported torch.
    run = pytest_run("project_base/test_on_project_base.py", "-q", "-p", "no:cacheprovider",
                     "-p", "count_server_starts")
    assert run.returncode == 0 and "1 passed" in run.output, run.output
    assert "rank server starts: 1, before torch: 1" in run.output, run.output
    assert run.leftover_pids == [] and run.leftover_files == []


# (modules of a project: path -> source, whether the test file's classes
# start rank processes (None: it cannot tell), the same under the stand-in mode)
DERIVED_GUESSES = [
    ({"test_a.py": "from distspawn import TestCase\nclass A(TestCase): pass\n"}, False, False),
    ({"test_a.py": "import unittest\nclass A(unittest.TestCase): pass\n"}, False, False),
    ({"test_a.py": "from distspawn.dtensor import DTensorTestBase as Base\n"
                   "class A(Base): pass\n"}, True, True),
    ({"test_a.py": "from distspawn import MultiThreadedTestCase\n"
                   "class B(MultiThreadedTestCase): pass\nclass A(B): pass\n"}, False, False),
    ({"test_a.py": "from helpers import Base\nclass A(Base): pass\n",
      "helpers.py": "from distspawn import MultiProcessTestCase\n"
                    "class Base(MultiProcessTestCase): pass\n"}, True, True),
    ({"test_a.py": "import helpers as h\nclass A(h.Base): pass\n",
      "helpers.py": "import distspawn\nclass Base(distspawn.MultiProcessTestCase): pass\n"},
     True, True),
    ({"test_a.py": "from pkg import Base\nclass A(Base): pass\n",
      "pkg/__init__.py": "from .bases import Base\n",
      "pkg/bases.py": "from torch.testing._internal.common_fsdp import FSDPTest\n"
                      "class Base(FSDPTest): pass\n"}, False, True),
    ({"tests/__init__.py": "", "tests/common.py": "from distspawn.fsdp import FSDPTest\n"
                                                  "class Base(FSDPTest): pass\n",
      "tests/test_a.py": "from .common import Base\nclass A(Base): pass\n"}, True, True),
    ({"test_a.py": "from not_a_module_here import Base\nclass A(Base): pass\n"}, None, None),
    ({"test_a.py": "from distspawn import *\nclass A(MultiProcessTestCase): pass\n"},
     True, True),
]


@pytest.mark.parametrize("files, without, stand_in", DERIVED_GUESSES)
def test_the_early_start_guess_follows_bases_into_the_projects_modules(
        tmp_path, files, without, stand_in):
    from distspawn.early import source_scan as distspawn_source_scan

    for name, source in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(source)
    test_file = next(tmp_path / name for name in files if name.endswith("test_a.py"))
    text = test_file.read_bytes()
    for mode, expected in ((False, without), (True, stand_in)):
        assert distspawn_source_scan.derives_from_rank_processes(
            text, str(test_file), mode, []) is expected, (files, mode)

IMPORTED_CLASS_GUESSES = [
    # (modules: path -> source, whether test_a.py imports a rank class pytest collects)
    ({"test_a.py": "from distspawn import MultiProcessTestCase\n"}, False),
    ({"test_a.py": "from helpers import Ranks\n",
      "helpers.py": "from distspawn import MultiProcessTestCase\n"
                    "class Ranks(MultiProcessTestCase): pass\n"}, True),
    ({"test_a.py": "from helpers import plain\n", "helpers.py": "def plain(): pass\n"}, False),
    ({"test_a.py": "from not_a_module_here import Ranks\n"}, None),
]


@pytest.mark.parametrize("files, expected", IMPORTED_CLASS_GUESSES)
def test_the_early_start_guess_sees_a_rank_class_imported_from_the_project(
        tmp_path, files, expected):
    from distspawn.early import source_scan as distspawn_source_scan

    for name, source in files.items():
        (tmp_path / name).write_text(source)
    test_file = tmp_path / "test_a.py"
    assert distspawn_source_scan.imports_a_rank_class(
        test_file.read_bytes(), str(test_file), False, []) is expected, files


SKIP_GUESSES = [
    # (source, skips without an accelerator, skips with one)
    ("@unittest.skipUnless(torch.cuda.is_available(), 'gpu')\n"
     "class A(DTensorTestBase):\n    def test_a(self): pass\n", True, False),
    ("class A(MultiProcessTestCase):\n"
     "    @pytest.mark.skipif(torch.cuda.device_count() < 4, reason='4 gpus')\n"
     "    def test_a(self): pass\n"
     "    @unittest.skipIf(not TEST_MULTIGPU, 'gpus')\n    def test_b(self): pass\n"
     "    @skip_but_pass_in_sandcastle_if(torch.cuda.device_count() == 0, 'gpu')\n"
     "    def test_c(self): pass\n", True, False),
    ("if not torch.cuda.is_available():\n    pytest.skip('gpu', allow_module_level=True)\n"
     "class A(MultiProcessTestCase):\n    def test_a(self): pass\n", True, False),
    ("pytestmark = pytest.mark.skipif(not TEST_CUDA, reason='gpu')\n"
     "class A(FSDPTest):\n    def test_a(self): pass\n", True, False),
    ("pytestmark = pytest.mark.skip(reason='later')\n"
     "class A(MultiProcessTestCase):\n    def test_a(self): pass\n", True, True),
    ("@unittest.skip('broken')\nclass A(MultiProcessTestCase):\n    def test_a(self): pass\n",
     True, True),
    # A subclass of a local rank class: the base's tests are the subclass's too.
    ("class Base(DTensorTestBase):\n    @unittest.skipIf(not TEST_CUDA, 'gpu')\n"
     "    def test_a(self): pass\n"
     "class B(Base):\n    @unittest.skip('no')\n    def test_b(self): pass\n", True, False),
    ("class Base(DTensorTestBase):\n    def test_a(self): pass\n"
     "class B(Base):\n    @unittest.skip('no')\n    def test_b(self): pass\n", False, False),
    # Ranks start, then skip: skip_if_lt_x_gpu runs in each rank.
    ("class A(FSDPTest):\n    @skip_if_lt_x_gpu(2)\n    def test_a(self): pass\n", False, False),
    # NCCL is there in CUDA builds without a GPU.
    ("class A(FSDPTest):\n    @unittest.skipIf(not dist.is_nccl_available(), 'nccl')\n"
     "    def test_a(self): pass\n", False, False),
    # Runs where there is no GPU: skipIf on having one.
    ("@unittest.skipIf(torch.cuda.is_available(), 'cpu only')\n"
     "class A(MultiProcessTestCase):\n    def test_a(self): pass\n", False, False),
    # One test without a skip.
    ("class A(MultiProcessTestCase):\n    @unittest.skip('no')\n    def test_a(self): pass\n"
     "    def test_b(self): pass\n", False, False),
    # A local mixin brings a test that runs; an imported one may.
    ("class Mixin:\n    def test_m(self): pass\n"
     "class A(MultiProcessTestCase, Mixin):\n    @unittest.skip('no')\n"
     "    def test_a(self): pass\n", False, False),
    ("class A(MultiProcessTestCase, TestsFromElsewhere):\n    @unittest.skip('no')\n"
     "    def test_a(self): pass\n", False, False),
    # Not a skip on an accelerator ("input" names no npu).
    ("class A(MultiProcessTestCase):\n    @unittest.skipIf(not input_ok, 'input')\n"
     "    def test_a(self): pass\n", False, False),
    # Made into per-device classes for accelerators only (only_for a name bound
    # to device strings, as pytorch's test_functional_api.py does), or maybe cpu.
    ("DEVICE = 'cuda'\nif TEST_XPU:\n    DEVICE = 'xpu'\n"
     "class A(DistributedTestBase):\n    def test_a(self, device): pass\n"
     "instantiate_device_type_tests(A, globals(), only_for=DEVICE)\n", True, False),
    ("class A(DistributedTestBase):\n    def test_a(self, device): pass\n"
     "instantiate_device_type_tests(A, globals(), only_for=('cuda', 'cpu'))\n", False, False),
    ("class A(DistributedTestBase):\n    def test_a(self, device): pass\n"
     "instantiate_device_type_tests(A, globals(), only_for=['cuda'])\n"
     "instantiate_device_type_tests(A, globals())\n", False, False),
    ("class A(DistributedTestBase):\n    def test_a(self, device): pass\n"
     "instantiate_device_type_tests(A, globals(), only_for=pick_devices())\n", False, False),
    # Every device but the CPU (pytorch's tensor/parallel/test_tp_style.py),
    # or every device but another.
    ("class A(DTensorTestBase):\n    def test_a(self): pass\n"
     "instantiate_device_type_tests(A, globals(), except_for=['cpu'], allow_xpu=True)\n",
     True, False),
    ("class A(DTensorTestBase):\n    def test_a(self): pass\n"
     "instantiate_device_type_tests(A, globals(), except_for='mps')\n", False, False),
    # A world of as many ranks as accelerators (torchtitan's graph_trainer
    # tests): none without one, so no rank starts; on its own or a local base.
    ("class A(FSDPTest):\n    @property\n    def world_size(self):\n"
     "        return min(torch.cuda.device_count(), 4)\n    def test_a(self): pass\n",
     True, False),
    ("class Base(MultiProcessTestCase):\n    world_size = torch.accelerator.device_count()\n"
     "class A(Base):\n    def test_a(self): pass\n", True, False),
    # At least one rank, or a count of something else: ranks start.
    ("class A(FSDPTest):\n    @property\n    def world_size(self):\n"
     "        return max(1, min(torch.cuda.device_count(), 2))\n    def test_a(self): pass\n",
     False, False),
    ("class A(FSDPTest):\n    @property\n    def world_size(self):\n"
     "        return min(os.cpu_count(), 4)\n    def test_a(self): pass\n", False, False),
    # No rank class, a class with no test of its own, text that does not parse.
    ("class A(TestCase):\n    @unittest.skip('no')\n    def test_a(self): pass\n", False, False),
    ("class A(DTensorTestBase):\n    pass\n", False, False),
    ("class A(MultiProcessTestCase:\n", False, False),
]


def test_a_collected_class_whose_world_has_no_ranks_does_not_start_the_server():
    # Read after import, as the test will read it: a world size below 1 starts
    # no rank; a value that cannot be read counts as ranks that start.
    from distspawn import MultiProcessTestCase
    from distspawn.cases.empty_world import world_has_no_ranks as _world_has_no_ranks

    def sized(world_size):
        return type("Sized", (MultiProcessTestCase,), {"world_size": world_size})

    def broken(self):
        raise RuntimeError("no device query here")

    assert _world_has_no_ranks(sized(property(lambda self: 0)))
    assert _world_has_no_ranks(sized(0))
    assert not _world_has_no_ranks(sized(property(lambda self: 2)))
    assert not _world_has_no_ranks(sized("2"))
    assert not _world_has_no_ranks(sized(property(broken)))
    assert not _world_has_no_ranks(MultiProcessTestCase)


@pytest.mark.parametrize("source, without, with_one", SKIP_GUESSES)
def test_the_early_start_guess_reads_skips_from_the_source(source, without, with_one):
    from distspawn.early import source_scan as distspawn_source_scan

    text = source.encode()
    assert distspawn_source_scan.rank_tests_all_skip(text, accelerator=False) is without
    assert distspawn_source_scan.rank_tests_all_skip(text, accelerator=True) is with_one


def test_every_rank_class_is_named_in_the_plugins_early_start_guess():
    # The light plugin guesses from a file's text whether it may start rank
    # processes; a process class missing from its list would be taken for
    # threads-only when it sits beside a threaded one.
    import importlib
    import inspect

    from distspawn.early import source_scan as distspawn_source_scan
    from distspawn import MultiProcContinuousTest, MultiProcessTestCase, MultiThreadedTestCase
    from distspawn.cases.local_dtensor import runs_every_rank_here

    modules = ["distspawn", "distspawn.compat", "distspawn.dtensor", "distspawn.fsdp",
               "distspawn.distributed_test", "distspawn.fake_pg", "distspawn.sharded_tensor",
               "distspawn.rpc_utils"]
    found = {"processes": set(), "threads": set()}
    for module in map(importlib.import_module, modules):
        for name, obj in vars(module).items():
            if not inspect.isclass(obj):
                continue
            if runs_every_rank_here(obj):  # LocalTensorMode: no rank process
                assert not distspawn_source_scan.PROCESS_RANK_NAMES.search(
                    f"class Mine({name}):".encode()), name
                continue
            if issubclass(obj, (MultiProcessTestCase, MultiProcContinuousTest)):
                found["processes"].add(name)
            elif issubclass(obj, MultiThreadedTestCase):
                found["threads"].add(name)
    assert {"DTensorTestBase", "FSDPTest", "TestDistBackend", "ShardedTensorTestBase",
            "SpawnHelper"} <= found["processes"]
    assert "LocalDTensorTestBase" not in found["processes"]
    assert {"MultiThreadedTestCase", "FSDPTestMultiThread"} <= found["threads"]
    for kind, names in found.items():
        for name in names:
            text = f"class Mine({name}):".encode()
            assert bool(distspawn_source_scan.PROCESS_RANK_NAMES.search(text)) == \
                (kind == "processes"), name
            assert bool(distspawn_source_scan.THREAD_RANK_NAMES.search(text)) == \
                (kind == "threads"), name


def test_a_killed_xdist_workers_temp_folder_goes_with_the_run():
    # The worker cannot remove its private TMPDIR as it is SIGKILLed; the
    # controller removes the folder that holds every worker's.
    run = pytest_run("xdist_killed_worker.py", "-v", "-n", "1", "-p", "no:cacheprovider")
    assert run.returncode == 1, run.output
    seen = outcomes(run.output)
    assert seen == {"Ranks::test_a_ranks_start": "PASSED", "test_b_worker_killed": "FAILED",
                    "test_c_after_the_crash": "PASSED"}, run.output
    assert "crashed while running" in run.output, run.output
    assert run.leftover_pids == []
    assert [f for f in run.leftover_files if not f.startswith("pytest-of-")] == [], \
        run.leftover_files


@pytest.mark.parametrize("named", [False, True])
def test_xdist_workers_keep_torch_compiles_cache_where_it_outlives_the_run(tmp_path, named):
    # A worker's private TMPDIR is removed with it: inductor's cache, kept in
    # the temp folder by default, was compiled anew on every run.
    env = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path), "EXPECTED_CACHE": str(tmp_path)} \
        if named else {"TORCHINDUCTOR_CACHE_DIR": "", "EXPECTED_CACHE": ""}
    run = pytest_run("xdist_inductor_cache.py", "-q", "-n", "1", "-p", "no:cacheprovider",
                     env=env)
    assert run.returncode == 0 and "1 passed" in run.output, run.output


@pytest.mark.parametrize("workers", ["1", "cores"])
def test_an_xdist_worker_starts_the_rank_server_early_only_with_a_core_to_spare(workers):
    # With every core collecting, the early start only competed with the
    # workers, and was wasted where no test starts ranks.
    count = str(len(os.sched_getaffinity(0))) if workers == "cores" else workers
    run = pytest_run("xdist_early_start.py", "-q", "-n", count, "-p", "no:cacheprovider")
    assert run.returncode == 0 and "2 passed" in run.output, run.output
    assert run.leftover_pids == []


@pytest.mark.parametrize("mode", ["distspawn", "stand-in"])
def test_pytest_timeouts_thread_method_shows_the_ranks_before_it_ends_the_process(mode):
    # The thread method's timer prints the test process's stacks and ends it
    # with os._exit, so the note the signal method's exception gets could never
    # be seen: distspawn prints each running rank's stack first.
    pytest.importorskip("pytest_timeout")
    if mode == "stand-in":
        skip_unless_upstream_runs("plugin_timeout.py")
    flags = ["--distspawn-stand-in"] if mode == "stand-in" else []
    base = "upstream" if mode == "stand-in" else "distspawn"
    run = pytest_run("-q", "-p", "no:cacheprovider", "-p", "no:randomly", *flags,
                     "--timeout", "20", "--timeout-method", "thread", "plugin_timeout.py",
                     env={"PLUGIN_TIMEOUT_BASE": base})
    assert run.returncode == 1, run.output  # the plugin's os._exit(1)
    title = "distspawn: where this test's ranks are"
    assert title in run.output, run.output
    # Ours first, then the plugin's own report and stacks, as before.
    note, plugins = run.output.split(title, 1)[1].split("+ Timeout +", 1)
    assert "Stack of MainThread" in plugins, run.output
    assert "distspawn: 2 of 2 ranks (ranks 0, 1) still ran" in note, run.output
    rank0, rank1 = note.split("rank 0: ", 1)[1].split("rank 1: ", 1)
    assert re.search(r'plugin_timeout\.py", line \d+ in test_a_hang', rank0), run.output
    assert re.search(r'line \d+ in all_reduce', rank0), run.output
    assert re.search(r'plugin_timeout\.py", line \d+ in test_a_hang', rank1), run.output
    # The test process ended at once: its ranks and their files went with it.
    assert run.leftover_pids == [] and run.leftover_files == [], run.output


def test_without_rank_processes_pytest_timeouts_thread_method_is_its_own():
    # A test that starts no rank: the plugin's report alone, word for word.
    pytest.importorskip("pytest_timeout")
    run = pytest_run("-q", "-p", "no:cacheprovider", "--timeout", "5",
                     "--timeout-method", "thread", "plugin_timeout_in_process.py")
    assert run.returncode == 1, run.output
    assert "+ Timeout +" in run.output and "in test_hangs_in_the_test_process" in run.output
    assert "distspawn: where" not in run.output, run.output
