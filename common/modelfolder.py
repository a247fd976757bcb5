"""What a model folder is, read from its config files alone (no torch): kind, pooling, lengths, labels."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from common.causal_reranker import PairTemplate, reranker_template, score_token_ids
from common.late_interaction import (
    LateInteraction,
    LateInteractionError,
    is_pylate,
    read_late_interaction,
    read_multi_vector_encoder,
    read_stanford,
)
from common.m3 import M3Heads, read_m3
from common.native import Kind, native_model
from common.splade import Routed, Splade, SpladeError, read_router, read_splade
from common.vision import Vision, VisionError, clip_module, dimensions, is_dual_encoder, read_vision, text_length

PoolingMode = Literal["mean", "cls", "lasttoken", "max", "weightedmean", "mean_sqrt_len_tokens"]

_POOLING_KEYS: dict[str, PoolingMode] = {
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_lasttoken": "lasttoken",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
}

# A Dense module's activation_function (its torch.nn class) -> the name engine.dense knows it by.
DENSE_ACTIVATIONS = {
    "torch.nn.modules.linear.Identity": "Identity",
    **{f"torch.nn.modules.activation.{name}": name for name in ("Tanh", "ReLU", "GELU", "Sigmoid", "SiLU")},
}


class ModelError(Exception):
    """The model folder is missing, unreadable or not something warmpool can serve."""


@dataclass(frozen=True)
class DenseLayer:
    """A sentence-transformers Dense module after pooling: activation(linear(x)) (+ x, or + a
    projection of x, with use_residual)."""

    path: Path  # the module's folder: its weights are model.safetensors or pytorch_model.bin there
    in_features: int
    out_features: int
    bias: bool = True
    activation: str = "Tanh"  # a value of DENSE_ACTIVATIONS
    residual: bool = False


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
    native: bool = False  # served by a native engine family (engine.families), without transformers
    config: dict[str, Any] = field(default_factory=dict)  # config.json, parsed once
    prompts: dict[str, str] = field(default_factory=dict)  # sentence-transformers' named prompts
    default_prompt_name: str | None = None  # the prompt a request naming none gets
    pair_template: PairTemplate | None = None  # a causal-LM reranker's prompt (common.causal_reranker)
    score_tokens: tuple[int, int] | None = None  # its (no, yes) token ids: the LM head rows it is scored by
    dense: tuple[DenseLayer, ...] = ()  # sentence-transformers Dense modules, in order, after pooling
    splade: Splade | None = None  # a sparse model's SPLADE pooling over its masked-LM logits
    late: LateInteraction | None = None  # a multi-vector (ColBERT) model's query and document encoding
    m3: M3Heads | None = None  # bge-m3's lexical and ColBERT heads beside a native encoder (common.m3)
    # an inference-free sparse model's query weights (a Router's SparseStaticEmbedding): a query is
    # the weights of its tokens, no forward; `path` is then the Router's document encoder
    idf: Path | None = None
    vision: Vision | None = None  # a CLIP or SigLIP model: texts and images into one space (common.vision)

    @property
    def dimensions(self) -> int:
        """Length of the vector the engine returns per input."""
        if self.kind == "sparse":
            return self.vocab_size
        if self.kind not in ("embedding", "multi-vector"):
            return max(len(self.id2label), 1)
        return self.dense[-1].out_features if self.dense else self.hidden_size


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
    top_modules = _read_json(path / "modules.json", list_key="modules").get("modules", [])
    wrapped = clip_module(path, top_modules)
    if wrapped is not None:  # sentence-transformers' CLIPModel module: the CLIP folder it wraps is the model
        return _read(wrapped)
    routed = _router(path, top_modules)
    if routed is not None:  # the Router's document encoder is the model; the root has no config.json
        encoder = _read(routed.encoder)
        pooled = read_splade(_read_json(routed.pooling / "config.json"), routed.pooling)
        if not encoder.architecture.endswith("ForMaskedLM"):
            raise ModelError(
                f"{path}: SPLADE pools a masked-LM head's logits, the Router's encoder is {encoder.architecture}"
            )
        native = native_model(encoder.config, "sparse", safetensors_weights(encoder.path))
        return replace(encoder, kind="sparse", splade=pooled, native=native, idf=routed.idf)
    config = _read_json(path / "config.json")
    if not config:
        raise ModelError(f"no config.json in model folder {path}")
    for key in _INTEGER_KEYS:  # checked here, so a bad value is named, not a shape error in the engine
        value = config.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise ModelError(f"'{key}' in {path / 'config.json'} must be a non-negative integer, got {value!r}")
    if is_dual_encoder(config):
        return _dual_encoder(path, config)
    architectures = config.get("architectures") or ["AutoModel"]
    if not isinstance(architectures, list) or not all(isinstance(a, str) for a in architectures):
        raise ModelError(f"'architectures' in {path / 'config.json'} must be a list of class names")
    architecture = architectures[0]
    modules = _read_json(path / "modules.json", list_key="modules").get("modules", [])
    st_config = _read_json(path / "sentence_bert_config.json")
    pair_template = reranker_template(config, architecture, has_modules=(path / "modules.json").is_file())
    score_tokens = None if pair_template is None else _score_tokens(path, architecture)
    kind: Kind = _kind(architecture, config) if pair_template is None else "cross-encoder"
    hidden = int(config.get("hidden_size") or config.get("d_model") or config.get("dim") or config.get("n_embd") or 0)
    late, projection = _late_interaction(path, architecture) if kind == "embedding" else (None, ())
    pooling, normalize, dense, splade = _modules(path, modules, hidden, tokens=late is not None)
    dense = dense or projection
    if late is not None:
        kind = "multi-vector"
    m3 = read_m3(path) if kind == "embedding" else None
    if m3 is not None and not modules:
        pooling, normalize = "cls", True  # FlagEmbedding's dense vector: the first token's state, normalised
    if splade is not None:
        if not architecture.endswith("ForMaskedLM"):
            raise ModelError(f"{path} has SPLADE pooling but a {architecture}: SPLADE pools a masked-LM head's logits")
        kind = "sparse"
    native = native_model(config, kind, safetensors_weights(path))
    if pair_template is not None and not native:
        raise ModelError(
            f"{path} is served as a yes/no reranker ({architecture} without sentence-transformers modules), which "
            "only the native engine runs: it needs full attention, plain rotary positions and safetensors weights"
        )
    id2label = {int(k): str(v) for k, v in (config.get("id2label") or {}).items()}
    if kind == "cross-encoder":
        id2label = id2label if len(id2label) == 1 else {0: "score"}
    prompts, default_prompt_name = read_prompts(path)
    return ModelFolder(
        path=path,
        kind=kind,
        architecture=architecture,
        max_model_len=_max_len(path, config, st_config, late),
        hidden_size=hidden,
        vocab_size=int(config.get("vocab_size") or 0),
        pooling=pooling,
        normalize=normalize,
        id2label=id2label,
        native=native,
        dense=dense,
        splade=splade,
        late=late,
        m3=m3 if native else None,
        config=config,
        prompts=prompts,
        default_prompt_name=default_prompt_name,
        pair_template=pair_template,
        score_tokens=score_tokens,
    )


def _dual_encoder(path: Path, config: dict[str, Any]) -> ModelFolder:
    """A CLIP or SigLIP folder: one vector per text or image, normalised (the models compare them by
    cosine: their forward normalises both before the logit)."""
    try:
        vision = read_vision(path, config)
    except VisionError as exc:
        raise ModelError(str(exc)) from exc
    prompts, default_prompt_name = read_prompts(path)
    return ModelFolder(
        path=path,
        kind="embedding",
        architecture=(config.get("architectures") or [""])[0],
        max_model_len=text_length(config),
        hidden_size=dimensions(config),
        vocab_size=int((config.get("text_config") or {}).get("vocab_size") or 0),
        normalize=True,
        native=native_model(config, "embedding", safetensors_weights(path)),
        config=config,
        prompts=prompts,
        default_prompt_name=default_prompt_name,
        vision=vision,
    )


def read_prompts(path: Path) -> tuple[dict[str, str], str | None]:
    """`prompts` and `default_prompt_name` from config_sentence_transformers.json, checked as
    sentence-transformers checks them (a default must name one of the prompts)."""
    where = path / "config_sentence_transformers.json"
    st = _read_json(where)
    prompts = st.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()):
        raise ModelError(f"'prompts' in {where} must map prompt names to prompt texts")
    default = st.get("default_prompt_name")
    if default is not None and default not in prompts:
        raise ModelError(f"default_prompt_name {default!r} in {where} is not one of its prompts {sorted(prompts)}")
    return prompts, default


# What the HTTP process reads of a folder, in the order it reads them (the tokenizer last).
_CONFIG_FILES = (
    "config.json",
    "modules.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
    "preprocessor_config.json",  # a CLIP or SigLIP folder's image preprocessing
)
_TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json")


def files_to_load(path: Path) -> list[Path]:
    """The files serving this folder reads, in the order they are read: the config files and the
    sentence-transformers modules' configs (HTTP process, first), the tokenizer, then the weights
    (engine: the model's, then its modules', such as a Dense layer's). Nothing else: no ONNX
    exports, no second copy of the weights, no README. A Router folder's: its document encoder's,
    then the query side's weights."""
    try:
        modules = _read_json(path / "modules.json", list_key="modules").get("modules", [])
        routed = _router(path, modules)
    except ModelError:
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
    named = [path / n for n in _CONFIG_FILES] + module_configs + [path / n for n in _TOKENIZER_FILES]
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
                shards = sorted(set(_read_json(path / index).get("weight_map", {}).values()))
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


def _kind(architecture: str, config: dict[str, Any]) -> Kind:
    if architecture.endswith("ForSequenceClassification"):
        labels = config.get("num_labels") or len(config.get("id2label") or {}) or 2
        return "cross-encoder" if labels == 1 else "classification"
    return "embedding"


def _score_tokens(path: Path, architecture: str) -> tuple[int, int]:
    """A yes/no reranker's (no, yes) token ids; a folder whose tokenizer has no such single tokens is
    neither a reranker nor an embedding model, and is refused saying which it could be made."""
    ids = score_token_ids(path)
    if ids is None:
        raise ModelError(
            f"{path} has a {architecture} without sentence-transformers modules, served as a yes/no reranker "
            "(Qwen3-Reranker), but its tokenizer.json has no single 'yes' and 'no' tokens; for an embedding "
            "model add modules.json (Transformer, Pooling, Normalize) as Qwen3-Embedding has"
        )
    return ids


def _router(path: Path, modules: list[dict[str, Any]]) -> Routed | None:
    try:
        return read_router(path, modules, _read_json)
    except SpladeError as exc:
        raise ModelError(str(exc)) from exc


def _late_interaction(path: Path, architecture: str) -> tuple[LateInteraction | None, tuple[DenseLayer, ...]]:
    """A ColBERT's switches: PyLate's, where config_sentence_transformers.json has them, or a
    Stanford-NLP folder's (HF_ColBERT), with the projection its checkpoint holds as a Dense layer."""
    try:
        if architecture == "HF_ColBERT":
            late, (out, fan_in) = read_stanford(path)
            return late, (DenseLayer(path, fan_in, out, bias=False, activation="Identity"),)
        st = _read_json(path / "config_sentence_transformers.json")
        if st.get("model_type") == "MultiVectorEncoder":
            modules = _read_json(path / "modules.json", list_key="modules").get("modules", [])
            mask = next((m for m in modules if str(m.get("type", "")).endswith("MultiVectorMask")), None)
            return read_multi_vector_encoder(
                st,
                _read_json(path / "sentence_bert_config.json"),
                {} if mask is None else _read_json(path / str(mask.get("path", "")) / "config.json"),
                _max_len(path, _read_json(path / "config.json"), _read_json(path / "sentence_bert_config.json"), None),
                path,
            ), ()
        return (read_late_interaction(st, path) if is_pylate(st) else None), ()
    except LateInteractionError as exc:
        raise ModelError(str(exc)) from exc


def _modules(
    path: Path, modules: list[dict[str, Any]], hidden: int, tokens: bool = False
) -> tuple[PoolingMode, bool, tuple[DenseLayer, ...], Splade | None]:
    """Sentence-transformers modules decide pooling, Dense layers and normalisation (or SPLADE
    pooling, for a SparseEncoder); a plain encoder gets mean pooling, as ST would give it. With
    `tokens` (a ColBERT), Dense modules project every token and no pooling may come before them."""
    pooling: PoolingMode = "mean"
    normalize = pooled = False
    dense: list[DenseLayer] = []
    splade = None
    for module in modules:
        kind = str(module.get("type", ""))
        folder = path / module.get("path", "")
        if kind.endswith("SpladePooling"):
            splade = read_splade(_read_json(folder / "config.json"), folder)
        elif kind.endswith("Pooling"):
            pooling, pooled = _pooling_mode(_read_json(folder / "config.json")), True
        elif kind.endswith("Dense"):
            if pooled is tokens or normalize:  # dense on tokens only for a ColBERT; never after Normalize
                raise ModelError(f"sentence-transformers module {kind} is only supported between Pooling and Normalize")
            dense.append(_dense(folder, dense[-1].out_features if dense else hidden, tokens))
        elif kind.endswith("Normalize"):
            normalize = True
        elif tokens and kind.endswith("MultiVectorMask"):
            continue  # its skiplist is read with the folder's other switches (common.late_interaction)
        elif kind and not kind.endswith("Transformer"):
            raise ModelError(f"sentence-transformers module {kind} is not supported")
    if splade is not None and (pooled or dense or normalize):
        raise ModelError(f"{path}: SPLADE pooling with Pooling, Dense or Normalize modules is not supported")
    return pooling, normalize, tuple(dense), splade


def _pooling_mode(conf: dict[str, Any]) -> PoolingMode:
    """One mode, from the boolean flags or the newer `pooling_mode` (a name, or a list of them)."""
    modes = [mode for key, mode in _POOLING_KEYS.items() if conf.get(key)]
    named = conf.get("pooling_mode")
    if named is not None:
        modes = named if isinstance(named, list) else [named]
    if len(modes) > 1:
        raise ModelError(f"combined pooling modes {modes} are not supported")
    if modes and modes[0] not in _POOLING_KEYS.values():
        raise ModelError(f"pooling mode {modes[0]!r} is not supported")
    return modes[0] if modes else "mean"


def _dense(folder: Path, fan_in: int, tokens: bool = False) -> DenseLayer:
    """A Dense module's config.json, checked: it must take the vectors before it, and its
    activation must be a torch.nn class the engine computes."""
    where = folder / "config.json"
    conf = _read_json(where)
    name = conf.get("activation_function", "torch.nn.modules.activation.Tanh")  # Dense's default
    if name not in DENSE_ACTIVATIONS:
        raise ModelError(f"Dense activation_function {name!r} in {where} is not supported")
    for key in ("module_input_name", "module_output_name"):
        if key in conf and conf[key] != ("token_embeddings" if tokens else "sentence_embedding"):
            raise ModelError(f"Dense {key} {conf[key]!r} in {where} is not supported")
    layer = DenseLayer(
        path=folder,
        in_features=int(conf["in_features"]),
        out_features=int(conf["out_features"]),
        bias=bool(conf.get("bias", True)),
        activation=DENSE_ACTIVATIONS[name],
        residual=bool(conf.get("use_residual", False)),
    )
    if (fan_in and layer.in_features != fan_in) or layer.out_features < 1:
        raise ModelError(f"Dense in {where} maps {layer.in_features} to {layer.out_features} features, after {fan_in}")
    return layer


def _max_len(path: Path, config: dict[str, Any], st_config: dict[str, Any], late: LateInteraction | None) -> int:
    if late is not None:  # a ColBERT's documents: at most document_length, within the positions it has
        return min(late.document_length, int(config.get("max_position_embeddings") or 512) - _position_offset(config))
    if st_config.get("max_seq_length"):
        return int(st_config["max_seq_length"])
    candidates = [int(config.get("max_position_embeddings") or 512) - _position_offset(config)]
    tok_max = _read_json(path / "tokenizer_config.json").get("model_max_length")
    if isinstance(tok_max, int | float) and 0 < tok_max < 1_000_000:
        candidates.append(int(tok_max))
    return min(candidates)


def _position_offset(config: dict[str, Any]) -> int:
    """Position embeddings RoBERTa-style models never use: their positions start after the padding
    index (514 rows take 512 tokens)."""
    if config.get("model_type") in ("roberta", "xlm-roberta"):
        pad = config.get("pad_token_id")
        return (1 if pad is None else int(pad)) + 1
    return 2 if config.get("model_type") == "mpnet" else 0
