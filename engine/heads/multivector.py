"""ColBERT after the encoder: the Dense projections applied to every token, each vector normalised.

A head module like SPLADE's (engine/heads/sparse.py), fed the encoder's packed hidden states [T, H] and
answering [T, D]: which of them a document keeps (its skiplist) is the HTTP side's choice, which
knows the token ids and whether the input is a query or a document.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.layers.checkpoint import renamed_around
from engine.layers.packed import Packed


class MultiVectorModel(nn.Module):
    """An encoder with PyLate's token projection after it: L2-normalised [T, D] token vectors. The
    projection is a sentence-transformers module beside the checkpoint (PEFT adapters of the encoder
    never name it)."""

    PER_INPUT: tuple[str, ...] = ()  # no module of it runs on one row per input (engine/layers/lora_heads.py)

    def __init__(self, encoder: nn.Module, projection: nn.Module | None) -> None:
        super().__init__()
        self.encoder = encoder
        self.projection = projection
        renamed_around(self, "encoder", lambda key: None)

    def forward(self, p: Packed) -> torch.Tensor:
        hidden = self.encoder(p)
        return project(hidden, self.projection)


def project(hidden: torch.Tensor, projection: nn.Module | None) -> torch.Tensor:
    """Token states [.., H] through the projection, normalised as PyLate's encode normalises them."""
    vectors = hidden if projection is None else projection(hidden)
    return F.normalize(vectors, p=2, dim=-1)
