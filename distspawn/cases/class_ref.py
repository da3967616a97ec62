"""How a rank process finds the test class it is to run.

A rank is sent a :class:`ClassRef` rather than the class: it names the class,
and a size when it is one of the sized variants the pytest plugin makes
(``Cls[ws2]``), so the rank imports the test module only after taking the
test process's environment (a rank forked from a long-lived server would
otherwise import it with the server's).
"""

from __future__ import annotations

import importlib
import pickle
import sys
from dataclasses import dataclass
from typing import Any

from . import sized_variants


@dataclass(frozen=True)
class ClassRef:
    """A test class by module, qualified name and (for a sized variant) size."""

    module: str
    qualname: str
    size: int | None = None

    def resolve(self) -> type:
        found: Any = sys.modules.get(self.module) or importlib.import_module(self.module)
        for part in self.qualname.split("."):
            found = getattr(found, part)
        return found if self.size is None else sized_variants.sized_class(found, self.size)


def class_ref(cls: type) -> ClassRef:
    """The reference a rank resolves to ``cls``. Raises ``pickle.PicklingError``
    here, in the test process, where a rank could not find the class."""
    base = sized_variants.base_class(cls)
    pickle.dumps(base)
    return ClassRef(base.__module__, base.__qualname__, sized_variants.variant_size(cls))
