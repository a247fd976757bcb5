"""A SparseEncoder folder's SPLADE pooling, read from its config (no torch)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal


class SpladeError(ValueError):
    pass


@dataclass(frozen=True)
class Splade:
    """sentence-transformers' SpladePooling: log(1 + relu(logits)) (log1p twice for `log1p_relu`),
    then the max or the sum over each input's tokens: one weight per vocabulary entry."""

    strategy: Literal["max", "sum"] = "max"
    activation: Literal["relu", "log1p_relu"] = "relu"


def read_splade(conf: dict[str, Any], folder: Path) -> Splade:
    """SpladePooling's config.json; SpladeError for a strategy or an activation it does not define."""
    strategy, activation = conf.get("pooling_strategy", "max"), conf.get("activation_function", "relu")
    if strategy not in ("max", "sum") or activation not in ("relu", "log1p_relu"):
        raise SpladeError(f"SPLADE pooling {strategy!r} with {activation!r} in {folder} is not supported")
    return Splade(strategy, activation)
