"""The process-wide torch state a test must leave as it found it.

Upstream's ``common_utils.TestCase`` guards some global state around every
test, and which state depends on the release: all of them turn sparse
invariant checks on for the test and restore the grad mode after it; the
harness of torch 2.13 on also fails a test that leaves a torch function mode
pushed (``torch.set_default_device`` is one) or torch functions switched off;
2.14 on, one that changes the fp32 matmul/conv/rnn precision flags.
``engine.releases.upstream_testcase_guards`` says which the installed torch's
harness has. A test that leaks such state fails as it does there, with the
same words, after the state is put back (so the next test starts clean).
"""

from __future__ import annotations

import functools
import os
from typing import Any, Callable

import torch

from ..engine.releases import upstream_testcase_guards

# Private: listed in distspawn.private_apis. Without them the two checks are off.
_function_stack_len = getattr(torch._C, "_len_torch_function_stack", None)
_pop_function_mode = getattr(torch._C, "_pop_torch_function_stack", None)
_function_state = getattr(torch._C, "_get_torch_function_state", None)
_set_function_state = getattr(torch._C, "_set_torch_function_state", None)

# The per-backend precision flags, by the name a leak is reported with.
_BACKEND_FLAGS = ("cuda.matmul", "cudnn.conv", "cudnn.rnn", "mkldnn.matmul", "mkldnn.conv",
                  "mkldnn.rnn")
_GENERIC = "torch.get_float32_matmul_precision()"
# Stands for the generic setting while the backends disagree (torch raises
# then); upstream's words, as a leak report shows it.
_MIXED = "<inconsistent legacy/new matmul precision>"
# Upstream's own switch for the precision check.
PRECISION_CHECK_OFF_VAR = "PYTORCH_DISABLE_FP32_PRECISION_LEAK_CHECK"


def _backend_flag(path: str) -> tuple[str, Callable[[], Any], Callable[[Any], None]]:
    def owner() -> Any:
        return functools.reduce(getattr, path.split("."), torch.backends)

    return (f"torch.backends.{path}.fp32_precision", lambda: owner().fp32_precision,
            lambda value: setattr(owner(), "fp32_precision", value))


def _generic_precision() -> Any:
    try:
        return torch.get_float32_matmul_precision()
    except RuntimeError:
        return _MIXED


def _set_generic_precision(value: Any) -> None:
    if value != _MIXED:
        torch.set_float32_matmul_precision(value)


@functools.lru_cache(maxsize=None)
def _precision_flags(with_generic: bool) -> tuple:
    # The generic setting first: setting it also writes the matmul flags.
    generic = ((_GENERIC, _generic_precision, _set_generic_precision),) if with_generic else ()
    return generic + tuple(_backend_flag(path) for path in _BACKEND_FLAGS)


class GlobalState:
    """What one test started with; :meth:`restore_and_check` at its end."""

    def __init__(self, check_default_dtype: bool) -> None:
        self.check_default_dtype = check_default_dtype
        guards = upstream_testcase_guards()
        self.sparse_checks = torch.sparse.check_sparse_tensor_invariants.is_enabled()
        # Every sparse tensor the test builds is checked, unless it says not to.
        torch.sparse.check_sparse_tensor_invariants.enable()
        _check_default_dtype(check_default_dtype)
        self.grad_enabled = torch.is_grad_enabled()
        self.function_modes = self.function_state = None
        if "torch_function" in guards and None not in (
                _function_stack_len, _pop_function_mode, _function_state, _set_function_state):
            self.function_modes = _function_stack_len()
            self.function_state = _function_state()
        self.precision_flags: tuple = ()
        if "fp32_precision" in guards and os.environ.get(PRECISION_CHECK_OFF_VAR) != "1":
            self.precision_flags = _precision_flags("fp32_precision_generic" in guards)
        self.precision = [get() for _, get, _ in self.precision_flags]

    def restore_and_check(self) -> None:
        """Put the state back; raise AssertionError, in upstream's words, for a leak."""
        if self.sparse_checks:
            torch.sparse.check_sparse_tensor_invariants.enable()
        else:
            torch.sparse.check_sparse_tensor_invariants.disable()
        _check_default_dtype(self.check_default_dtype)
        torch.set_grad_enabled(self.grad_enabled)
        if self.function_modes is not None:
            now = _function_stack_len()
            if now != self.function_modes:
                for _ in range(now - self.function_modes):
                    _pop_function_mode()
                raise AssertionError("torch function mode stack was leaked: length changed "
                                     f"from {self.function_modes} to {now}")
            state = _function_state()
            if state != self.function_state:
                _set_function_state(self.function_state)
                raise AssertionError("torch function state was leaked: changed from "
                                     f"{self.function_state} to {state}")
        if self.precision_flags:
            now = [get() for _, get, _ in self.precision_flags]
            if now != self.precision:
                for (_, _, put), value in zip(self.precision_flags, self.precision):
                    put(value)
                changed = [f"  {name}: was {before!r}, became {after!r}"
                           for (name, _, _), before, after
                           in zip(self.precision_flags, self.precision, now) if before != after]
                raise AssertionError("fp32 precision flag leak detected:\n" + "\n".join(changed))


def _check_default_dtype(enabled: bool) -> None:
    if enabled and torch.get_default_dtype() != torch.float:
        raise AssertionError(
            f"expected default dtype to be torch.float, got {torch.get_default_dtype()}")
