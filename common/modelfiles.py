"""The files serving a model folder reads, in the order it reads them (what prefetch warms), and
its weights: which files a loader reads, safetensors or pickles (no torch)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from common.folderjson import ModelError, modules_json, read_json
from common.m3 import read_m3
from common.splade import SpladeError, read_router
from common.vision import clip_module

if TYPE_CHECKING:  # common.modelfolder imports this module
    from common.modelfolder import ModelFolder

# What the HTTP process reads of a folder, in the order it reads them (the tokenizer last).
_CONFIG_FILES = (
    "config.json",
    "modules.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
    "preprocessor_config.json",  # a CLIP or SigLIP folder's image preprocessing
)


def _tokenizer_files(path: Path) -> list[Path]:
    """tokenizer_config.json and tokenizer.json; without tokenizer.json, sentencepiece's model, which
    a SigLIP folder's tokenizer is built from (server/tokenizing/siglip_tokenizer.py)."""
    name = "tokenizer.json" if (path / "tokenizer.json").is_file() else "spiece.model"
    return [path / "tokenizer_config.json", path / name]


def files_to_load(path: Path) -> list[Path]:
    """The files serving this folder reads, in the order they are read: the config files and the
    sentence-transformers modules' configs (HTTP process, first), the tokenizer, then the weights
    (engine: the model's, then its modules', such as a Dense layer's). Nothing else: no ONNX
    exports, no second copy of the weights, no README. A Router folder's: its document encoder's,
    then the query side's weights."""
    try:
        modules = modules_json(path)
        routed = read_router(path, modules, read_json)
    except (ModelError, SpladeError):
        modules, routed = [], None
    wrapped = clip_module(path, modules)
    if wrapped is not None:
        return [path / "modules.json", *files_to_load(wrapped)]
    if routed is not None:
        configs = [path / n for n in ("modules.json", "router_config.json", routed.pooling / "config.json")]
        idf = [] if routed.idf is None else [routed.idf]
        return [f for f in configs if f.is_file()] + files_to_load(routed.encoder) + idf
    module_configs = [
        path / str(m.get("path", "")) / "config.json" for m in modules if isinstance(m, dict) and m.get("path")
    ]
    named = [path / n for n in _CONFIG_FILES] + module_configs + _tokenizer_files(path)
    module_weights = [f.parent / n for f in module_configs for n in ("model.safetensors", "pytorch_model.bin")]
    heads = read_m3(path)
    extra = [f for f in module_weights if f.is_file()] + ([] if heads is None else heads.files())
    return [f for f in named if f.is_file()] + weight_files(path) + extra


BIN = "pytorch_model.bin"


def weight_files(path: Path) -> list[Path]:
    """The weights a loader reads: model.safetensors; else the shards a safetensors index names
    (the index first); else pytorch_model.bin or the shards of its index: pickles, which only the
    transformers fallback reads, and only where WARMPOOL_ALLOW_BIN_WEIGHTS allows."""
    for single, index in (("model.safetensors", "model.safetensors.index.json"), (BIN, "pytorch_model.bin.index.json")):
        if (path / single).is_file():
            return [path / single]
        if (path / index).is_file():
            try:
                shards = sorted(set(read_json(path / index).get("weight_map", {}).values()))
            except (ModelError, AttributeError, TypeError):
                shards = []
            return [path / index, *(path / str(name) for name in shards if (path / str(name)).is_file())]
    return []


def safetensors_weights(path: Path) -> bool:
    """The folder's weights are safetensors (one file or shards), what the native engine reads."""
    return any(f.name.endswith(".safetensors") for f in weight_files(path))


def pickled_weights(info: ModelFolder) -> list[Path]:
    """The pickles serving this folder would unpickle (torch.load, weights_only): the model's
    pytorch_model.bin (or its shards) where it has no safetensors, and each Dense module's where
    its folder has no model.safetensors. The engine refuses them unless WARMPOOL_ALLOW_BIN_WEIGHTS
    allows."""
    model = [f for f in weight_files(info.path) if f.name.endswith(".bin")]
    dense = [d.path / BIN for d in info.dense if not (d.path / "model.safetensors").is_file()]
    return model + [f for f in dense if f.is_file()]
