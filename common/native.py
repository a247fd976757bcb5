"""Which folders a native engine family serves without transformers (no torch): the families by
model_type, and what their configs must say for the native module to compute what transformers does."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

Kind = Literal["embedding", "classification", "cross-encoder", "sparse", "multi-vector"]

# model_type -> (architectures served as embedding models, as classifiers) by a native engine
# family; engine.families.LOADERS has a loader for each.
NATIVE_FAMILIES: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    family: (frozenset({f"{name}Model", f"{name}ForMaskedLM", *extra}), frozenset({f"{name}ForSequenceClassification"}))
    for family, name, extra in (
        ("bert", "Bert", ["BertForPreTraining", "HF_ColBERT"]),  # HF_ColBERT: Stanford-NLP's ColBERT
        ("roberta", "Roberta", []),
        ("xlm-roberta", "XLMRoberta", []),
        ("mpnet", "MPNet", []),
        ("modernbert", "ModernBert", []),
    )
}
NATIVE_FAMILIES["gemma3_text"] = (frozenset({"Gemma3TextModel"}), frozenset())  # EmbeddingGemma: embeddings only
# NomicBERT and GTE (engine.families.nomic_gte): encoders only
NATIVE_FAMILIES["nomic_bert"] = (frozenset({"NomicBertModel", "NomicBertForMaskedLM"}), frozenset())
NATIVE_FAMILIES["gte"] = (frozenset({"GteModel", "GteForMaskedLM"}), frozenset())
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
# Qwen3-Embedding (its config names Qwen3ForCausalLM, its weights are Qwen3Model's) and, as a "classifier",
# a Qwen3ForCausalLM folder that common.causal_reranker makes a yes/no reranker
NATIVE_FAMILIES["qwen3"] = (frozenset({"Qwen3Model", "Qwen3ForCausalLM"}), frozenset({"Qwen3ForCausalLM"}))
# CLIP and SigLIP (engine.families.clip): both towers and their projections (common.vision reads the rest)
NATIVE_FAMILIES["clip"] = (frozenset({"CLIPModel"}), frozenset())
NATIVE_FAMILIES["siglip"] = (frozenset({"SiglipModel"}), frozenset())
# Masked-LM architectures a native family serves with SPLADE pooling (engine.heads.sparse): BERT's head.
SPARSE_NATIVE: dict[str, frozenset[str]] = {"bert": frozenset({"BertForMaskedLM"})}
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
    embedders, classifiers = family
    architecture = (config.get("architectures") or [None])[0]
    wanted: set[str | None] | frozenset[str] = classifiers
    if kind in ("embedding", "multi-vector"):
        wanted = {*embedders, None}
    elif kind == "sparse":
        wanted = SPARSE_NATIVE.get(str(config.get("model_type")), frozenset())
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
