"""The documentation builds clean, and its reference covers every public name.

Needs Sphinx (``pip install -e ".[docs]"``); skipped without it. CI builds
the docs with ``-W`` and points DISTSPAWN_DOCS_HTML at the build, which these
tests then read instead of building again.
"""

import importlib
import os
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The modules whose every public name has a reference entry (docs/reference/api.rst).
REFERENCED_MODULES = ["distspawn", "distspawn.dtensor", "distspawn.fsdp", "distspawn.fake_pg",
                      "distspawn.multi_threaded_pg"]

pytest.importorskip("sphinx", reason="the docs extra is not installed")


@pytest.fixture(scope="module")
def built_docs(tmp_path_factory) -> Path:
    given = os.environ.get("DISTSPAWN_DOCS_HTML")
    if given:
        return Path(given)
    out = tmp_path_factory.mktemp("docs-html")
    build = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b",
                            "html", str(ROOT / "docs"), str(out)],
                           capture_output=True, text=True)
    assert build.returncode == 0, build.stdout + build.stderr
    return out


def documented_objects(html: Path) -> dict[str, str]:
    """Every object the reference documents, from Sphinx's inventory: full name -> role."""
    lines = (html / "objects.inv").read_bytes().split(b"\n", 4)
    assert lines[0] == b"# Sphinx inventory version 2", lines[0]
    found = {}
    for line in zlib.decompress(lines[4]).decode().splitlines():
        name, role = line.split(" ", 2)[:2]
        found[name] = role
    return found


def test_every_public_name_has_a_reference_entry(built_docs):
    objects = documented_objects(built_docs)
    missing = []
    for module_name in REFERENCED_MODULES:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            value = getattr(module, name)
            # Documented under this module, or where it is defined and
            # documented (a re-export: distspawn.dtensor's MultiProcessTestCase).
            homes = {f"{module_name}.{name}"}
            homes |= {f"{other}.{name}" for other in REFERENCED_MODULES
                      if getattr(importlib.import_module(other), name, None) is value}
            qualname = getattr(value, "__qualname__", None)
            if getattr(value, "__module__", None) and qualname:
                homes.add(f"{value.__module__}.{qualname}")
            if not homes & set(objects):
                missing.append(f"{module_name}.{name}")
    assert missing == [], f"no reference entry for: {', '.join(missing)}"


def test_every_public_module_says_what_it_exports():
    for module_name in REFERENCED_MODULES:
        module = importlib.import_module(module_name)
        assert isinstance(module.__dict__.get("__all__"), list), module_name
        assert all(hasattr(module, name) for name in module.__all__), module_name
