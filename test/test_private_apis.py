"""The list of private APIs is complete, and right about the installed releases."""

import re
from pathlib import Path

from distspawn import private_apis

PACKAGE = Path(private_apis.__file__).parent
# Private names reached through torch, c10d, multiprocessing, sys or pytest:
# attribute chains, imports from private modules, and getattr(..., "_name").
ROOTS = r"(?:torch|dist|c10d|distributed_c10d|multiprocessing|mp|sys|_pytest)"
CHAIN = re.compile(rf"\b{ROOTS}((?:\.\w+)+)")
FROM_IMPORT = re.compile(r"^\s*from ((?:torch|_pytest)[\w.]*) import ([\w, ]+)", re.M)
GETATTR = re.compile(rf"getattr\({ROOTS}[\w.]*, \"(_[a-zA-Z]\w*)\"")


def private_names_used():
    found = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name == "private_apis.py":
            continue
        code = "\n".join(line.split("#")[0] for line in path.read_text().splitlines())
        names = set()
        for match in CHAIN.finditer(code):
            names.update(p for p in match.group(1).split(".") if p.startswith("_")
                         and not p.startswith("__"))
        for module, imported in FROM_IMPORT.findall(code):
            names.update(p for p in module.split(".") if p.startswith("_"))
            names.update(n.strip() for n in imported.split(",") if n.strip().startswith("_"))
        names.update(GETATTR.findall(code))
        for name in names:
            found.setdefault(name, []).append(str(path.relative_to(PACKAGE)))
    return found


def listed_names():
    return {part.rstrip("()") for api in private_apis.PRIVATE_APIS
            for part in api.path.split(".")}


def test_every_private_name_the_package_uses_is_listed():
    unlisted = {name: where for name, where in private_names_used().items()
                if name not in listed_names()}
    assert unlisted == {}, f"add these to distspawn/private_apis.py: {unlisted}"


def test_every_listed_name_resolves_on_the_installed_releases():
    absent = [api.path for api in private_apis.missing() if not api.may_be_missing]
    assert absent == [], absent


def test_every_entry_says_where_it_is_used_and_what_missing_costs():
    for api in private_apis.PRIVATE_APIS:
        module = api.used_by.split(",")[0].strip()
        assert (PACKAGE / (module.replace(".", "/") + ".py")).exists(), api
        assert api.when_missing.strip(), api


def test_a_missing_name_is_reported_not_raised():
    assert private_apis.lookup("torch._no_such_private_thing") is private_apis._ABSENT
    assert private_apis.lookup("no_such_module._x") is private_apis._ABSENT


def test_every_present_name_takes_the_keywords_distspawn_passes():
    assert private_apis.reshaped() == {}


def test_a_renamed_keyword_is_reported():
    api = private_apis.PrivateAPI("torch.distributed._coalescing_manager", "conformance.collectives",
                                  "-", takes=("async_ops", "no_such_keyword"))
    assert private_apis.unaccepted(api) == ["no_such_keyword"]
