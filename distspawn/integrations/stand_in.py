"""Zero-change mode: suites that import upstream's harness run on distspawn's engine.

Opt-in: ``pytest --distspawn-stand-in`` or ``DISTSPAWN_STAND_IN=1 pytest``
under pytest, and ``python -m distspawn.stand_in test_file.py [args]`` for a
file run as a script (upstream's ``run_tests()``) or ``-m unittest ...``. Both
set the variable, so that the rank server and every rank inherit it. Before any test
module is imported, upstream's ``common_distributed`` and ``multi_threaded_pg``
modules are imported and every name distspawn also defines is replaced, in the
module itself, by distspawn's: the test cases, skip decorators, ``TEST_SKIPS``
(keeping only the installed release's spelling of "needs N devices") and the
threaded world (whose rank threads then share one random generator,
as upstream's do, unless ``DISTSPAWN_SHARED_THREAD_RNG=0`` says otherwise);
reused ranks take upstream's device type (the build's accelerator). Modules
imported afterwards that build on them (``common_dtensor``, ``common_fsdp``,
``distributed_test``, a project's own bases) then derive from distspawn's
classes as they are, and functions left in upstream's module see distspawn's
names too, since they read the module's globals.

It cannot take over once a module that took upstream's classes by name has
been imported (a conftest that imported ``common_dtensor``, say): those classes
already exist. Then it says why, once, and changes nothing, so that the run is
upstream's harness untouched rather than a mix of the two.

Nothing here is imported, and no private torch module is touched, unless the
mode is asked for.
"""

from __future__ import annotations

import collections.abc
import functools
import importlib
import os
import runpy
import sys
import warnings
from types import ModuleType
from typing import Any, Iterator

STAND_IN_VAR = "DISTSPAWN_STAND_IN"
# distspawn/early/plugin.py checks values with the same lists (test_layout compares them).
STAND_IN_ON = ("1", "true", "yes", "on")
STAND_IN_OFF = ("", "0", "false", "no", "off")

_COMMON_DISTRIBUTED = "torch.testing._internal.common_distributed"
# upstream module -> distspawn module whose names replace its own
_REPLACED = {
    _COMMON_DISTRIBUTED: "distspawn.compat",
    "torch.testing._internal.distributed.multi_threaded_pg": "distspawn.multi_threaded_pg",
}
# The modules above import their siblings (common_utils, ...), which is fine;
# these are the ones that take the harness classes by name at import time.
_BUILT_ON_THEM = (
    "torch.testing._internal.common_fsdp",
    "torch.testing._internal.distributed._tensor.common_dtensor",
    "torch.testing._internal.distributed.distributed_test",
)

_installed = False


class StandInWarning(UserWarning):
    """The zero-change mode was asked for but could not take over."""


def requested(environ: os._Environ | dict | None = None) -> bool:
    """Whether ``DISTSPAWN_STAND_IN`` asks for the zero-change mode (bad values raise)."""
    value = (environ if environ is not None else os.environ).get(STAND_IN_VAR, "")
    if value.strip().lower() in STAND_IN_ON:
        return True
    if value.strip().lower() in STAND_IN_OFF:
        return False
    raise ValueError(bad_value_message(value))


def bad_value_message(value: str) -> str:
    """The one error a bad ``DISTSPAWN_STAND_IN`` value gets."""
    return (f"{STAND_IN_VAR}={value!r}: expected 1 (run upstream's harness modules on "
            "distspawn's engine) or 0 / unset (leave them alone)")


def installed() -> bool:
    """Whether upstream's harness modules now hold distspawn's names in this process."""
    return _installed


def why_not() -> str | None:
    """Why the mode cannot take over in this process now (None: it can)."""
    # One still being imported has not taken the names yet: its import is
    # what brought upstream's harness in (pytest's lazy stand-in).
    too_late = [name for name in _BUILT_ON_THEM if name in sys.modules
                and not getattr(sys.modules[name].__spec__, "_initializing", False)]
    if too_late:
        return (f"{', '.join(too_late)} {'was' if len(too_late) == 1 else 'were'} imported "
                "before distspawn could stand in for upstream's harness (by a conftest or "
                "plugin), so the test classes built on it are upstream's")
    for upstream in _REPLACED:
        try:
            importlib.import_module(upstream)
        except Exception as exc:  # noqa: BLE001 - any failure means: cannot take over
            return f"{upstream} does not import in this environment ({type(exc).__name__}: {exc})"
    return None


def install() -> str | None:
    """Put distspawn's names into upstream's harness modules; the reason if it cannot."""
    global _installed
    if _installed:
        return None
    reason = why_not()
    if reason is not None:
        return reason
    upstream_skips = dict(getattr(sys.modules[_COMMON_DISTRIBUTED], "TEST_SKIPS", {}))
    for upstream_name, ours_name in _REPLACED.items():
        _replace_names(sys.modules[upstream_name], importlib.import_module(ours_name))
    # A file that sets common_distributed.TIMEOUT_DEFAULT moves the deadline.
    from ..fixtures.environment import watch_timeout_names_of

    watch_timeout_names_of(_COMMON_DISTRIBUTED)
    _only_the_installed_releases_skip_names(upstream_skips)
    _derive_from_upstreams_testcase()
    _share_one_generator_between_rank_threads()
    _give_upstreams_verdicts()
    _installed = True
    return None


