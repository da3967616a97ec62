"""Upstream's distributed checkpoint test helper ``with_temp_dir``
(``checkpoint_utils``, under ``torch/testing/_internal/distributed/`` in the wheel)."""

from __future__ import annotations

from .fixtures.checkpoint_dirs import with_temp_dir

__all__ = ["with_temp_dir"]
