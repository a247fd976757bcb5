"""oneDNN prepacked projections (engine/prepacked.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from common.modelfolder import read_model_folder
from common.wire import Tokens
from engine import families, preloaded
from engine.device import Placement, place
from engine.layers import layer_projections
from engine.model import PoolingModel
from engine.prepacked import PrepackedLinear, prepack
from tests.tiny_models import TINY, TinyFolders

NATIVE = sorted(name for name, tiny in TINY.items() if tiny.family != "distilbert")
CPU32 = Placement(torch.device("cpu"), torch.float32)


def test_a_prepacked_linear_computes_the_linear() -> None:
    """PrepackedLinear gives nn.Linear's output within 1e-5 in float32, on 2-D and 3-D inputs, with
    and without a bias."""
    torch.manual_seed(0)
    for bias in (True, False):
        linear = nn.Linear(48, 72, bias=bias)
        for x in (torch.randn(5, 48), torch.randn(2, 7, 48)):
            with torch.inference_mode():
                torch.testing.assert_close(PrepackedLinear(linear)(x), linear(x), rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", NATIVE)
def test_every_native_family_is_prepacked_and_unchanged(tiny: TinyFolders, name: str) -> None:
    """A native model built for a float32 CPU engine has prepacked projections, says so in its
    weights detail, and gives what the same model with nn.Linear gives, within 1e-5."""
    info = read_model_folder(tiny[name])
    engine = PoolingModel(info, threads=1, placement=place("cpu", "float32", []))
    assert "projections in oneDNN's blocked layout" in engine.weights["prepacked"]
    assert layer_projections(engine.model) == []  # none of the layers' nn.Linear left
    labels = None if info.kind == "embedding" else len(info.id2label)
    plain = PoolingModel(info, threads=1, placement=place("cpu", "float32", []))
    plain.model = families.load(info.path, info.config, labels, torch.device("cpu"), torch.float32, info.score_tokens)
    assert not any(isinstance(m, PrepackedLinear) for m in plain.model.modules())
    items = [Tokens([5 + i for i in range(n)]) for n in (3, 9, 17)]
    np.testing.assert_allclose(engine.forward(items), plain.forward(items), rtol=0, atol=1e-5)


def test_a_dtype_onednn_cannot_pack_leaves_the_model_as_it_was(tiny: TinyFolders) -> None:
    """float16 is not prepacked: prepack() replaces nothing and the model keeps its nn.Linear layers."""
    info = read_model_folder(tiny["bert"])
    model = families.load(info.path, info.config, None, torch.device("cpu"), torch.float16)
    assert prepack(model, torch.float16) == 0
    assert not any(isinstance(m, PrepackedLinear) for m in model.modules())


def test_prepacked_weights_leave_the_file_pages_they_were_read_from(tiny: TinyFolders) -> None:
    """Built as the forkserver builds it, a float32 model keeps no parameter on its projections'
    stretch of the mapped file: the weights are held once, in the packed copy."""
    model = preloaded.build(read_model_folder(tiny["bert"]), CPU32)
    names = {name for name, _ in model.named_parameters()}
    assert not any(
        name.endswith(".weight") and ("dense" in name or "qkv" in name) and "layer" in name for name in names
    )
    assert (
        sum(isinstance(m, PrepackedLinear) for m in model.modules()) == 2 * 4
    )  # qkv, attention out, in, out per layer
