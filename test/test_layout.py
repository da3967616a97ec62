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
    "engine": {"engine"},
    "backends": {"backends", "engine"},
    "fixtures": {"fixtures", "engine"},
    "cases": {"cases", "engine", "backends", "fixtures", "integrations"},
    "integrations": {"integrations", "engine", "fixtures", "cases"},
}
PUBLIC_MODULES = ["distspawn", "distspawn.compat", "distspawn.distributed_test",
                  "distspawn.multi_threaded_pg", "distspawn.sharing", "distspawn.conformance",
                  "distspawn.private_apis", "distspawn_pytest", "distspawn.dtensor",
                  "distspawn.fsdp", "distspawn.fake_pg", "distspawn.checkpoint_utils",
                  "distspawn.sharded_tensor", "distspawn.rpc_utils"]


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
            target = layer_of(module)
            if target is not None and target not in MAY_IMPORT[layer]:
                wrong.append(f"{path.relative_to(PACKAGE)} imports {module}")
            if module == "distspawn" or (module.startswith("distspawn.") and target is None
                                         and module.split(".")[1] not in MAY_IMPORT):
                if layer != "cases" and layer != "integrations":
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
    # distspawn_pytest starts the rank server before torch is imported, so it
    # spells these out instead of importing them.
    import distspawn_pytest
    from distspawn.engine import rank_server

    assert distspawn_pytest.SERVER_PRELOAD == rank_server.FORKSERVER_PRELOAD


def test_the_light_pytest_plugin_reads_the_stand_in_variable_as_distspawn_does():
    import distspawn_pytest
    from distspawn.integrations import stand_in

    assert distspawn_pytest.STAND_IN_VAR == stand_in.STAND_IN_VAR
    assert distspawn_pytest.STAND_IN_ON == stand_in.STAND_IN_ON
    assert distspawn_pytest.STAND_IN_OFF == stand_in.STAND_IN_OFF
    assert distspawn_pytest._bad_stand_in_value("x") == stand_in.bad_value_message("x")
