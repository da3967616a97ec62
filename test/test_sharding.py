"""A suite sharded across CI machines by recorded durations (pytest-split).

docs/howto/sharding.rst says that pytest-split's groups, built from the
durations of a run before, cover every world-size item exactly once and give
the verdicts of the whole run. This checks it on the world-size example: each
``@pytest.mark.world_size`` item is its own entry in the durations file and
lands in exactly one group. Needs pytest-split (``.[test]`` installs it).
"""

import json
import re
import shutil
from pathlib import Path

import pytest

from harness import run_python

pytest.importorskip("pytest_split", reason="pytest-split is not installed")

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "test_world_sizes.py"
OUTCOME = re.compile(r"^(PASSED|SKIPPED|FAILED|ERROR) (\S+)", re.M)


def outcomes(output: str) -> set[tuple[str, str]]:
    # -rA's summary: "PASSED file::Class::test[ws2]"; a skip names its file only,
    # so skips are compared by count (below), passes and failures by name.
    return {(verdict, node) for verdict, node in OUTCOME.findall(output) if verdict != "SKIPPED"}


def test_groups_by_recorded_durations_cover_every_world_size_item_once(tmp_path):
    shutil.copy(EXAMPLE, tmp_path)
    durations = tmp_path / "durations.json"
    base = ["-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "test_world_sizes.py"]

    whole = run_python([*base, "--store-durations", f"--durations-path={durations}"],
                       cwd=tmp_path)
    assert whole.returncode == 0, whole.output
    recorded = json.loads(durations.read_text())
    assert {"test_world_sizes.py::TestCollectivesAtEverySize::test_all_gather[ws2]",
            "test_world_sizes.py::TestCollectivesAtEverySize::test_all_gather[ws4]"} \
        <= set(recorded), sorted(recorded)

    groups = [run_python([*base, "--splits=2", f"--group={group}",
                          f"--durations-path={durations}"], cwd=tmp_path)
              for group in (1, 2)]
    for group in groups:
        assert group.returncode == 0, group.output
        assert group.leftover_files == [] and group.leftover_pids == []
    found = [outcomes(group.output) for group in groups]
    assert all(found), "a group ran no test: " + "\n".join(g.output for g in groups)
    assert not found[0] & found[1], "an item ran in both groups"
    assert found[0] | found[1] == outcomes(whole.output)
    skipped = [int(m) for g in groups for m in re.findall(r"(\d+) skipped", g.output)]
    assert sum(skipped) == int(re.search(r"(\d+) skipped", whole.output).group(1))
