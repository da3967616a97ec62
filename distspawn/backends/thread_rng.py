"""A CPU random generator per rank thread, so threads behave like rank processes.

torch has one default CPU generator per process: rank threads drawing from it
interleave, and the same seed gives each rank different numbers. Here every
rank thread gets its own generator state. A torch function mode, pushed in the
rank thread only, runs each random op with that state swapped into the
default generator (under a lock, so no other thread sees it), and
``torch.manual_seed`` / ``get_rng_state`` / ``set_rng_state`` / ``seed``
called from a rank thread act on that thread's state.

Isolated per rank thread: the default CPU generator (``torch.rand*``,
``normal``, ``bernoulli``, ``Tensor.uniform_`` and friends, ``nn.init``,
dropout). Still shared by all threads: CUDA generators, ``random`` and
``numpy.random``, ``os.environ``, and global torch flags (default dtype,
deterministic algorithms, ...). Random ops traced by ``torch.compile`` use the
shared generator.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

__all__ = ["ThreadRNG", "current_thread_rng", "install_seed_functions",
           "uninstall_seed_functions"]

_SWAP_LOCK = threading.RLock()
_current = threading.local()


def _random_functions() -> frozenset:
    names = ["rand", "rand_like", "randn", "randn_like", "randint", "randint_like",
             "randperm", "normal", "bernoulli", "multinomial", "poisson", "binomial",
             "dropout", "alpha_dropout", "feature_dropout", "feature_alpha_dropout",
             "rrelu", "rrelu_", "native_dropout"]
    found = {getattr(torch, n) for n in names if hasattr(torch, n)}
    tensor_methods = ["uniform_", "normal_", "random_", "bernoulli_", "bernoulli",
                      "exponential_", "geometric_", "log_normal_", "cauchy_", "multinomial"]
    found |= {getattr(torch.Tensor, n) for n in tensor_methods if hasattr(torch.Tensor, n)}
    functional = [n for n in dir(F) if "dropout" in n] + [
        "rrelu", "rrelu_", "gumbel_softmax", "multi_head_attention_forward",
        "scaled_dot_product_attention", "fractional_max_pool2d", "fractional_max_pool3d"]
    found |= {getattr(F, n) for n in functional if hasattr(F, n)}
    return frozenset(found)


_RANDOM = _random_functions()


@contextlib.contextmanager
def _swapped_in(generator: torch.Generator) -> Iterator[None]:
    default = torch.default_generator
    with _SWAP_LOCK:
        saved = default.get_state()
        default.set_state(generator.get_state())
        try:
            yield
        finally:
            generator.set_state(default.get_state())
            default.set_state(saved)


def _is_compiling() -> bool:
    compiler = getattr(torch, "compiler", None)
    return compiler is not None and compiler.is_compiling()


class ThreadRNG(TorchFunctionMode):
    """The calling rank thread's own CPU random state (use as a context manager)."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        self.generator = torch.Generator()
        self.generator.manual_seed(seed)
        self.draws = 0  # random ops run on this state (a failure may depend on them)

    def __enter__(self) -> "ThreadRNG":
        _current.rng = self
        return super().__enter__()

    def __exit__(self, *exc_info: Any) -> None:
        _current.rng = None
        super().__exit__(*exc_info)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if (func in _RANDOM or getattr(func, "__module__", None) == "torch.nn.init") \
                and not _is_compiling():
            self.draws += 1
            with _swapped_in(self.generator):
                return func(*args, **kwargs)
        return func(*args, **kwargs)


def current_thread_rng() -> ThreadRNG | None:
    """The calling rank thread's own random state, or None where it has none."""
    return getattr(_current, "rng", None)


_this_threads_rng = current_thread_rng


# -- seeding from a rank thread -----------------------------------------------

_SEED_FUNCTIONS = ("manual_seed", "seed", "get_rng_state", "set_rng_state")
_originals: dict[tuple[Any, str], Callable] = {}


def _seed_function(name: str, original: Callable) -> Callable:
    def in_rank_thread(*args: Any, **kwargs: Any) -> Any:
        rng = _this_threads_rng()
        if rng is None:
            return original(*args, **kwargs)
        if name == "get_rng_state":
            return rng.generator.get_state()
        if name == "set_rng_state":
            return rng.generator.set_state(*args, **kwargs)
        # manual_seed / seed: let torch seed everything (devices included),
        # then take the CPU state for this thread and put the shared one back.
        with _SWAP_LOCK:
            saved = torch.default_generator.get_state()
            try:
                result = original(*args, **kwargs)
                rng.generator.set_state(torch.default_generator.get_state())
            finally:
                torch.default_generator.set_state(saved)
        return result

    in_rank_thread.__name__ = name
    in_rank_thread.__doc__ = original.__doc__
    in_rank_thread.__wrapped__ = original
    return in_rank_thread


def install_seed_functions() -> None:
    """Route ``torch.manual_seed`` and friends to the rank thread's state."""
    for module in (torch, torch.random):
        for name in _SEED_FUNCTIONS:
            if (module, name) in _originals:
                continue
            original = getattr(module, name)
            _originals[(module, name)] = original
            setattr(module, name, _seed_function(name, original))


def uninstall_seed_functions() -> None:
    for (module, name), original in _originals.items():
        setattr(module, name, original)
    _originals.clear()
