"""Which native module serves a model_type: the one named in common.native.NATIVE_FAMILIES (the HTTP side
reads that table without torch), each imported here, so that the forkserver has them all before any fork."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

import torch
from torch import nn

from common.native import NATIVE_FAMILIES
from engine.families import qwen3


class Loader(Protocol):
    def __call__(
        self,
        folder: Path,
        config: dict[str, Any],
        num_labels: int | None,
        device: torch.device | None,
        dtype: torch.dtype,
    ) -> nn.Module: ...


# dotted name -> the family module, each `load` a Loader
MODULES: dict[str, ModuleType] = {
    family.module: importlib.import_module(family.module) for family in NATIVE_FAMILIES.values()
}


class Scorer(Protocol):
    def __call__(
        self,
        folder: Path,
        config: dict[str, Any],
        score_tokens: tuple[int, int],
        device: torch.device | None,
        dtype: torch.dtype,
    ) -> nn.Module: ...


# model_type -> the loader of a causal LM served as a yes/no reranker (common.causal_reranker.CAUSAL_RERANKERS)
SCORERS: dict[str, Scorer] = {"qwen3": qwen3.load_scorer}


def load(
    folder: Path,
    config: dict[str, Any],
    num_labels: int | None,
    device: torch.device,
    dtype: torch.dtype,
    score_tokens: tuple[int, int] | None = None,
) -> nn.Module:
    """The folder's model on its family's module: a packed batch in, hidden states [T, H] or
    logits [B, labels] out. common.native.native_model has said the model_type is one of ours.
    With score_tokens (a yes/no reranker) the logits are one column: l_yes - l_no."""
    if score_tokens is not None:
        return SCORERS[str(config["model_type"])](folder, config, score_tokens, device, dtype)
    loader: Loader = MODULES[NATIVE_FAMILIES[str(config["model_type"])].module].load
    return loader(folder, config, num_labels, device, dtype)
