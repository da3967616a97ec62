"""The built wheel installs one top-level name, and that is what Python imports.

Run by .ci/run from outside the checkout, in a venv with the wheel installed:
    python .ci/check_wheel.py dist/distspawn-VERSION-py3-none-any.whl
"""

import sys
import zipfile
from importlib import metadata
from pathlib import PurePosixPath

wheel = zipfile.ZipFile(sys.argv[1])
tops = {PurePosixPath(name).parts[0] for name in wheel.namelist()}
code_tops = sorted(t for t in tops if not t.endswith((".dist-info", ".data")))
top_level = [line for name in wheel.namelist() if name.endswith(".dist-info/top_level.txt")
             for line in wheel.read(name).decode().split()]
entry_points = [ep for ep in metadata.entry_points(group="pytest11") if ep.name == "distspawn"]

import distspawn  # noqa: E402 - after reading the wheel: the installed copy, not a checkout

problems = []
if code_tops != ["distspawn"]:
    problems.append(f"the wheel holds top-level {code_tops}, expected ['distspawn']")
if top_level not in ([], ["distspawn"]):
    problems.append(f"top_level.txt names {top_level}, expected ['distspawn']")
if "site-packages" not in distspawn.__file__:
    problems.append(f"imported distspawn from {distspawn.__file__}, not the installed wheel")
if [ep.value for ep in entry_points] != ["distspawn.early.plugin"]:
    problems.append(f"pytest11 entry point: {[ep.value for ep in entry_points]}")
if problems:
    sys.exit("wheel check failed: " + "; ".join(problems))
print(f"wheel check: one top-level name, distspawn {distspawn.__version__} from "
      f"{distspawn.__file__}; pytest plugin distspawn.early.plugin")
