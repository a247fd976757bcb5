"""What a model folder is, read from its config files alone (no torch): kind, pooling, lengths, labels."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from common.causal_reranker import PairTemplate, reranker_template, score_token_ids
from common.folderjson import ModelError, modules_json, read_json
from common.late_interaction import (
    LateInteraction,
    LateInteractionError,
    is_pylate,
    read_late_interaction,
    read_multi_vector_encoder,
    read_stanford,
)
from common.m3 import M3Heads, read_m3
from common.modelfiles import safetensors_weights
from common.native import Kind, native_model
from common.splade import Routed, Splade, SpladeError, read_router, read_splade
from common.st_modules import DenseLayer, PoolingMode, read_modules
from common.vision import Vision, VisionError, clip_module, dimensions, is_dual_encoder, read_vision, text_length

# What a model answers: the key of the server's output kinds (server/kinds/), one module each
Output = Literal[
    "dense", "sparse", "inference-free-sparse", "multi-vector", "m3", "image-text", "labels", "cross-encoder"
]


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
    def output(self) -> Output:
        """The output kind, from what the folder holds: the one key requests are answered by."""
        if self.vision is not None:
            return "image-text"
        if self.kind == "sparse":
            return "sparse" if self.idf is None else "inference-free-sparse"
        if self.kind == "embedding":
            return "dense" if self.m3 is None else "m3"
        if self.kind == "multi-vector":
            return "multi-vector"
        return "cross-encoder" if self.kind == "cross-encoder" else "labels"

    @property
    def dimensions(self) -> int:
        """Length of the vector the engine returns per input."""
        if self.kind == "sparse":
            return self.vocab_size
        if self.kind not in ("embedding", "multi-vector"):
            return max(len(self.id2label), 1)
        return self.dense[-1].out_features if self.dense else self.hidden_size


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
    top_modules = modules_json(path)
    wrapped = clip_module(path, top_modules)
    if wrapped is not None:  # sentence-transformers' CLIPModel module: the CLIP folder it wraps is the model
        return _read(wrapped)
    routed = _router(path, top_modules)
    if routed is not None:  # the Router's document encoder is the model; the root has no config.json
        encoder = _read(routed.encoder)
        pooled = read_splade(read_json(routed.pooling / "config.json"), routed.pooling)
        if not encoder.architecture.endswith("ForMaskedLM"):
            raise ModelError(
                f"{path}: SPLADE pools a masked-LM head's logits, the Router's encoder is {encoder.architecture}"
            )
        native = native_model(encoder.config, "sparse", safetensors_weights(encoder.path))
        return replace(encoder, kind="sparse", splade=pooled, native=native, idf=routed.idf)
    config = read_json(path / "config.json")
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
    modules = modules_json(path)
    st_config = read_json(path / "sentence_bert_config.json")
    pair_template = reranker_template(config, architecture, has_modules=(path / "modules.json").is_file())
    score_tokens = None if pair_template is None else _score_tokens(path, architecture)
    kind: Kind = _kind(architecture, config) if pair_template is None else "cross-encoder"
    hidden = int(config.get("hidden_size") or config.get("d_model") or config.get("dim") or config.get("n_embd") or 0)
    late, projection = _late_interaction(path, architecture) if kind == "embedding" else (None, ())
    pooling, normalize, dense, splade = read_modules(path, modules, hidden, tokens=late is not None)
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
    st = read_json(where)
    prompts = st.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()):
        raise ModelError(f"'prompts' in {where} must map prompt names to prompt texts")
    default = st.get("default_prompt_name")
    if default is not None and default not in prompts:
        raise ModelError(f"default_prompt_name {default!r} in {where} is not one of its prompts {sorted(prompts)}")
    return prompts, default


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
        return read_router(path, modules, read_json)
    except SpladeError as exc:
        raise ModelError(str(exc)) from exc


def _late_interaction(path: Path, architecture: str) -> tuple[LateInteraction | None, tuple[DenseLayer, ...]]:
    """A ColBERT's switches: PyLate's, where config_sentence_transformers.json has them, or a
    Stanford-NLP folder's (HF_ColBERT), with the projection its checkpoint holds as a Dense layer."""
    try:
        if architecture == "HF_ColBERT":
            late, (out, fan_in) = read_stanford(path)
            return late, (DenseLayer(path, fan_in, out, bias=False, activation="Identity"),)
        st = read_json(path / "config_sentence_transformers.json")
        if st.get("model_type") == "MultiVectorEncoder":
            modules = modules_json(path)
            mask = next((m for m in modules if str(m.get("type", "")).endswith("MultiVectorMask")), None)
            return read_multi_vector_encoder(
                st,
                read_json(path / "sentence_bert_config.json"),
                {} if mask is None else read_json(path / str(mask.get("path", "")) / "config.json"),
                _max_len(path, read_json(path / "config.json"), read_json(path / "sentence_bert_config.json"), None),
                path,
            ), ()
        return (read_late_interaction(st, path) if is_pylate(st) else None), ()
    except LateInteractionError as exc:
        raise ModelError(str(exc)) from exc


def _max_len(path: Path, config: dict[str, Any], st_config: dict[str, Any], late: LateInteraction | None) -> int:
    if late is not None:  # a ColBERT's documents: at most document_length, within the positions it has
        return min(late.document_length, int(config.get("max_position_embeddings") or 512) - _position_offset(config))
    if st_config.get("max_seq_length"):
        return int(st_config["max_seq_length"])
    candidates = [int(config.get("max_position_embeddings") or 512) - _position_offset(config)]
    tok_max = read_json(path / "tokenizer_config.json").get("model_max_length")
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
