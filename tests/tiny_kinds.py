"""Tiny random-weight folders of the other output kinds, built on tests/tiny_models.py's families:
a classifier, SPLADE and inference-free sparse encoders, ColBERT (PyLate's, sentence-transformers' and
Stanford's layouts) and bge-m3."""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any

from tests.tiny_models import MAX_TOKENS, SMALL, Tiny, build_hf, build_sentence_transformer, jitter, save_with_tokenizer


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


def build_splade(dest: Path, tokenizer_from: Path, family: str = "bert", **pooling: str) -> Path:
    """A SparseEncoder folder: a tiny random masked-LM (BERT, served natively; DistilBERT, through
    transformers) under SpladePooling(**pooling), with the embedded model's tokenizer."""
    import torch
    import transformers
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import MLMTransformer, SpladePooling

    torch.manual_seed(11)
    if family == "bert":
        config: Any = transformers.BertConfig(**{"vocab_size": 30522, "intermediate_size": 64, **SMALL})
        model: Any = transformers.BertForMaskedLM(config)
    else:
        config = transformers.DistilBertConfig(vocab_size=30522, dim=32, n_layers=2, n_heads=2, hidden_dim=64)
        model = transformers.DistilBertForMaskedLM(config)
    # wider than jitter's: the logits must be positive for some entries and not for most
    save_with_tokenizer(jitter(model, 11), dest.with_name(f"{dest.name}-hf"), tokenizer_from)
    mlm = MLMTransformer(str(dest.with_name(f"{dest.name}-hf")), max_seq_length=MAX_TOKENS)
    SparseEncoder(modules=[mlm, SpladePooling(**pooling)], device="cpu").save(str(dest), create_model_card=False)
    return dest


def build_colbert(dest: Path, tokenizer_from: Path, **late: Any) -> Path:
    """A ColBERT folder as PyLate saves one: a tiny random BERT, a 32 -> 16 token projection
    (1_Dense, no bias), and PyLate's switches in config_sentence_transformers.json (`late`
    overrides them). Written by hand: PyLate pins an older sentence-transformers than the one
    here, whose MultiVectorEncoder loads PyLate's folders and is the reference."""
    import torch
    import transformers

    torch.manual_seed(13)
    config = transformers.BertConfig(**{"vocab_size": 30522, "intermediate_size": 64, **SMALL})
    save_with_tokenizer(jitter(transformers.BertModel(config), 13), dest, tokenizer_from)
    return write_pylate_files(dest, hidden=32, dims=16, query_length=12, document_length=24, **late)


def write_pylate_files(
    dest: Path, hidden: int, dims: int, query_length: int, document_length: int, **late: Any
) -> Path:
    """PyLate's files beside the encoder in `dest`: modules.json (Transformer, Dense), the random
    hidden -> dims projection in 1_Dense, and its switches in config_sentence_transformers.json."""
    import json

    import torch
    from safetensors.torch import save_file

    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Dense", "type": "pylate.models.Dense.Dense"},
    ]
    settings = {
        "model_type": "ColBERT",
        "prompts": {},
        "default_prompt_name": None,
        "similarity_fn_name": "MaxSim",
        "query_prefix": "[unused0]",
        "document_prefix": "[unused1]",
        "query_length": query_length,
        "document_length": document_length,
        "attend_to_expansion_tokens": False,
        "skiplist_words": list(string.punctuation),
        "do_query_expansion": True,
        **late,
    }
    (dest / "modules.json").write_text(json.dumps(modules))
    sentence_bert = {"max_seq_length": document_length - 1, "do_lower_case": False}
    (dest / "sentence_bert_config.json").write_text(json.dumps(sentence_bert))
    (dest / "config_sentence_transformers.json").write_text(json.dumps(settings))
    (dest / "1_Dense").mkdir()
    dense = {"in_features": hidden, "out_features": dims, "bias": False}
    (dest / "1_Dense" / "config.json").write_text(
        json.dumps({**dense, "activation_function": "torch.nn.modules.linear.Identity", "use_residual": False})
    )
    weight = torch.randn(dims, hidden, generator=torch.Generator().manual_seed(13)) * (0.3 if hidden < 100 else 0.03)
    save_file({"linear.weight": weight}, str(dest / "1_Dense" / "model.safetensors"))
    return dest


