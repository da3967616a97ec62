"""Model fixtures and expected messages for DDP tests.

The modules' shapes, parameter names and forward passes are upstream's, since
conformance tests assert on them. Module-level instances (``DDP_NET``,
``BN_NET``, ...) are built on first access: importing distspawn constructs no
model, and a model built after the test seeded the RNG is the same on every rank.
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F

# Substrings of DDP's error messages that tests look for.
ddp_prev_reduction_unfinished_str = "Expected to have finished reduction in the prior iteration"
ddp_recommend_find_unused_params_str = "passing the keyword argument `find_unused_parameters=True`"
ddp_find_unused_params_enabled_str = "Since `find_unused_parameters=True` is enabled"
ddp_outputs_not_used_in_loss_str = "`forward` function outputs participate in calculating loss"
ddp_suggest_debug_mode_str = (
    "set the environment variable TORCH_DISTRIBUTED_DEBUG to either INFO or DETAIL")


class NetWithBuffers(nn.Module):
    """Two bias-free linears (10 -> 10 -> 1) and a (1, 2) buffer bumped by each forward."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = (nn.Linear(n_in, n_out, bias=False) for n_in, n_out in ((10, 10), (10, 1)))
        self.register_buffer("buffer", torch.randn(1, 2))

    def forward(self, x):
        self.buffer += 1  # DDP must broadcast buffers that change
        return self.b(self.a(x))


class Foo:
    """A plain object compared attribute by attribute (tensors with torch.equal)."""

    def __init__(self, x: Any) -> None:
        self.x = x

    def __eq__(self, other: object) -> bool:
        for attr, mine in self.__dict__.items():
            theirs = other.__dict__[attr]
            same = torch.equal(mine, theirs) if isinstance(mine, torch.Tensor) else mine == theirs
            if not same:
                return False
        return True


f = Foo(10)
f.bar = 1


def create_collectives_object_test_list() -> list:
    """Picklable objects of several kinds for the *_object collectives.

    Call it after seeding so that every rank builds the same tensor.
    """
    return [
        {"key1": 3, "key2": 4, "key3": {"nested": True}},
        f,
        Foo(torch.randn(3, 3)),
        "foo",
        [1, 2, True, "string", [4, 5, "nested"]],
    ]


# NamedTuple inputs, to check DDP passes them through.
EXPECTED_FIELDS = ("a", "b")
TestNamedTupleInput_0 = namedtuple("NamedTuple", EXPECTED_FIELDS)


class TestNamedTupleInput_1(NamedTuple):
    a: torch.Tensor
    b: torch.Tensor


# Their names start with "Test"; tell pytest they are not test classes.
TestNamedTupleInput_0.__test__ = False
TestNamedTupleInput_1.__test__ = False


class DDPUnevenTestInput(NamedTuple):
    """One case of the uneven-inputs (join) tests."""

    name: str
    model: nn.Module
    inp: torch.Tensor | tuple
    sync_interval: int
    throw_on_early_termination: bool = False
    hook: Callable | None = None
    state: Any = None


