"""Imported once by the forkserver that rank processes are forked from.

Everything a rank needs before running its test is loaded here, once per run,
so each rank starts in tens of milliseconds instead of importing torch again.
A failure here must never take the server down: the rank would then import
what it needs itself, slowly but correctly.
"""

import importlib

try:
    import numpy  # noqa: F401
    import torch  # noqa: F401
    import torch.distributed  # noqa: F401
    import torch.multiprocessing  # noqa: F401
    import torch.nn  # noqa: F401
    import torch.nn.parallel  # noqa: F401
    import torch.optim  # noqa: F401
    # torch.testing.assert_close (behind TestCase.assertEqual) imports
    # torch.distributed.tensor on first use: 0.6 s in every rank otherwise.
    import torch.distributed.tensor  # noqa: F401
    import torch.testing  # noqa: F401

    # The whole package, by name (the engine depends on nothing above it).
    importlib.import_module("distspawn")
except BaseException:  # noqa: BLE001 - see the module docstring
    pass

try:
    # DDP reads a dynamo setting when a model is wrapped: about 1 s per rank
    # otherwise. (Ranks forked after this import used to hang now and then:
    # that was torch freeing a gloo group under the GIL, made likelier by the
    # faster start, and is what engine.group_keeper prevents.)
    import torch._dynamo  # noqa: F401
except BaseException:  # noqa: BLE001 - a broken optional dependency: ranks import it themselves
    pass

# Last: the test modules the test process named (see engine.warm_modules).
try:
    from distspawn.engine.warm_modules import warm_from_environment

    warm_from_environment()
except BaseException:  # noqa: BLE001 - see the module docstring
    pass
