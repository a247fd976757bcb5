"""Tiny random-weight sequence-classification models, saved like a real model folder."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")


def build_classifier(dest: Path, tokenizer_from: Path, labels: list[str]) -> Path:
    """A 2-layer BertForSequenceClassification with the embedded model's tokenizer."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(len(labels))
    config = BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        num_labels=len(labels),
        id2label=dict(enumerate(labels)),
        label2id={label: i for i, label in enumerate(labels)},
    )
    return save_with_tokenizer(BertForSequenceClassification(config), dest, tokenizer_from)


def build_distilbert(dest: Path, tokenizer_from: Path) -> Path:
    """A plain (non-sentence-transformers) DistilBERT encoder: served through transformers."""
    import torch
    from transformers import DistilBertConfig, DistilBertModel

    torch.manual_seed(7)
    config = DistilBertConfig(
        vocab_size=30522, dim=32, n_layers=2, n_heads=2, hidden_dim=64, max_position_embeddings=128
    )
    return save_with_tokenizer(DistilBertModel(config), dest, tokenizer_from)


def save_with_tokenizer(model: Any, dest: Path, tokenizer_from: Path) -> Path:
    """A model folder as a hub download looks: weights, config and the embedded model's tokenizer."""
    model.eval().save_pretrained(dest)
    for name in TOKENIZER_FILES:
        shutil.copy(tokenizer_from / name, dest / name)
    return dest
