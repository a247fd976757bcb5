"""What a model folder is, read from its config files alone (no torch): kind, pooling, lengths, labels."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

Kind = Literal["embedding", "classification", "cross-encoder"]
PoolingMode = Literal["mean", "cls", "lasttoken", "max"]

_POOLING_KEYS: dict[str, PoolingMode] = {
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_lasttoken": "lasttoken",
    "pooling_mode_max_tokens": "max",
}


class ModelError(Exception):
    """The model folder is missing, unreadable or not something warmpool can serve."""


@dataclass(frozen=True)
class ModelFolder:
    path: Path
    kind: Kind
    architecture: str
    max_model_len: int
    hidden_size: int
    vocab_size: int
    pooling: PoolingMode = "mean"
    normalize: bool = False
    id2label: dict[int, str] = field(default_factory=dict)
    native: bool = False  # served by engine.bert, without transformers
    config: dict[str, Any] = field(default_factory=dict)  # config.json, parsed once

    @property
    def dimensions(self) -> int:
        """Length of the vector the engine returns per input."""
        return self.hidden_size if self.kind == "embedding" else max(len(self.id2label), 1)


def _read_json(path: Path, list_key: str | None = None) -> dict[str, Any]:
    """A JSON object ({} when the file is absent); a top-level list only where `list_key` names it
    (modules.json is a list)."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, RecursionError) as exc:
        raise ModelError(f"cannot read {path}: {type(exc).__name__}: {exc}") from exc
    if isinstance(data, list) and list_key is not None:
        return {list_key: data}
    if not isinstance(data, dict):
        raise ModelError(f"{path} is not a JSON object")
    return data


_INTEGER_KEYS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
    "vocab_size",
    "type_vocab_size",
    "num_labels",
)


def read_model_folder(path: Path) -> ModelFolder:
    """The folder's kind, pooling, lengths and labels; ModelError for anything that cannot be served."""
    try:
        return _read(path)
    except (TypeError, ValueError, ArithmeticError, AttributeError, KeyError) as exc:  # config of the wrong shape
        raise ModelError(f"cannot understand the config files in {path}: {type(exc).__name__}: {exc}") from exc


def _read(path: Path) -> ModelFolder:
    if not path.is_dir():
        raise ModelError(f"model folder not found: {path}")
    config = _read_json(path / "config.json")
    if not config:
        raise ModelError(f"no config.json in model folder {path}")
    for key in _INTEGER_KEYS:  # checked here, so a bad value is named, not a shape error in the engine
        value = config.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise ModelError(f"'{key}' in {path / 'config.json'} must be a non-negative integer, got {value!r}")
    architectures = config.get("architectures") or ["AutoModel"]
    if not isinstance(architectures, list) or not all(isinstance(a, str) for a in architectures):
        raise ModelError(f"'architectures' in {path / 'config.json'} must be a list of class names")
    architecture = architectures[0]
    modules = _read_json(path / "modules.json", list_key="modules").get("modules", [])
    st_config = _read_json(path / "sentence_bert_config.json")
    kind = _kind(architecture, config)
    id2label = {int(k): str(v) for k, v in (config.get("id2label") or {}).items()}
    if kind == "cross-encoder":
        id2label = id2label if len(id2label) == 1 else {0: "score"}
    pooling, normalize = _pooling(path, modules)
    return ModelFolder(
        path=path,
        kind=kind,
        architecture=architecture,
        max_model_len=_max_len(path, config, st_config),
        hidden_size=int(config.get("hidden_size") or config.get("d_model") or 0),
        vocab_size=int(config.get("vocab_size") or 0),
        pooling=pooling,
        normalize=normalize,
        id2label=id2label,
        native=native_bert(path, config, kind),
        config=config,
    )


# What the HTTP process reads of a folder, in the order it reads them (the tokenizer last).
_CONFIG_FILES = ("config.json", "modules.json", "sentence_bert_config.json", "config_sentence_transformers.json")
_TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json")


