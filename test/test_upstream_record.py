"""Upstream's runs replayed from records: found again, refused when stale, and
never for a run that has paths of its own."""

import json

import pytest

import upstream_record
from harness import Run, SCENARIOS


@pytest.fixture
def records(tmp_path, monkeypatch):
    folder = tmp_path / "records"
    monkeypatch.setattr(upstream_record, "release_folder", lambda: folder)
    return folder


@pytest.fixture
def scenario(tmp_path):
    # A scenario folder of its own: a file, a local module it imports, a conftest.
    root = tmp_path / "scenarios"
    (root / "pkg").mkdir(parents=True)
    (root / "helper_mod.py").write_text("VALUE = 1\n")
    (root / "pkg" / "conftest.py").write_text("")
    (root / "pkg" / "case.py").write_text("import os\nimport helper_mod\n")
    (root / "helper_for_pkg.py").write_text("")
    return root


def test_a_run_is_named_by_its_arguments_and_variables_unless_it_has_a_path_of_its_own(
        tmp_path):
    assert upstream_record.key(["x.py", "-v"], {"A": "1"}, SCENARIOS) == \
        upstream_record.key(["x.py", "-v"], {"A": "1"}, SCENARIOS)
    assert upstream_record.key(["x.py", "-v"], {"A": "2"}, SCENARIOS) != \
        upstream_record.key(["x.py", "-v"], {"A": "1"}, SCENARIOS)
    assert upstream_record.key(["x.py"], {"LOG": str(tmp_path / "log")}, SCENARIOS) is None
    assert upstream_record.key([str(tmp_path / "x.py")], None, SCENARIOS) is None


def test_the_files_a_run_reads_are_the_named_ones_their_local_imports_and_conftests(scenario):
    files = upstream_record.scenario_files(["-m", "pytest", "pkg/case.py", "-q"], scenario)
    assert [str(f.relative_to(scenario)) for f in files] == [
        "helper_mod.py", "pkg/case.py", "pkg/conftest.py"]


def test_a_recorded_run_is_replayed_until_a_file_it_reads_changes(records, scenario, monkeypatch):
    args, env = ["pkg/case.py", "-v"], {"UPSTREAM_HARNESS": "1"}
    outcome = {"returncode": 1, "output": "test_x ... FAIL", "leftover_files": [], "elapsed": 7.5}
    monkeypatch.setenv(upstream_record.MODE_VAR, "record")
    upstream_record.write(args, env, scenario, outcome)
    (record_file,) = records.glob("*.json")
    written = json.loads(record_file.read_text())
    assert written["scenario_files"][0].endswith("helper_mod.py") and written["commit"]
    monkeypatch.setenv(upstream_record.MODE_VAR, "live")
    assert upstream_record.replayed(args, env, scenario) is None
    monkeypatch.delenv(upstream_record.MODE_VAR)  # replay, the default
    assert upstream_record.replayed(args, env, scenario)["output"] == "test_x ... FAIL"
    assert upstream_record.replayed(args, {"UPSTREAM_HARNESS": "0"}, scenario) is None
    (scenario / "helper_mod.py").write_text("VALUE = 2\n")  # imported by the scenario
    with pytest.raises(upstream_record.StaleRecord, match="scenario files have changed since "
                       r".*Refresh the records with: python test/record_upstream.py"):
        upstream_record.replayed(args, env, scenario)


def test_a_mode_not_known_is_one_clear_error(monkeypatch):
    monkeypatch.setenv(upstream_record.MODE_VAR, "sometimes")
    with pytest.raises(ValueError, match="DISTSPAWN_TEST_UPSTREAM='sometimes': expected one "
                       "of replay, live, record"):
        upstream_record.mode()


def test_run_is_what_a_replay_returns():
    assert Run(0, "", [], [], 1.0).returncode == 0
