"""Every example runs, the way README.rst's main job runs them."""

import xml.etree.ElementTree as ET
from pathlib import Path

from harness import run_python

ROOT = Path(__file__).resolve().parent.parent


def test_the_example_suite_passes(tmp_path):
    xml = tmp_path / "examples.xml"
    run = run_python(["-m", "pytest", "examples", "-q", "-p", "no:cacheprovider",
                      f"--junitxml={xml}"], cwd=ROOT, timeout=600)
    assert run.returncode == 0, run.output
    cases = list(ET.parse(xml).getroot().iter("testcase"))
    ran = {case.get("classname").split(".")[1] for case in cases
           if case.find("skipped") is None}
    files = {path.stem for path in (ROOT / "examples").glob("test_*.py")}
    assert ran == files, f"examples with no test that ran: {sorted(files - ran)}"
    assert run.leftover_pids == []