class _FC2(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(10, 50, bias=True)
        self.fc.bias.requires_grad = False

    def forward(self, x):
        return self.fc(x)


class Net(nn.Module):
    """Three layers, a frozen bias and a non-float parameter that needs no grad."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(2, 10, bias=False)
        self.fc2 = _FC2()
        self.fc3 = nn.Linear(50, 4, bias=False)
        self.relu = nn.ReLU()
        self.no_grad_param = nn.Parameter(torch.tensor([2, 2]).long(), requires_grad=False)

    def forward(self, x):
        x = self.relu(self.fc1(x))
        x = self.relu(self.fc2(x))
        return F.softmax(self.fc3(x), dim=1)


class LargeNet(nn.Module):
    """About three million parameters, enough for several DDP buckets."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(1000, 2000, bias=False)
        self.fc2 = nn.Linear(2000, 500, bias=False)

    def forward(self, x):
        return self.fc2(self.fc1(x))


class Task(nn.Module):
    """One 2x2 parameter added to the input."""

    def __init__(self) -> None:
        super().__init__()
        self.p = nn.Parameter(torch.ones(2, 2))

    def forward(self, x):
        return self.p + x


class BatchNormNet(nn.Module):
    """Linear, BatchNorm1d over 4 channels, linear: for SyncBatchNorm conversion."""

    def __init__(self, affine: bool = True) -> None:
        super().__init__()
        self.fc1 = nn.Linear(2, 40, bias=False)
        self.bn = nn.BatchNorm1d(4, affine=affine)
        self.fc2 = nn.Linear(40, 4, bias=False)

    def forward(self, x):
        x = self.bn(torch.reshape(self.fc1(x), (-1, 4, 10)))
        return F.softmax(self.fc2(torch.reshape(x, (-1, 40))), dim=1)


class UnusedParamTwoLinLayerNet(nn.Module):
    """Returns two outputs; layer ``c`` never takes part (an unused parameter)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(10, 10, bias=False)
        self.b = nn.Linear(10, 10, bias=False)
        self.c = nn.Linear(5, 5, bias=False)

    def forward(self, x):
        return (self.a(x), self.b(x))


class DictOutputModule(nn.Module):
    """Wraps UnusedParamTwoLinLayerNet and returns a dict with the loss."""

    def __init__(self) -> None:
        super().__init__()
        self.module = UnusedParamTwoLinLayerNet()

    def forward(self, x):
        predictions = self.module(x)
        return {"predictions": predictions, "loss": (predictions[0] + predictions[1]).sum()}


class TwoLinLayerNet(nn.Module):
    """Two bias-free linears applied to the same input; returns both outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(10, 10, bias=False)
        self.b = nn.Linear(10, 1, bias=False)

    def forward(self, x):
        return (self.a(x), self.b(x))


class EmbeddingNetDifferentParams(nn.Module):
    """Parameter shapes (or count) differ by rank: DDP must reject it."""

    def __init__(self, rank: int, diff_num_params: bool = False) -> None:
        super().__init__()
        embedding_dim = 500 if diff_num_params or rank == 0 else 50
        self.embedding = nn.Embedding(num_embeddings=10, embedding_dim=embedding_dim)
        self.lin = nn.Linear(embedding_dim, 1)
        if diff_num_params:
            self.lin2 = nn.Linear(1, 1, bias=False)

    def forward(self, x):
        return self.lin(self.embedding(x))


class ControlFlowToyModel(nn.Module):
    """Uses its second layer only when the input is all ones (20x10)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin1 = nn.Linear(10, 10, bias=False)
        self.lin2 = nn.Linear(10, 10, bias=False)

    def forward(self, x):
        hidden = F.relu(self.lin1(x))
        if torch.equal(x, torch.ones(20, 10, device=x.device)):
            return self.lin2(hidden)
        return hidden


class SaveForwardInputsModule(nn.Module):
    """A linear that records its input in ``forward_inputs[self]``."""

    def __init__(self, forward_inputs: dict[nn.Module, torch.Tensor],
                 cast_forward_inputs: bool) -> None:
        super().__init__()
        self.l = nn.Linear(100, 100)
        self.forward_inputs = forward_inputs
        self.cast_forward_inputs = cast_forward_inputs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.forward_inputs[self] = x
        return self.l(x.to(self.l.weight.dtype) if self.cast_forward_inputs else x)


class SaveForwardInputsModel(nn.Module):
    """Two SaveForwardInputsModules in a row; records its own input too."""

    def __init__(self, forward_inputs: dict[nn.Module, torch.Tensor],
                 cast_forward_inputs: bool) -> None:
        super().__init__()
        self.c1 = SaveForwardInputsModule(forward_inputs, cast_forward_inputs)
        self.c2 = SaveForwardInputsModule(forward_inputs, cast_forward_inputs)
        self.forward_inputs = forward_inputs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.forward_inputs[self] = x
        return self.c2(self.c1(x))


# Shared instances of older upstream versions, built on first access.
_LAZY_INSTANCES: dict[str, Callable[[], Any]] = {
    "DDP_NET": Net,
    "BN_NET": BatchNormNet,
    "BN_NET_NO_AFFINE": lambda: BatchNormNet(affine=False),
    "ONLY_SBN_NET": lambda: nn.SyncBatchNorm(2, momentum=0.99),
    "foo_cpu_tensor": lambda: Foo(torch.randn(3, 3)),
    "COLLECTIVES_OBJECT_TEST_LIST": create_collectives_object_test_list,
}


def __getattr__(name: str) -> Any:
    factory = _LAZY_INSTANCES.get(name)
    if factory is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = factory()
    globals()[name] = value  # built once per process, like a module constant
    return value