def _only_the_installed_releases_skip_names(upstream_skips: dict) -> None:
    # distspawn's TEST_SKIPS spells "needs N devices" both ways (multi-gpu-N
    # to 2.13, multi-device-N from 2.14), so that a file written for either
    # runs with distspawn's imports. Upstream's has its release's spelling
    # only, and a file of the other release that looks up a key it lacks fails
    # there with a KeyError (pytorch's test_c10d_logger.py on 2.13): files run
    # unchanged get that verdict too. Upstream's modules get a view of
    # distspawn's table without the other spelling; distspawn's own stays
    # whole for the files of the same run that import distspawn.
    from ..engine.exit_codes import DEVICE_COUNT_SPELLINGS, TEST_SKIPS

    stems = tuple(f"{key}-" for key in DEVICE_COUNT_SPELLINGS)
    view = SkipNamesOfThisRelease(TEST_SKIPS, {
        name for name in TEST_SKIPS if name not in upstream_skips and name.startswith(stems)})
    for upstream_name in _REPLACED:
        module = sys.modules[upstream_name]
        if getattr(module, "TEST_SKIPS", None) is TEST_SKIPS:
            module.TEST_SKIPS = view


class SkipNamesOfThisRelease(collections.abc.MutableMapping):
    """distspawn's ``TEST_SKIPS`` as upstream's harness modules show it in the stand-in mode.

    The installed release's names only; what a test adds or changes goes into
    distspawn's table, where the verdicts read exit codes.
    """

    def __init__(self, table: dict, hidden: set[str]) -> None:
        self._table, self._hidden = table, hidden

    def __getitem__(self, name: str) -> Any:
        if name in self._hidden:
            raise KeyError(name)
        return self._table[name]

    def __setitem__(self, name: str, value: Any) -> None:
        self._hidden.discard(name)
        self._table[name] = value

    def __delitem__(self, name: str) -> None:
        if name in self._hidden:
            raise KeyError(name)
        del self._table[name]

    def __iter__(self) -> Iterator[str]:
        return (name for name in list(self._table) if name not in self._hidden)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __repr__(self) -> str:
        return repr(dict(self))


def _share_one_generator_between_rank_threads() -> None:
    # Files run unchanged get upstream's verdicts, and upstream's rank threads
    # draw from the process's one generator (some tests rely on the ranks
    # drawing different numbers). A setting the user made stays.
    from ..cases.threaded import SHARED_RNG_VAR

    os.environ.setdefault(SHARED_RNG_VAR, "1")


def _give_upstreams_verdicts() -> None:
    # A test whose world size is 0 passes without running (with a warning), a
    # threaded test whose threads never started passes (with a warning), and
    # a failing one raises a plain RuntimeError, as upstream's harness does.
    # Reused ranks take upstream's device type: on a CUDA build without a GPU,
    # "cuda" (a class without a world size then skips, as upstream's does).
    # Dynamo's one-process class fails without an accelerator, as upstream's does.
    from ..cases.continuous import MultiProcContinuousTest
    from ..cases.distributed_base import DynamoDistributedSingleProcTestCase
    from ..cases.multiprocess import MultiProcessTestCase
    from ..cases.threaded import MultiThreadedTestCase

    MultiThreadedTestCase.upstream_verdicts = True
    MultiProcContinuousTest.upstream_verdicts = True
    MultiProcessTestCase.upstream_verdicts = True
    DynamoDistributedSingleProcTestCase.upstream_verdicts = True


def _derive_from_upstreams_testcase() -> None:
    from ..cases import testcase

    upstream = importlib.import_module(testcase.UPSTREAM_TESTCASE_MODULE).TestCase
    testcase.derive_from_upstreams_testcase(upstream)


def install_if_requested(where: str) -> None:
    """Called before test modules load: take over when asked, else do nothing.

    ``where`` names the caller in the warning given when the mode cannot take over.
    """
    if not requested():
        return
    reason = install()
    if reason is not None:
        warnings.warn(StandInWarning(
            f"{STAND_IN_VAR}=1 ({where}): running on upstream's harness unchanged: {reason}"),
            stacklevel=2)


def _replace_names(upstream: ModuleType, ours: ModuleType) -> None:
    names = getattr(ours, "__all__", None) or [n for n in vars(ours) if not n.startswith("__")]
    for name in names:
        if hasattr(upstream, name):
            setattr(upstream, name, getattr(ours, name))


USAGE = """usage: python -m distspawn.stand_in TEST_FILE.py [ARGS ...]
       python -m distspawn.stand_in -m MODULE [ARGS ...]   (e.g. -m unittest test_x)

Runs a test file written for upstream's harness on distspawn's engine, unchanged."""


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m distspawn.stand_in``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help") or (args[0] == "-m" and len(args) < 2):
        print(USAGE, file=sys.stderr if not args or args[0] == "-m" else sys.stdout)
        return 0 if args and args[0] in ("-h", "--help") else 2
    if args[0] != "-m" and not os.path.isfile(args[0]):
        print(f"distspawn.stand_in: TEST_FILE={args[0]!r}: no such file\n{USAGE}",
              file=sys.stderr)
        return 2
    os.environ[STAND_IN_VAR] = "1"
    # The file's own arguments before upstream's modules are imported: torch
    # 2.8's common_utils reads sys.argv at import (later releases in run_tests).
    if args[0] == "-m":
        sys.argv = [args[1], *args[2:]]
        run = functools.partial(runpy.run_module, args[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(args)
        sys.path.insert(0, os.path.dirname(os.path.abspath(args[0])))
        run = functools.partial(runpy.run_path, args[0], run_name="__main__")
    install_if_requested("python -m distspawn.stand_in")
    run()
    return 0
