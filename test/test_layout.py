"""The package's folders keep the architecture (DESIGN.md section 2) honest.

engine/ is how ranks run and knows nothing of unittest or pytest; no arrow
runs from a lower layer up; no module grows past 600 lines; the modules
users import keep their names.
"""

import ast
import importlib
from pathlib import Path

import pytest

import distspawn

PACKAGE = Path(distspawn.__file__).parent
# Which subpackages each may import from (the top-level public faces may use all).
MAY_IMPORT = {
    # run before torch; what they import at the top is the standard library and
    # each other (test_the_early_modules_...); the plugin hands over to the
    # integrations, and the server to the engine, inside functions, once torch is in
    "early": {"early", "engine", "integrations"},
    "engine": {"engine", "early"},
    "backends": {"backends", "engine"},
    "fixtures": {"fixtures", "engine"},
    "cases": {"cases", "engine", "backends", "fixtures", "integrations"},
    "integrations": {"integrations", "engine", "fixtures", "cases", "early"},
}
PUBLIC_MODULES = ["distspawn", "distspawn.compat", "distspawn.distributed_test",
                  "distspawn.multi_threaded_pg", "distspawn.sharing", "distspawn.conformance",
                  "distspawn.private_apis", "distspawn.early.plugin", "distspawn.dtensor",
                  "distspawn.fsdp", "distspawn.fake_pg", "distspawn.checkpoint_utils",
                  "distspawn.sharded_tensor", "distspawn.rpc_utils"]


# `from .. import _stand_in_if_requested`, in each subpackage's __init__.
STAND_IN_TRIGGER = {"distspawn", "distspawn._stand_in_if_requested"}


def imports_of(path):
    """Every module a file imports, absolute, at any depth (lazy imports included)."""
    package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module
            yield module
            if not node.module or node.level:
                yield from (f"{module}.{alias.name}" for alias in node.names)


def layer_of(module):
    parts = module.split(".")
    return parts[1] if len(parts) > 2 and parts[0] == "distspawn" and parts[1] in MAY_IMPORT \
        else None


@pytest.mark.parametrize("layer", sorted(MAY_IMPORT))
def test_no_arrow_runs_up(layer):
    wrong = []
    for path in (PACKAGE / layer).rglob("*.py"):
        for module in imports_of(path):
            if path.name == "__init__.py" and module in STAND_IN_TRIGGER:
                continue  # every layer's first import checks for the stand-in mode
            target = layer_of(module)
            if target is not None and target not in MAY_IMPORT[layer]:
                wrong.append(f"{path.relative_to(PACKAGE)} imports {module}")
            if module == "distspawn" or (module.startswith("distspawn.") and target is None
                                         and module.split(".")[1] not in MAY_IMPORT):
                if layer not in ("cases", "integrations", "early"):
                    wrong.append(f"{path.relative_to(PACKAGE)} imports {module}")
    assert wrong == []


def test_the_engine_knows_nothing_of_unittest_or_pytest():
    found = [f"{path.name} imports {module}" for path in (PACKAGE / "engine").rglob("*.py")
             for module in imports_of(path)
             if module.split(".")[0] in ("unittest", "pytest", "_pytest")]
    assert found == []


def test_no_module_is_over_600_lines():
    sizes = {str(p.relative_to(PACKAGE)): len(p.read_text().splitlines())
             for p in PACKAGE.rglob("*.py")}
    assert {name: n for name, n in sizes.items() if n > 600} == {}


@pytest.mark.parametrize("module", PUBLIC_MODULES)
def test_public_modules_keep_their_names(module):
    importlib.import_module(module)


def test_the_light_pytest_plugin_names_what_the_engine_reads():
    # distspawn.early.plugin starts the rank server before torch is imported, so it
    # spells these out instead of importing them.
    import distspawn.early.plugin as distspawn_pytest
    from distspawn.engine import rank_server

    assert distspawn_pytest.SERVER_PRELOAD == rank_server.FORKSERVER_PRELOAD


def test_the_light_pytest_plugin_reads_the_stand_in_variable_as_distspawn_does():
    import distspawn.early.plugin as distspawn_pytest
    from distspawn.integrations import stand_in

    assert distspawn_pytest.STAND_IN_VAR == stand_in.STAND_IN_VAR
    assert distspawn_pytest.STAND_IN_ON == stand_in.STAND_IN_ON
    assert distspawn_pytest.STAND_IN_OFF == stand_in.STAND_IN_OFF
    assert distspawn_pytest._bad_stand_in_value("x") == stand_in.bad_value_message("x")


def test_the_early_modules_and_the_package_import_no_torch(tmp_path):
    # The plugin loads in every pytest run; the rank server's first preload
    # must run before torch so that every import after it sees the handed-over
    # environment. Neither may import torch, nor (through the package's
    # __init__) any distspawn module outside distspawn.early, even with the
    # stand-in mode asked for.
    import subprocess
    import sys

    code = ("import sys, distspawn, distspawn.early.plugin, distspawn.early.rank_server_boot, "
            "distspawn.early.source_scan; print(sorted(m for m in sys.modules "
            "if m.split('.')[0] in ('torch', 'distspawn', 'numpy')))")
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           cwd=tmp_path, env={**__import__("os").environ,
                                              "DISTSPAWN_STAND_IN": "1"})
    assert found.returncode == 0, found.stderr
    assert found.stdout.split() == ["['distspawn',", "'distspawn.early',",
                                    "'distspawn.early.plugin',",
                                    "'distspawn.early.rank_server_boot',",
                                    "'distspawn.early.source_scan']"], found.stdout


def test_every_public_name_resolves_from_its_home_and_old_module_names_still_import():
    import sys

    assert len(distspawn.__all__) == len(set(distspawn.__all__))
    for name in distspawn.__all__:
        value = getattr(distspawn, name)
        assert name in dir(distspawn)
        home = importlib.import_module(f"distspawn.{distspawn._HOME_OF[name]}")
        assert getattr(home, name) is value, name
    # Modules from before the package took its folders: the same objects.
    tempdirs = importlib.import_module("distspawn.tempdirs")
    from distspawn import models

    assert tempdirs is sys.modules["distspawn.fixtures.tempdirs"]
    assert models is sys.modules["distspawn.fixtures.models"]
    assert models.__spec__.name == "distspawn.fixtures.models"
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        distspawn.no_such_name  # noqa: B018
