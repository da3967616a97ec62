"""Upstream ``common_utils.TestCase``'s helpers that run Python in a fresh interpreter.

Some checks can only be made where nothing has been imported yet: pytorch's
DTensor tests save a DTensor and load it with ``weights_only=True`` in a new
interpreter, once with ``torch.distributed.tensor`` imported first and once
without (``_attempt_load_from_subprocess``); logging tests read what a child
printed (``run_process_no_exception``). Test files call both on ``self``, so
a file moved to distspawn needs them, with upstream's names and results.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Mapping


class SubprocessChecks:
    """``run_process_no_exception`` and ``_attempt_load_from_subprocess``, for a
    ``unittest.TestCase`` (the second fails the test through ``assertRaisesRegex``)."""

    @staticmethod
    def run_process_no_exception(code: str, env: Mapping[str, str] | None = None
                                 ) -> tuple[bytes, bytes]:
        """Run ``code`` as ``python -c``; its standard output and error, as
        bytes, whatever its exit status."""
        finished = subprocess.run([sys.executable, "-c", code], capture_output=True,
                                  env=None if env is None else dict(env), check=False)
        return finished.stdout, finished.stderr

    def _attempt_load_from_subprocess(self, file: os.PathLike | str, import_string: str,
                                      expected_failure_message: str | None = None) -> None:
        """Load ``file`` with ``torch.load(..., weights_only=True)`` in a new
        interpreter that first runs ``import_string`` (statements, each ending
        with ``;``).

        Without ``expected_failure_message`` a load that fails raises
        RuntimeError with the child's output; with it, the test fails unless
        the load fails and its output contains that text.
        """
        script = f"import torch;{import_string}torch.load({os.fspath(file)!r}, weights_only=True)"
        # An empty folder to run in: the folder a child starts in comes first
        # on its sys.path, and a stray module there could stand in for one torch imports.
        with tempfile.TemporaryDirectory(prefix="distspawn-load-") as empty:
            finished = subprocess.run([sys.executable, "-c", script], cwd=empty,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      check=False)
        output = finished.stdout.decode("utf-8", "replace")

        def load() -> None:
            if finished.returncode != 0:
                raise RuntimeError(output)

        if expected_failure_message is None:
            load()
            return
        with self.assertRaisesRegex(RuntimeError, re.escape(expected_failure_message)):
            load()
