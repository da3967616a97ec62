"""Imported once by the forkserver that rank processes are forked from.

Everything a rank needs before running its test is loaded here, once per run,
so each rank starts in tens of milliseconds instead of importing torch again.
``distspawn.early.rank_server_boot`` ran first: these imports see the test process's
environment, and what they read of it is recorded. An import that fails here
never takes the server down; it is reported, and the test process starts
ranks afresh instead (an import that failed partway may have left behind
what a rank importing it again would trip over).
"""

import importlib

_failures: dict[str, str] = {}

for _name in (
    "numpy", "torch", "torch.distributed", "torch.multiprocessing", "torch.nn",
    "torch.nn.parallel", "torch.optim",
    # torch.testing.assert_close (behind TestCase.assertEqual) imports
    # torch.distributed.tensor on first use: 0.6 s in every rank otherwise.
    "torch.distributed.tensor", "torch.testing",
    # The whole package, by name (the engine depends on nothing above it);
    # the package is lazy, so each of its public names' modules is imported below.
    "distspawn",
    # DDP reads a dynamo setting when a model is wrapped: about 1 s per rank
    # otherwise. (Ranks forked after this import used to hang now and then:
    # that was torch freeing a gloo group under the GIL, made likelier by the
    # faster start, and is what engine.group_keeper prevents.)
    "torch._dynamo",
):
    try:
        importlib.import_module(_name)
        if _name == "distspawn":
            importlib.import_module(_name)._import_everything()
    except BaseException as _exc:  # noqa: BLE001 - see the module docstring
        _failures[_name] = f"{type(_exc).__name__}: {_exc}"
        break

# Last: the test modules the test process names (see engine.warm_modules).
try:
    from distspawn.engine.forked_exit import skip_in_process_cleanups_at_exit
    from distspawn.engine.warm_modules import serve

    skip_in_process_cleanups_at_exit()

    serve(_failures)
except SystemExit:
    # Asked to end (engine.warm_modules' successor, as the test process has
    # moved on to another test module), maybe before it is back in the
    # forkserver's loop: it ends now, as it would from there.
    raise
except BaseException:  # noqa: BLE001 - the test process sees no report and starts ranks afresh
    pass