def files_to_load(path: Path) -> list[Path]:
    """The files serving this folder reads, in the order they are read: the config files and the
    sentence-transformers modules' configs (HTTP process, first), the tokenizer, then the weights
    (engine). Nothing else: no ONNX exports, no second copy of the weights, no README."""
    try:
        modules = _read_json(path / "modules.json", list_key="modules").get("modules", [])
    except ModelError:
        modules = []
    module_configs = [
        path / str(m.get("path", "")) / "config.json" for m in modules if isinstance(m, dict) and m.get("path")
    ]
    named = [path / n for n in _CONFIG_FILES] + module_configs + [path / n for n in _TOKENIZER_FILES]
    return [f for f in named if f.is_file()] + weight_files(path)


def weight_files(path: Path) -> list[Path]:
    """The weights a loader reads: model.safetensors; else the shards a safetensors index names
    (the index first); else pytorch_model.bin, which only the transformers fallback reads."""
    single = path / "model.safetensors"
    if single.is_file():
        return [single]
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(_read_json(index).get("weight_map", {}).values()))
        except (ModelError, AttributeError, TypeError):
            shards = []
        return [index, *(path / str(name) for name in shards if (path / str(name)).is_file())]
    legacy = path / "pytorch_model.bin"
    return [legacy] if legacy.is_file() else []


_NATIVE_ARCHITECTURES = {"BertModel", "BertForMaskedLM", "BertForPreTraining"}


def native_bert(path: Path, config: dict[str, Any], kind: Kind) -> bool:
    """A plain BERT (absolute positions, exact GELU) in one safetensors file: no transformers needed."""
    architecture = (config.get("architectures") or ["BertModel"])[0]
    wanted = {"BertForSequenceClassification"} if kind != "embedding" else _NATIVE_ARCHITECTURES
    return (
        config.get("model_type") == "bert"
        and architecture in wanted
        and config.get("position_embedding_type", "absolute") == "absolute"
        and config.get("hidden_act") == "gelu"
        and not config.get("is_decoder", False)
        and (path / "model.safetensors").is_file()
    )


def _kind(architecture: str, config: dict[str, Any]) -> Kind:
    if architecture.endswith("ForSequenceClassification"):
        labels = config.get("num_labels") or len(config.get("id2label") or {}) or 2
        return "cross-encoder" if labels == 1 else "classification"
    return "embedding"


def _pooling(path: Path, modules: list[dict[str, Any]]) -> tuple[PoolingMode, bool]:
    """Sentence-transformers modules decide; a plain encoder gets mean pooling, as ST would give it."""
    pooling: PoolingMode = "mean"
    normalize = False
    for module in modules:
        kind = str(module.get("type", ""))
        if kind.endswith("Pooling"):
            conf = _read_json(path / module.get("path", "") / "config.json")
            modes = [mode for key, mode in _POOLING_KEYS.items() if conf.get(key)]
            if conf.get("pooling_mode") in _POOLING_KEYS.values():
                modes = [conf["pooling_mode"]]
            if len(modes) > 1:
                raise ModelError(f"combined pooling modes {modes} are not supported")
            pooling = modes[0] if modes else "mean"
        elif kind.endswith("Normalize"):
            normalize = True
        elif kind and not kind.endswith("Transformer"):
            raise ModelError(f"sentence-transformers module {kind} is not supported")
    return pooling, normalize


def _max_len(path: Path, config: dict[str, Any], st_config: dict[str, Any]) -> int:
    if st_config.get("max_seq_length"):
        return int(st_config["max_seq_length"])
    candidates = [int(config.get("max_position_embeddings") or 512)]
    tok_max = _read_json(path / "tokenizer_config.json").get("model_max_length")
    if isinstance(tok_max, int | float) and 0 < tok_max < 1_000_000:
        candidates.append(int(tok_max))
    return min(candidates)
