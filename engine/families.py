"""Which native module serves a model_type: the registry common.modelfolder.NATIVE_FAMILIES mirrors."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from engine import bert, modernbert, mpnet, xlm_roberta


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
}


def load(
    folder: Path, config: dict[str, Any], num_labels: int | None, device: torch.device, dtype: torch.dtype
) -> nn.Module:
    """The folder's model on its family's module: a packed batch in, hidden states [T, H] or
    logits [B, labels] out. common.modelfolder.native_model has said the model_type is one of ours."""
    return LOADERS[str(config["model_type"])](folder, config, num_labels, device, dtype)
