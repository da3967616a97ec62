"""A pytest plugin (``-p forged_report``): the rank server's report is replaced,
on its way into the test process, by a forged one (FORGED_REPORT says which):

- ``folders``: the real report, naming for removal should the run be killed
  every folder listed in FORGED_FOLDERS (``os.pathsep`` between them);
- ``malformed``: the real report with ``modules`` a list, not an object.

Everything after the replacement is distspawn's own: the report's checks,
the leftovers watcher, the fall-back. With FORGED_KILL=1 the test process
kills itself (SIGKILL, as a CI job's limit does) once its first test passed,
after printing ``victim passed``.
"""

import json
import os
import signal
import sys

from distspawn.engine import server_report

_real_parse_report = server_report.parse_report


def _forged(data):
    report = json.loads(data)
    if os.environ["FORGED_REPORT"] == "folders":
        report["exit_folders"] = os.environ["FORGED_FOLDERS"].split(os.pathsep)
    else:
        report["modules"] = []
    return _real_parse_report(json.dumps(report).encode() + b"\n")


server_report.parse_report = _forged


def pytest_runtest_logreport(report):
    if report.when == "call" and report.passed and os.environ.get("FORGED_KILL") == "1":
        print("victim passed", flush=True)
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)
