"""Run with --distspawn-stand-in: a file that never imports upstream's harness
(or torch) pays nothing for the mode."""

import sys


def test_neither_distspawn_nor_torch_was_imported():
    assert "distspawn" not in sys.modules and "torch" not in sys.modules, \
        sorted(m for m in sys.modules if m.startswith(("distspawn", "torch")))[:5]
