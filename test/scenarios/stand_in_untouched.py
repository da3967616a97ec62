"""Run with --distspawn-stand-in: a file that never imports upstream's harness
(or torch) pays nothing for the mode."""

import sys


def test_neither_torch_nor_distspawn_beyond_its_plugin_was_imported():
    # The plugin itself is distspawn.early.plugin (standard library alone).
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("distspawn", "torch"))
    assert "torch" not in sys.modules, loaded[:5]
    assert all(m in ("distspawn", "distspawn.early") or m.startswith("distspawn.early.")
               for m in loaded), loaded
