"""Every public model fixture, with each of its options, is upstream's model.

Built from the same seed by distspawn's module and upstream's, a fixture must
have the same parameters and buffers (names, values, requires_grad) and give
the same output for the same input. (The FSDP1 family, built through its
``init`` classmethods, is compared in test_fsdp1.py.)
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

import pytest
import torch

from harness import upstream_module_imports

UPSTREAM = {
    "fsdp": "torch.testing._internal.common_fsdp",
    "dtensor": "torch.testing._internal.distributed._tensor.common_dtensor",
}
OURS = {"fsdp": "distspawn.fsdp", "dtensor": "distspawn.dtensor"}


@dataclass(frozen=True)
class Case:
    face: str  # "fsdp" or "dtensor"
    build: Callable[[Any], torch.nn.Module]  # given the module to take the fixture from
    inputs: Callable[[], tuple]


def _features(dim: int, *lead: int) -> Callable[[], tuple]:
    return lambda: (torch.randn(*lead, dim),)


def _tokens(batch: int = 2, length: int = 8, vocab: int = 8) -> Callable[[], tuple]:
    return lambda: (torch.randint(0, vocab, (batch, length)),)


def _transformer(**switches: Any) -> Callable[[Any], torch.nn.Module]:
    return lambda m: m.Transformer(m.ModelArgs(**switches))


CASES = {
    # FSDP2 fixtures (common_fsdp)
    "MLP": Case("fsdp", lambda m: m.MLP(8), _features(8, 2)),
    "MLP-no-bias": Case("fsdp", lambda m: m.MLP(8, bias=False), _features(8, 2)),
    "MLP-with-buffer": Case("fsdp", lambda m: m.MLP(8, with_buffer=True), _features(8, 2)),
    "MLP-multiplier-3": Case("fsdp", lambda m: m.MLP(8, dim_multiplier=3), _features(8, 2)),
    "MLP-on-cpu": Case("fsdp", lambda m: m.MLP(8, torch.device("cpu")), _features(8, 2)),
    "MLPStack": Case("fsdp", lambda m: m.MLPStack(8), _features(8, 2)),
    "MLPStack-seq-parallel": Case("fsdp", lambda m: m.MLPStack(8, with_seq_parallel=True),
                                  _features(8, 2)),
    "DoubleLinear": Case("fsdp", lambda m: m.DoubleLinear(8), _features(8, 2)),
    "DoubleLinear-one": Case("fsdp", lambda m: m.DoubleLinear(8, use_second_linear=False),
                             _features(8, 2)),
    "SkipModule": Case("fsdp", lambda m: m.SkipModule(), _features(10, 2)),
    "NestedLinear": Case("fsdp", lambda m: m.NestedLinear(fsdp_wrap=False), _features(10, 2)),
    # DTensor fixtures (common_dtensor)
    "MLPModule": Case("dtensor", lambda m: m.MLPModule("cpu"), _features(10, 2)),
    "MLPModule-no-bias": Case("dtensor", lambda m: m.MLPModule("cpu", bias=False),
                              _features(10, 2)),
    "MLPStacked": Case("dtensor", lambda m: m.MLPStacked("cpu"), _features(10, 2)),
    "MLPStacked-3": Case("dtensor", lambda m: m.MLPStacked("cpu", n_layers=3),
                         _features(10, 2)),
    "RMSNormPython": Case("dtensor", lambda m: m.RMSNormPython(8), _features(8, 2, 3)),
    "RMSNormPython-eps": Case("dtensor", lambda m: m.RMSNormPython(8, eps=1e-3),
                              _features(8, 2, 3)),
    "FeedForward": Case("dtensor", lambda m: m.FeedForward(16, 32, 0.1), _features(16, 2, 4)),
    "Attention": Case("dtensor", lambda m: m.Attention(m.ModelArgs()), _features(16, 2, 8)),
    "Attention-no-mask": Case("dtensor", lambda m: m.Attention(m.ModelArgs(use_attn_mask=False)),
                              _features(16, 2, 8)),
    "TransformerBlock": Case("dtensor", lambda m: m.TransformerBlock(m.ModelArgs()),
                             _features(16, 2, 8)),
    "Experts": Case("dtensor", lambda m: m.Experts(8, 16, 2), _features(8, 6)),
    "ExpertLayer": Case("dtensor", lambda m: m.ExpertLayer(2, 8, 16), _features(8, 2, 3)),
    "Transformer": Case("dtensor", _transformer(), _tokens()),
    "Transformer-one-layer": Case("dtensor", _transformer(n_layers=1), _tokens()),
    "Transformer-no-mask": Case("dtensor", _transformer(use_attn_mask=False), _tokens()),
    "Transformer-untied": Case("dtensor", _transformer(weight_tying=False), _tokens()),
    "Transformer-checkpointed": Case("dtensor", _transformer(checkpoint_activations=True),
                                     _tokens()),
    "Transformer-experts": Case("dtensor", _transformer(num_experts=2), _tokens()),
    "Transformer-no-dropout": Case("dtensor", _transformer(dropout_p=0.0), _tokens()),
    "Transformer-wide": Case("dtensor", _transformer(dim=32, n_heads=8, vocab_size=16,
                                                     max_seq_len=12), _tokens(vocab=16)),
}


def _built(face: str, module_name: str, case: Case) -> tuple[torch.nn.Module, Any]:
    module = importlib.import_module(module_name)  # before seeding: an import may draw
    torch.manual_seed(0)
    model = case.build(module)
    torch.manual_seed(1)
    # Drawn on the CPU, then put where the fixture put itself (NestedLinear
    # goes to the accelerator, where there is one).
    device = next(model.parameters()).device
    inputs = tuple(x.to(device) for x in case.inputs())
    torch.manual_seed(2)  # dropout draws, where a fixture trains
    return model, model(*inputs)


@pytest.mark.parametrize("name", sorted(CASES))
def test_fixture_is_upstreams_model(name):
    case = CASES[name]
    if not upstream_module_imports(UPSTREAM[case.face]):
        pytest.skip(f"{UPSTREAM[case.face]} does not import here")
    try:
        theirs, theirs_out = _built(case.face, UPSTREAM[case.face], case)
    except (AttributeError, TypeError) as exc:  # e.g. the experts models came after 2.8
        pytest.skip(f"this release's upstream cannot build it: {exc}")
    ours, ours_out = _built(case.face, OURS[case.face], case)
    assert type(ours).__name__ == type(theirs).__name__
    theirs_params, ours_params = dict(theirs.named_parameters()), dict(ours.named_parameters())
    assert list(ours_params) == list(theirs_params)
    for key, value in theirs_params.items():
        assert torch.equal(ours_params[key], value), key
        assert ours_params[key].requires_grad == value.requires_grad, key
    theirs_buffers, ours_buffers = dict(theirs.named_buffers()), dict(ours.named_buffers())
    assert list(ours_buffers) == list(theirs_buffers)
    for key, value in theirs_buffers.items():
        assert torch.equal(ours_buffers[key], value), key
    assert [n for n, _ in ours.named_modules()] == [n for n, _ in theirs.named_modules()]
    torch.testing.assert_close(ours_out, theirs_out, rtol=0, atol=0)
