"""Tests that leave process-wide torch state changed, one kind each.

Upstream's TestCase fails some of them, depending on the release (see
distspawn.cases.global_state); distspawn's TestCase, which files with
switched imports use, must give the same verdicts. Each ``test_*_after``
checks that the state was put back for the next test. Tests run in name
order. UPSTREAM_HARNESS=1 imports upstream's TestCase.
"""

import os
import unittest

import torch

if os.environ.get("UPSTREAM_HARNESS") == "1":
    from torch.testing._internal.common_utils import TestCase
else:
    from distspawn import TestCase


def _precision_flags():
    # The per-backend fp32 precision flags are settable from torch 2.9 on.
    try:
        value = torch.backends.mkldnn.matmul.fp32_precision
        torch.backends.mkldnn.matmul.fp32_precision = value
        return value
    except (AttributeError, RuntimeError, TypeError):
        return None


PRECISION = _precision_flags()
needs_flags = unittest.skipIf(PRECISION is None, "this torch has no fp32_precision flags")


class Leaks(TestCase):
    def test_a_default_device(self):
        torch.set_default_device("cpu")  # pushes a torch function mode

    def test_a_default_device_after(self):
        self.assertEqual(torch.empty(1).device.type, "cpu")
        self.assertNotIn("DeviceContext", repr(torch.overrides._get_current_function_mode()))

    def test_b_grad_off(self):
        torch.set_grad_enabled(False)

    def test_b_grad_off_after(self):
        self.assertTrue(torch.is_grad_enabled())

    @needs_flags
    def test_c_precision(self):
        torch.backends.mkldnn.matmul.fp32_precision = "bf16"

    @needs_flags
    def test_c_precision_after(self):
        self.assertEqual(torch.backends.mkldnn.matmul.fp32_precision, PRECISION)

    def test_d_sparse_checks_on(self):
        self.assertTrue(torch.sparse.check_sparse_tensor_invariants.is_enabled())

    @needs_flags
    def test_e_clean(self):
        torch.backends.mkldnn.matmul.fp32_precision = "bf16"
        torch.backends.mkldnn.matmul.fp32_precision = PRECISION


if __name__ == "__main__":
    unittest.main()
