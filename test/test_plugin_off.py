"""docs/howto/plugin-off.rst: what a run with distspawn's pytest plugin off keeps and loses."""

import shutil
from pathlib import Path

import pytest

import distspawn
from harness import run_python, upstream_module_imports

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
PYTEST = ["-m", "pytest", "-rA", "-p", "no:cacheprovider"]
HEADER = f"distspawn {distspawn.__version__}: rank processes start by"

FAILING = '''
from distspawn import MultiProcessTestCase


class Fails(MultiProcessTestCase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def test_rank_one_raises(self):
        if self.rank == 1:
            raise ValueError("rank one broke")
'''


def test_ranks_still_run_on_the_engine_but_world_sizes_are_not_expanded(tmp_path):
    shutil.copy(EXAMPLES / "test_world_sizes.py", tmp_path)
    (tmp_path / "test_fails.py").write_text(FAILING)
    run = run_python([*PYTEST, "-p", "no:distspawn", "test_world_sizes.py", "test_fails.py"],
                     cwd=tmp_path)
    assert run.returncode == 1, run.output
    # one item per test, at the class's world size, and pytest's unknown-mark warning
    assert "PASSED test_world_sizes.py::TestCollectivesAtEverySize::test_all_gather\n" \
        in run.output
    assert "[ws2]" not in run.output
    assert "PytestUnknownMarkWarning: Unknown pytest.mark.world_size" in run.output
    # the verdict and its report are the engine's, in the test's message
    assert "distspawn.RankFailure: test_fails.Fails.test_rank_one_raises failed" in run.output
    assert "1 of 4 ranks failed (rank 1):" in run.output
    assert "ValueError: rank one broke" in run.output
    assert HEADER not in run.output
    assert "3 passed, 1 failed" in run.output or "1 failed, 3 passed" in run.output
    assert run.leftover_files == [] and run.leftover_pids == []


def test_with_every_plugin_off_dash_p_loads_distspawns_alone(tmp_path):
    shutil.copy(EXAMPLES / "test_world_sizes.py", tmp_path)
    run = run_python([*PYTEST, "-p", "distspawn.early.plugin", "test_world_sizes.py"],
                     cwd=tmp_path, env={"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
    assert run.returncode == 0, run.output
    assert HEADER in run.output
    assert "test_all_gather[ws3]" in run.output


def test_the_stand_in_option_needs_the_plugin(tmp_path):
    shutil.copy(EXAMPLES / "test_world_sizes.py", tmp_path)
    run = run_python([*PYTEST, "-p", "no:distspawn", "--distspawn-stand-in",
                      "test_world_sizes.py"], cwd=tmp_path)
    assert run.returncode == 4, run.output
    assert "unrecognized arguments: --distspawn-stand-in" in run.output


def test_without_the_plugin_the_variable_leaves_upstream_files_on_upstreams_harness(tmp_path):
    # DISTSPAWN_STAND_IN=1 is read when distspawn is imported; a file written
    # for upstream's harness never imports it, so only the plugin (or
    # python -m distspawn.stand_in) can stand in.
    if not upstream_module_imports("torch.testing._internal.common_distributed"):
        pytest.skip("upstream's harness does not import here (it needs expecttest)")
    (tmp_path / "test_upstream_file.py").write_text('''
import sys
from torch.testing._internal.common_distributed import MultiProcessTestCase


class OnUpstream(MultiProcessTestCase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def test_which_engine(self):
        assert "distspawn.engine.worker" not in sys.modules
''')
    run = run_python([*PYTEST, "-p", "no:distspawn", "test_upstream_file.py"], cwd=tmp_path,
                     env={"DISTSPAWN_STAND_IN": "1"})
    assert run.returncode == 0, run.output
    assert "PASSED test_upstream_file.py::OnUpstream::test_which_engine" in run.output
