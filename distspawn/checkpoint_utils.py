"""Upstream's distributed checkpoint test helpers (``checkpoint_utils``, under
``torch/testing/_internal/distributed/`` in the wheel): ``with_temp_dir``,
``with_checkpoint_logging``, and the example stream extension
``Rot13Example`` with ``get_test_extension_registry``."""

from __future__ import annotations

from .fixtures import checkpoint_extension as _extension
from .fixtures.checkpoint_dirs import with_temp_dir
from .fixtures.checkpoint_extension import *  # noqa: F401,F403 - what this torch can build

__all__ = ["with_temp_dir", *_extension.__all__]


def __getattr__(name: str):
    if name in _extension.ON_DCP_EXTENSIONS:
        import torch

        raise ImportError(f"distspawn.checkpoint_utils.{name} is built on DCP's stream "
                          "extensions (torch.distributed.checkpoint._extension), which torch "
                          f"{torch.__version__} does not have; upstream's module cannot "
                          "import there either")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
