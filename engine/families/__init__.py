"""Which native module serves a model_type: the registry common.native.NATIVE_FAMILIES mirrors."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from engine.families import bert, clip, gemma3, modernbert, mpnet, nomic_gte, qwen3, xlm_roberta


class Loader(Protocol):
    def __call__(
        self,
        folder: Path,
        config: dict[str, Any],
        num_labels: int | None,
        device: torch.device | None,
        dtype: torch.dtype,
    ) -> nn.Module: ...


LOADERS: dict[str, Loader] = {
    "bert": bert.load,
    "roberta": xlm_roberta.load,
    "xlm-roberta": xlm_roberta.load,
    "mpnet": mpnet.load,
    "modernbert": modernbert.load,
    "gemma3_text": gemma3.load,
    "nomic_bert": nomic_gte.load,
    "gte": nomic_gte.load,
    "qwen3": qwen3.load,
    "clip": clip.load,
    "siglip": clip.load,
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
    return LOADERS[str(config["model_type"])](folder, config, num_labels, device, dtype)
