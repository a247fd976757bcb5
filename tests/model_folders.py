"""Model folders written from their JSON files alone (config.json, modules.json, the pooling and
sentence-transformers configs): what common.modelfolder reads to decide a model's kind."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

BERT_CONFIG: dict[str, Any] = {
    "architectures": ["BertModel"],
    "model_type": "bert",
    "hidden_act": "gelu",
    "hidden_size": 32,
    "vocab_size": 100,
    "max_position_embeddings": 512,
    "position_embedding_type": "absolute",
}

TRANSFORMER = {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}
POOLING = {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}
NORMALIZE = {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}
DENSE = {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}

MEAN_POOLING = {
    "word_embedding_dimension": 32,
    "pooling_mode_cls_token": False,
    "pooling_mode_mean_tokens": True,
    "pooling_mode_max_tokens": False,
    "pooling_mode_mean_sqrt_len_tokens": False,
}


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def make_folder(
    root: Path,
    config: Any = BERT_CONFIG,
    *,
    modules: list[Any] | None = None,
    pooling: dict[str, Any] | None = None,
    st_config: dict[str, Any] | None = None,
    tokenizer: dict[str, Any] | None = None,
    weights: bool = False,
) -> Path:
    """A model folder with the given JSON files (those left as None are not written)."""
    folder = root / "model"
    folder.mkdir()
    write_json(folder / "config.json", config)
    if modules is not None:
        write_json(folder / "modules.json", modules)
    if pooling is not None:
        write_json(folder / "1_Pooling" / "config.json", pooling)
    if st_config is not None:
        write_json(folder / "sentence_bert_config.json", st_config)
    if tokenizer is not None:
        write_json(folder / "tokenizer_config.json", tokenizer)
    if weights:
        (folder / "model.safetensors").write_bytes(b"")
    return folder


def classifier_config(labels: list[str]) -> dict[str, Any]:
    return {
        **BERT_CONFIG,
        "architectures": ["BertForSequenceClassification"],
        "id2label": {str(i): label for i, label in enumerate(labels)},
        "label2id": {label: i for i, label in enumerate(labels)},
    }
