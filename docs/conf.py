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


# -- the command-line reference, from the code's own parsers --------------------
def _help_of(main, argv) -> str:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        main(argv)
    return out.getvalue().rstrip()


def _literal(text: str) -> list[str]:
    return ["::", ""] + ["    " + line if line else "" for line in text.splitlines()] + [""]


def _write_command_line_reference() -> None:
    from distspawn.early import plugin
    from distspawn.integrations import matrix, stand_in

    class _Recorder:
        """Stands in for pytest's parser: records each option the plugin adds."""

        def __init__(self):
            self.options = []

        def getgroup(self, name):
            return self

        def addoption(self, *names, **settings):
            self.options.append((names, settings))

    recorder = _Recorder()
    plugin.pytest_addoption(recorder)
    def title(text):
        return [text, "-" * len(text), ""]

    lines = [*title("pytest options"),
             "Added by the plugin (``python -m pytest --help`` lists them under "
             "*distspawn*):", ""]
    for names, settings in recorder.options:
        metavar = f" {settings['metavar']}" if settings.get("metavar") else ""
        lines += [f"``{', '.join(names)}{metavar}``", f"    {settings.get('help', '')}", ""]
    lines += [*title("pytest marker"), f"``{plugin.MARKER_HELP.split(':')[0]}``",
              f"    {plugin.MARKER_HELP.split(':', 1)[1].strip()}", "",
              *title("``python -m distspawn``")]
    lines += _literal(_help_of(matrix.parse_args, ["--help"]))
    lines += title("``python -m distspawn.stand_in``")
    lines += _literal(stand_in.USAGE)
    folder = Path(__file__).parent / "reference" / "generated"
    (folder / "command-line.inc").write_text("\n".join(lines) + "\n")


_write_command_line_reference()


# -- the results pages' captions and headline, from the saved benchmark data ----
# (docs/figures.py draws the figures themselves; this part needs no matplotlib)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import figures  # noqa: E402

figures.write_captions(Path(__file__).parent / "results" / "generated")
