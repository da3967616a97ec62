"""A plain pytest file: the distspawn plugin must not import torch for it."""

import sys


def test_torch_not_imported():
    assert "torch" not in sys.modules, "the distspawn pytest plugin imported torch"
