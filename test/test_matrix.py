"""python -m distspawn: the backend x world-size matrix, its summary, JUnit XML, exit codes."""

import xml.etree.ElementTree as ET

from distspawn.integrations.matrix import backend_unavailable
from harness import conformance_counts, run_python


def test_matrix_runs_each_cell_and_reports(tmp_path):
    junit = tmp_path / "matrix.xml"
    run = run_python(["-m", "distspawn", "matrix_suite.py", "--backend", "gloo,nccl",
                      "--world-size", "2,3", "--junit-xml", str(junit)], timeout=300)
    assert run.returncode == 1, run.output  # test_fails_at_3 fails in the ws=3 cell
    assert "[1/4] gloo ws=2 ... 2/0/1" in run.output
    assert "[2/4] gloo ws=3 ... 1/1/1" in run.output
    # Where nccl can run (a GPU), its cells run; on CPU they skip with the reason.
    nccl_skips = backend_unavailable("nccl") is not None
    if nccl_skips:
        assert "[3/4] nccl ws=2 ... skipped: nccl" in run.output
    assert "cells: passed/failed/skipped and time" in run.output
    # The failure is named where it happens and again after the table, with its
    # node id and one line saying what failed.
    named = ("FAILED matrix_suite.py::M::test_fails_at_3 - 3 of 3 ranks failed "
             "(ranks 0, 1, 2): AssertionError: 3 == 3, expected them to differ")
    progress, summary = run.output.split("cells: passed/failed/skipped and time")
    assert progress.split("[2/4] gloo ws=3 ... 1/1/1")[1].splitlines()[1].strip() == named
    assert "gloo ws=3:\n  " + named in summary, run.output
    if nccl_skips:  # the one failure of the run
        assert "failed (1):\ngloo ws=3:\n  " + named in summary, run.output
    assert run.leftover_pids == []
    suites = {s.get("name"): s for s in ET.parse(junit).getroot()}
    assert sorted(suites) == ["gloo.ws2", "gloo.ws3", "nccl.ws2", "nccl.ws3"]
    assert (suites["gloo.ws2"].get("tests"), suites["gloo.ws2"].get("failures"),
            suites["gloo.ws2"].get("skipped")) == ("3", "0", "1")
    assert suites["gloo.ws3"].get("failures") == "1"
    if nccl_skips:
        assert suites["nccl.ws2"].get("skipped") == "1"


def test_matrix_exits_zero_when_nothing_failed():
    run = run_python(["-m", "distspawn", "matrix_suite.py", "--world-size", "2"], timeout=300)
    assert run.returncode == 0, run.output
    assert "gloo     2/0/1" in run.output


def test_help_explains_every_option_with_an_example():
    run = run_python(["-m", "distspawn", "--help"], timeout=60)
    assert run.returncode == 0
    for option in ("--backend", "--world-size", "--junit-xml", "-k", "examples:",
                   "python -m distspawn test/test_distributed_spawn.py --backend gloo"):
        assert option in run.output, option


def test_bad_world_size_is_a_usage_error():
    run = run_python(["-m", "distspawn", "matrix_suite.py", "--world-size", "2,zero"],
                     timeout=60)
    assert run.returncode == 2
    assert "--world-size: 'zero' is not an integer >= 1" in run.output


# At world size 3 only: the examples run the suite at 2 (test_examples.py
# checks its counts there), and each run takes about 45 s of CI's two cores.
def test_the_conformance_suite_on_gloo_at_world_size_3(tmp_path):
    # Ranks are forked from a server started during an earlier test, whose
    # TEMP_DIR is gone: the rank must import the test module only after taking
    # the test process's environment.
    junit = tmp_path / "conformance.xml"
    run = run_python(["-m", "distspawn", "../test_distributed_spawn.py", "--backend", "gloo",
                      "--world-size", "3", "--junit-xml", str(junit)], timeout=900)
    assert run.returncode == 0, run.output
    suite = {s.get("name"): s for s in ET.parse(junit).getroot()}["gloo.ws3"]
    assert suite.get("tests") == "174"
    passed, skipped = conformance_counts(
        3, [s.get("message") or "" for s in suite.iter("skipped")])
    assert f"[1/1] gloo ws=3 ... {passed}/0/{skipped}" in run.output, run.output
    assert run.leftover_pids == []
