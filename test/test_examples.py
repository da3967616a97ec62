"""Every example runs, the way README.rst's main job runs them."""

import xml.etree.ElementTree as ET
from pathlib import Path

from harness import conformance_counts, run_python

ROOT = Path(__file__).resolve().parent.parent


def test_the_example_suite_passes(tmp_path):
    xml = tmp_path / "examples.xml"
    run = run_python(["-m", "pytest", "examples", "-q", "-p", "no:cacheprovider",
                      f"--junitxml={xml}"], cwd=ROOT, timeout=600,
                     # The conformance example's defaults, whatever this shell sets.
                     env={"BACKEND": "gloo", "WORLD_SIZE": "2"})
    assert run.returncode == 0, run.output
    cases = list(ET.parse(xml).getroot().iter("testcase"))
    ran = {case.get("classname").split(".")[1] for case in cases
           if case.find("skipped") is None}
    files = {path.stem for path in (ROOT / "examples").glob("test_*.py")}
    assert ran == files, f"examples with no test that ran: {sorted(files - ran)}"
    # The conformance suite at the example's default world size, 2 (test_matrix.py
    # runs it at 3): every test counted, the skips only those that must skip.
    conformance = [case for case in cases if case.get("classname").endswith(".TestGlooConformance")]
    skips = [case.find("skipped").get("message") or "" for case in conformance
             if case.find("skipped") is not None]
    assert (len(conformance) - len(skips), len(skips)) == conformance_counts(2, skips)
    assert run.leftover_pids == []
