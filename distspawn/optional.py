"""Optional packages that tests may need, probed without crashing.

A broken torchvision (e.g. a wheel built for another torch, which raises
RuntimeError at import) must turn into a skip with its reason, like a missing one.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from .accelerators import LazyFlag
from .skips import skip_but_pass_in_sandcastle_if


@functools.lru_cache(maxsize=None)
def torchvision_problem() -> str | None:
    """Why torchvision cannot be used here, or None if it imports."""
    try:
        import torchvision  # noqa: F401
    except Exception as error:  # ImportError when absent, RuntimeError when broken
        first_line = (str(error).strip().splitlines() or [""])[0]
        return f"no torchvision ({type(error).__name__}: {first_line})"
    return None


HAS_TORCHVISION = LazyFlag(lambda: torchvision_problem() is None, "HAS_TORCHVISION")


def skipIfNoTorchVision(func: Callable) -> Callable:  # noqa: N802 - upstream's name
    """Skip the test, saying why, when torchvision is absent or fails to import."""
    problem = torchvision_problem()
    return skip_but_pass_in_sandcastle_if(problem is not None, problem or "")(func)