def build_multi_vector_encoder(dest: Path, tokenizer_from: Path) -> Path:
    """build_colbert's model as sentence-transformers' MultiVectorEncoder saves it: the markers as
    its `query` and `document` prompts, the lengths and query expansion in the Transformer's config,
    a MultiVectorMask module with the skiplist."""
    from sentence_transformers import MultiVectorEncoder

    MultiVectorEncoder(str(build_colbert(dest.with_name(f"{dest.name}-pylate"), tokenizer_from)), device="cpu").save(
        str(dest), create_model_card=False
    )
    return dest


def build_stanford_colbert(dest: Path, tokenizer_from: Path) -> Path:
    """A ColBERT folder as Stanford-NLP's colbert-ir saves one: config architectures HF_ColBERT, the
    encoder's weights under `bert.` with the projection beside them as `linear.weight` in one
    model.safetensors, and artifact.metadata with its switches."""
    import json

    import torch
    import transformers
    from safetensors.torch import save_file

    torch.manual_seed(19)
    config = transformers.BertConfig(**{"vocab_size": 30522, "intermediate_size": 64, **SMALL})
    encoder = jitter(transformers.BertModel(config), 19)
    save_with_tokenizer(encoder, dest, tokenizer_from)
    weights = {f"bert.{key}": tensor.contiguous() for key, tensor in encoder.state_dict().items()}
    weights["linear.weight"] = torch.randn(8, 32, generator=torch.Generator().manual_seed(19)) * 0.3
    save_file(weights, str(dest / "model.safetensors"))
    settings = json.loads((dest / "config.json").read_text())
    (dest / "config.json").write_text(json.dumps({**settings, "architectures": ["HF_ColBERT"]}))
    meta = {"query_token_id": "[unused0]", "doc_token_id": "[unused1]", "query_maxlen": 10, "doc_maxlen": 20}
    (dest / "artifact.metadata").write_text(
        json.dumps({**meta, "attend_to_mask_tokens": False, "mask_punctuation": True})
    )
    return dest


def build_m3(dest: Path, model_dir: Path) -> Path:
    """A bge-m3 folder as FlagEmbedding saves one: a tiny XLM-R encoder (CLS pooling, normalised)
    with sparse_linear.pt (32 -> 1) and colbert_linear.pt (32 -> 32) beside it, as torch pickles.
    The sparse head's bias is raised so that most tokens keep a weight above 0, as trained ones do."""
    import torch

    spec = Tiny("xlm-roberta", pooling="cls", normalize=True)
    torch.manual_seed(17)
    build_sentence_transformer(dest, build_hf(dest.with_name(f"{dest.name}-hf"), spec, model_dir, 17), spec)
    gen = torch.Generator().manual_seed(17)
    sparse = {"weight": torch.randn(1, 32, generator=gen) * 0.3, "bias": torch.tensor([0.6])}
    colbert = {"weight": torch.randn(32, 32, generator=gen) * 0.3, "bias": torch.randn(32, generator=gen) * 0.1}
    torch.save(sparse, dest / "sparse_linear.pt")
    torch.save(colbert, dest / "colbert_linear.pt")
    return dest


def build_inference_free(dest: Path, tokenizer_from: Path) -> Path:
    """An inference-free SparseEncoder (OpenSearch's layout): a Router whose document route is
    build_splade's masked LM under SpladePooling and whose query route is a SparseStaticEmbedding
    of random per-token weights."""
    import torch
    from sentence_transformers import SparseEncoder
    from sentence_transformers.base.modules import Router
    from sentence_transformers.sparse_encoder.modules import MLMTransformer, SparseStaticEmbedding, SpladePooling

    build_splade(dest.with_name(f"{dest.name}-splade"), tokenizer_from)
    mlm = MLMTransformer(str(dest.with_name(f"{dest.name}-splade-hf")), max_seq_length=MAX_TOKENS)
    idf = torch.rand(mlm.tokenizer.vocab_size, generator=torch.Generator().manual_seed(23)) * 3
    static = SparseStaticEmbedding(mlm.tokenizer, weight=idf, frozen=True)
    router = Router.for_query_document(query_modules=[static], document_modules=[mlm, SpladePooling("max")])
    SparseEncoder(modules=[router], device="cpu").save(str(dest), create_model_card=False)
    return dest
