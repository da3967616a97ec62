"""A CPU random generator per rank thread, so threads behave like rank processes.

torch has one default CPU generator per process: rank threads drawing from it
interleave, and the same seed gives each rank different numbers. Here every
rank thread gets its own generator state. While a threaded test runs, torch's
random functions are wrapped: called from a rank thread, each draws from that
thread's generator, handed to it as ``generator=`` where it takes one and
runs eagerly on the CPU, and otherwise swapped into the default generator
(under a lock, so no other thread sees it); called from any other thread, it
runs as it is. Calls to
``torch.manual_seed`` / ``get_rng_state`` / ``set_rng_state`` / ``seed`` from
a rank thread act on that thread's state.

Only the random functions are wrapped, not every torch call: an earlier
version ran a torch function mode over the rank threads, and its per-call
cost made a threaded DDP test about a fifth slower than upstream's.

Isolated per rank thread: the default CPU generator (``torch.rand*``,
``normal``, ``bernoulli``, ``Tensor.uniform_`` and friends, so ``nn.init`` and
module construction, dropout). Still shared by all threads: CUDA generators,
``random`` and ``numpy.random``, ``os.environ``, global torch flags (default
dtype, deterministic algorithms, ...), and functions bound by name before the
test started (``from torch import randn`` in a module imported earlier).
Random ops traced by ``torch.compile`` use the shared generator.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F

__all__ = ["ThreadRNG", "current_thread_rng", "install_thread_rng",
           "uninstall_thread_rng"]

_SWAP_LOCK = threading.RLock()
_current = threading.local()

_TORCH_RANDOM = ("rand", "rand_like", "randn", "randn_like", "randint", "randint_like",
                 "randperm", "normal", "bernoulli", "multinomial", "poisson", "binomial",
                 "dropout", "dropout_", "alpha_dropout", "alpha_dropout_",
                 "feature_dropout", "feature_dropout_", "feature_alpha_dropout",
                 "feature_alpha_dropout_", "rrelu", "rrelu_", "native_dropout")
_TENSOR_RANDOM = ("uniform_", "normal_", "random_", "bernoulli_", "bernoulli",
                  "exponential_", "geometric_", "log_normal_", "cauchy_", "multinomial")


_FUNCTIONAL_RANDOM = tuple(n for n in dir(F) if "dropout" in n and not n.startswith("_")) + (
    "rrelu", "rrelu_", "gumbel_softmax", "multi_head_attention_forward",
    "scaled_dot_product_attention", "fractional_max_pool2d", "fractional_max_pool3d")


def _never() -> bool:
    return False


# False when it runs; torch.compile folds it to True while it traces a
# wrapper, which then goes straight to the original function. (Not
# is_compiling(): that flag is process-wide, so one rank thread compiling
# would send the others' eager draws to the shared generator.)
_traced_by_dynamo = getattr(getattr(torch, "compiler", None), "is_dynamo_compiling", _never)


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


class ThreadRNG:
    """The calling rank thread's own CPU random state (use as a context manager).

    It takes effect while the wrappers are installed (``install_thread_rng``).
    """

    def __init__(self, seed: int) -> None:
        self.generator = torch.Generator()
        self.generator.manual_seed(seed)
        self.draws = 0  # random ops run on this state (a failure may depend on them)
        self.swapped = False  # a wrapped call is running: nested ones use its state

    def __enter__(self) -> "ThreadRNG":
        _current.rng = self
        return self

    def __exit__(self, *exc_info: Any) -> None:
        _current.rng = None


def current_thread_rng() -> ThreadRNG | None:
    """The calling rank thread's own random state, or None where it has none."""
    return getattr(_current, "rng", None)


_this_threads_rng = current_thread_rng


# Random functions whose ``generator`` argument is keyword-only (checked by
# test_threaded.py on every supported release): called for the CPU, they are
# handed the rank thread's generator directly, which draws exactly what the
# swapped-in state would, without the lock and four state copies.
_TAKES_GENERATOR = frozenset(("rand", "randn", "randint", "randperm", "normal", "bernoulli",
                              "multinomial")) | frozenset(_TENSOR_RANDOM)
_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)
_function_modes = getattr(torch._C, "_len_torch_function_stack", None)
_dispatch_modes = getattr(torch._C, "_len_torch_dispatch_stack", None)
# Without them a mode cannot be seen: every draw takes the swapped path.
_CAN_HAND_GENERATOR = _function_modes is not None and _dispatch_modes is not None


