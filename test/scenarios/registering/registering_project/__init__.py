"""A project whose import leaves things behind that no import can undo, as
torchtitan's and autoparallel's do: an op registered with torch.library (it
lives in C++; defining it twice raises) and an entry in a registry that
refuses a second one. It also reads, at import, variables that its tests
set later, or that only the C-level environment has."""

import os
import sys

import torch

torch.library.define("registering_project::double", "(Tensor x) -> Tensor")


@torch.library.impl("registering_project::double", "CompositeExplicitAutograd")
def _double(x):
    return x * 2


# A registry kept where re-importing this package cannot reset it.
_registry = sys.modules["torch"].__dict__.setdefault("_registering_project_registry", {})
if "double" in _registry:
    raise RuntimeError("Artifact of type=double already registered")
_registry["double"] = _double

FLAVOUR_AT_IMPORT = os.environ.get("REGISTERING_FLAVOUR")
DRIFT_AT_IMPORT = os.environ.get("REGISTERING_DRIFT")
