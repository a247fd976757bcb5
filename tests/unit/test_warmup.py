"""Warm-up: small forwards only, whatever the model's longest input, and a token priced by the model's
projection weights rather than by forwards that grow with the model."""

from __future__ import annotations

from typing import Any

import pytest

from common.modelfolder import read_model_folder
from common.wire import Tokens
from engine.runtime.model import PoolingModel
from engine.runtime.warmup import SMALL, projections
from tests.tiny_models import TinyFolders


def test_warm_up_runs_small_forwards_only_and_says_which(tiny: TinyFolders) -> None:
    """Every forward warm-up runs is one input of SMALL tokens, however long the model's inputs may
    be, and the warmup detail lists exactly those forwards."""
    model = PoolingModel(read_model_folder(tiny["mpnet"]), threads=1)
    assert model.info.max_model_len > SMALL
    shapes: list[str] = []
    forward = model.forward

    def recorded(items: list[Tokens]) -> Any:
        shapes.append(f"{len(items)}x{max(len(t.input_ids) for t in items)}")
        return forward(items)

    model.forward = recorded  # type: ignore[method-assign]
    warmup = model.warm_up()
    assert shapes == warmup.detail["forwards"] == [f"1x{SMALL}"] * 2
    assert warmup.per_token_s > 0 and 1 <= warmup.overhead_tokens <= 512


@pytest.mark.parametrize("labels", [0, 3], ids=["encoder", "classifier"])
def test_a_token_costs_the_projection_weights(tiny: TinyFolders, labels: int) -> None:
    """The FLOPs a token is priced at are 2 x the weights it is multiplied by: per layer the fused QKV
    projection, the attention output and both feed-forward matrices (plus a classifier's head), and
    no embedding table."""
    info = read_model_folder(tiny["mpnet-classifier" if labels else "mpnet"])
    model = PoolingModel(info, threads=1)
    c = info.config
    hidden, inner = c["hidden_size"], c["intermediate_size"]
    expected = c["num_hidden_layers"] * (4 * hidden * hidden + 2 * hidden * inner)
    if labels:
        expected += hidden * hidden + hidden * labels
    layers = projections(model.model)
    assert sum(layer.in_features * layer.out_features for layer in layers) == expected
    assert model.warm_up().detail["mflop_per_token"] == round(2 * expected / 1e6, 3) > 0