def _plain_cpu_call(args: tuple, kwargs: dict) -> bool:
    """Whether a random function called so runs eagerly on the CPU, with no mode
    or tensor subclass that could see (or refuse) a generator argument."""
    if _function_modes() or _dispatch_modes() or kwargs.get("generator") is not None:
        return False  # (nn.init passes generator=None: that one is ours to fill)
    if kwargs.get("device") is not None:
        return False
    for arg in args:
        if isinstance(arg, torch.Tensor) and not (type(arg) in _PLAIN_TENSORS and arg.is_cpu):
            return False
    return True


def _on_thread_state(original: Callable, takes_generator: bool = False) -> Callable:
    @functools.wraps(original)
    def drawing(*args: Any, **kwargs: Any) -> Any:
        if _traced_by_dynamo():
            return original(*args, **kwargs)
        rng = getattr(_current, "rng", None)
        if rng is None or rng.swapped:
            return original(*args, **kwargs)
        rng.draws += 1
        if takes_generator and _plain_cpu_call(args, kwargs):
            kwargs["generator"] = rng.generator
            return original(*args, **kwargs)
        rng.swapped = True
        try:
            with _swapped_in(rng.generator):
                return original(*args, **kwargs)
        finally:
            rng.swapped = False

    # torch.compile reads this attribute as "the function this wrapper stands
    # for": it then traces the original, and the tables it builds on first use
    # (perhaps while the wrappers are installed) name the original, not us.
    drawing._torchdynamo_inline = original
    return drawing


# -- seeding from a rank thread -----------------------------------------------

_SEED_FUNCTIONS = ("manual_seed", "seed", "get_rng_state", "set_rng_state")


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


# -- installing and removing the wrappers ---------------------------------------

# (owner, name) -> (original, whether owner defined it itself rather than inherited it)
_originals: dict[tuple[Any, str], tuple[Callable, bool]] = {}
# (owner, name) -> (original, its wrapper): built once, reused by every later
# test while the original is unchanged (building ~50 wrappers per test cost
# a threaded test a tenth of a millisecond).
_made: dict[tuple[Any, str], tuple[Callable, Callable]] = {}
_compile_cache_was_filled = True


def _compile_tensor_methods() -> Any:
    """torch.compile's cached set of Tensor methods, where dynamo is loaded.

    Filled on the first compile, it would keep the wrappers' absence (they are
    Python functions, not method descriptors) after they are gone, so a cache
    first filled while they are installed is emptied when they are removed.
    """
    rules = sys.modules.get("torch._dynamo.trace_rules")
    cached = getattr(rules, "get_tensor_method", None)
    return cached if hasattr(cached, "cache_info") and hasattr(cached, "cache_clear") else None


def _replace(owner: Any, name: str, make: Callable[[Callable], Callable]) -> None:
    key = (owner, name)
    original = getattr(owner, name, None)
    if key in _originals or original is None:
        return
    _originals[key] = (original, name in vars(owner))
    made = _made.get(key)
    if made is None or made[0] is not original:
        made = _made[key] = (original, make(original))
    setattr(owner, name, made[1])


def install_thread_rng() -> None:
    """Route torch's random and seeding functions to the rank thread's state."""
    global _compile_cache_was_filled
    if not _originals:
        cached = _compile_tensor_methods()
        _compile_cache_was_filled = cached is not None and cached.cache_info().currsize > 0
    for module in (torch, torch.random):
        for name in _SEED_FUNCTIONS:
            _replace(module, name, functools.partial(_seed_function, name))
    for owner, names in ((torch, _TORCH_RANDOM), (torch.Tensor, _TENSOR_RANDOM),
                         (F, _FUNCTIONAL_RANDOM)):
        for name in names:
            takes_generator = (_CAN_HAND_GENERATOR and owner is not F
                               and name in _TAKES_GENERATOR)
            _replace(owner, name, functools.partial(_on_thread_state,
                                                    takes_generator=takes_generator))


def uninstall_thread_rng() -> None:
    """Put back every function ``install_thread_rng`` replaced."""
    for (owner, name), (original, own) in _originals.items():
        if own:
            setattr(owner, name, original)
        else:
            delattr(owner, name)  # it was inherited (Tensor methods from TensorBase)
    _originals.clear()
    cached = _compile_tensor_methods()
    if cached is not None and not _compile_cache_was_filled:
        cached.cache_clear()
