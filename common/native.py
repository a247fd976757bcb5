"""Which folders a native engine family serves without transformers (no torch): the families by
model_type (architectures, and the engine module that loads them), and what their configs must say for
the native module to compute what transformers does."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, NamedTuple

Kind = Literal["embedding", "classification", "cross-encoder", "sparse", "multi-vector"]


class Family(NamedTuple):
    """A model_type a native engine module serves, and the first architectures it serves it for."""

    module: str  # the engine module that loads it (its `load`), dotted: engine.families imports it
    embedders: frozenset[str]  # served as embedding and multi-vector models
    classifiers: frozenset[str] = frozenset()  # served as classifiers and cross-encoders
    sparse: frozenset[str] = frozenset()  # masked LMs served with SPLADE pooling (engine.heads.sparse)


def _encoder(module: str, name: str, *extra: str, sparse: frozenset[str] = frozenset()) -> Family:
    """A BERT-style encoder's: its base model and masked LM as embedders, its sequence classifier."""
    embedders = frozenset({f"{name}Model", f"{name}ForMaskedLM", *extra})
    return Family(f"engine.families.{module}", embedders, frozenset({f"{name}ForSequenceClassification"}), sparse)


# The one registry of native families: model_type -> its module and architectures. The HTTP side reads it
# (which folders are native), engine.families loads by it; a family module serves one or more model_types.
NATIVE_FAMILIES: dict[str, Family] = {
    # HF_ColBERT: Stanford-NLP's ColBERT; SPLADE on BERT's masked-LM head
    "bert": _encoder("bert", "Bert", "BertForPreTraining", "HF_ColBERT", sparse=frozenset({"BertForMaskedLM"})),
    "roberta": _encoder("xlm_roberta", "Roberta"),
    "xlm-roberta": _encoder("xlm_roberta", "XLMRoberta"),
    "mpnet": _encoder("mpnet", "MPNet"),
    "modernbert": _encoder("modernbert", "ModernBert"),
    # EmbeddingGemma: embeddings only
    "gemma3_text": Family("engine.families.gemma3", frozenset({"Gemma3TextModel"})),
    # NomicBERT and GTE, one module: encoders only
    "nomic_bert": Family("engine.families.nomic_gte", frozenset({"NomicBertModel", "NomicBertForMaskedLM"})),
    "gte": Family("engine.families.nomic_gte", frozenset({"GteModel", "GteForMaskedLM"})),
    # Qwen3-Embedding (its config names Qwen3ForCausalLM, its weights are Qwen3Model's) and, as a "classifier",
    # a Qwen3ForCausalLM folder that common.causal_reranker makes a yes/no reranker
    "qwen3": Family(
        "engine.families.qwen3", frozenset({"Qwen3Model", "Qwen3ForCausalLM"}), frozenset({"Qwen3ForCausalLM"})
    ),
    # CLIP and SigLIP: both towers and their projections (common.vision reads the rest)
    "clip": Family("engine.families.clip", frozenset({"CLIPModel"})),
    "siglip": Family("engine.families.clip", frozenset({"SiglipModel"})),
}

# The original nomic-bert config's switches (real nomic-embed folders carry them), at the values
# engine.families.nomic_gte computes: absent, or these.
NOMIC_SWITCHES: dict[str, Any] = {
    "prenorm": False,
    "parallel_block": False,
    "causal": False,
    "use_rms_norm": False,
    "activation_function": "swiglu",
    "qkv_proj_bias": False,
    "mlp_fc1_bias": False,
    "mlp_fc2_bias": False,
    "rotary_emb_fraction": 1.0,
    "rotary_emb_interleaved": False,
    "rotary_emb_scale_base": None,
    "rotary_scaling_factor": None,
}
# What a family's config must say besides for its native module to compute what transformers does.
NATIVE_ONLY_IF: dict[str, Callable[[dict[str, Any]], bool]] = {
    # bidirectional (EmbeddingGemma): a causal Gemma 3 is left to transformers, as is attention
    # logit softcapping, which engine.families.gemma3 does not compute
    "gemma3_text": lambda c: c.get("use_bidirectional_attention") is True and c.get("attn_logit_softcapping") is None,
    "qwen3": lambda c: not c.get("use_sliding_window"),  # engine.families.qwen3 computes full attention only
    "nomic_bert": lambda c: all(c.get(key, value) == value for key, value in NOMIC_SWITCHES.items()),
}
# config.json hidden_act (ModernBERT: hidden_activation, classifier_activation) values the native
# families compute (engine.layers.encoder.ACTIVATIONS).
NATIVE_ACTIVATIONS = frozenset({"gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu", "swish"})


def native_model(config: dict[str, Any], kind: Kind, safetensors: bool) -> bool:
    """A model of a native family (absolute or plain rotary positions, known activations) in
    safetensors, one file or shards: no transformers needed."""
    family = NATIVE_FAMILIES.get(str(config.get("model_type")))
    if family is None:
        return False
    architecture = (config.get("architectures") or [None])[0]
    wanted: set[str | None] | frozenset[str] = family.classifiers
    if kind in ("embedding", "multi-vector"):
        wanted = {*family.embedders, None}
    elif kind == "sparse":
        wanted = family.sparse
    activations = {config.get(key, "gelu") for key in ("hidden_act", "hidden_activation", "classifier_activation")}
    rope = config.get("rope_parameters") or {}  # flat, or one dict per layer type (ModernBERT)
    return (
        architecture in wanted
        and config.get("position_embedding_type", "absolute") == "absolute"
        and activations <= NATIVE_ACTIVATIONS
        and not config.get("rope_scaling")
        and all(p.get("rope_type", "default") == "default" for p in [rope, *rope.values()] if isinstance(p, dict))
        and not config.get("is_decoder", False)
        and NATIVE_ONLY_IF.get(str(config.get("model_type")), lambda c: True)(config)
        and safetensors
    )
