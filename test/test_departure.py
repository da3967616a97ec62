"""Ranks leave together: one that finished first stays until its peers finish too."""

import pytest

from harness import run_python


@pytest.mark.parametrize("start_method", ["forkserver", "fork", "spawn"])
def test_the_first_rank_to_finish_stays_until_the_others_are_done(start_method):
    run = run_python(["leave_together.py", "-v"],
                     env={"DISTSPAWN_START_METHOD": start_method}, timeout=120)
    assert run.returncode == 0, run.output
    assert run.verdict_line("test_first_to_finish_waits_for_the_rest").endswith("ok")
    assert run.leftover_pids == [] and run.leftover_files == []
