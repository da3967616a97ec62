"""Sphinx configuration for distspawn's documentation (``python -m sphinx -W -b html docs OUT``)."""

import os
import sys

sys.path.insert(0, os.path.abspath(".."))

import distspawn  # noqa: E402

project = "distspawn"
author = "distspawn's authors"
copyright = "the distspawn authors"
release = distspawn.__version__
version = release

extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon", "sphinx.ext.viewcode"]
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}
# torch's own objects appear in signatures and bases: they are not ours to document.
nitpicky = False
suppress_warnings = ["ref.python"]

html_theme = "furo"
html_title = f"distspawn {release}"
html_static_path = ["_static"]
exclude_patterns = ["_build"]


# -- the reference's module-level values and private names -------------------
# automodule documents the classes and functions in each module's __all__; the
# values there (constants, flags, type aliases), which it cannot tell from
# imports, are listed from __all__ too, into reference/generated/, so that
# every public name has an entry (test/test_docs.py checks it).
import importlib  # noqa: E402
import inspect  # noqa: E402
from pathlib import Path  # noqa: E402

REFERENCED_MODULES = ["distspawn", "distspawn.dtensor", "distspawn.fsdp", "distspawn.fake_pg",
                      "distspawn.multi_threaded_pg"]


def _value_text(value) -> str:
    text = repr(value)
    return text if len(text) <= 70 and "\n" not in text else f"<{type(value).__name__}>"


def _write_generated_entries() -> None:
    folder = Path(__file__).parent / "reference" / "generated"
    folder.mkdir(exist_ok=True)
    for module_name in REFERENCED_MODULES:
        module = importlib.import_module(module_name)
        lines = [f".. py:currentmodule:: {module_name}", ""]
        for name in module.__all__:
            value = getattr(module, name)
            full = f"{module_name}.{name}"
            if inspect.isclass(value) or inspect.isroutine(value):
                # automodule's, but for the names upstream spells with an
                # underscore and those the module makes on demand (__getattr__)
                if name.startswith("_") or name not in vars(module):
                    kind = "autoclass" if inspect.isclass(value) else "autofunction"
                    lines += [f".. {kind}:: {full}", ""]
                continue
            lines += [f".. py:data:: {name}", f"   :value: {_value_text(value)}", "",
                      f"   Upstream's ``{name}``, with the value the installed release gives it.",
                      ""]
        # .inc, not .rst: included by reference/api.rst, never a page of its own
        (folder / f"{module_name}.inc").write_text("\n".join(lines) + "\n")


_write_generated_entries()
