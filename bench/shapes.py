"""Random-weight sentence-transformers folders shaped like models people deploy, for benchmarks
(never committed: generated into a temp dir). Each uses the embedded model's WordPiece tokenizer, so
every family sees the same tokens and only the architecture's cost differs.
Usage: .venv/bin/python -m bench.shapes DEST [bert-base xlm-roberta-base qwen3-0.6b splade-bert-base
         colbert-bert-base m3-xlm-roberta-base]
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from bench.common import MODEL

BASE = {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072}
SHAPES: dict[str, tuple[str, dict[str, Any], str]] = {
    "bert-base": ("Bert", BASE, "mean"),
    "splade-bert-base": ("Bert", BASE, "splade"),  # BertForMaskedLM under SpladePooling (max)
    "colbert-bert-base": ("Bert", BASE, "colbert"),  # PyLate's layout: a 768 -> 128 token projection
    "xlm-roberta-base": ("XLMRoberta", {**BASE, "type_vocab_size": 1, "max_position_embeddings": 514}, "cls"),
    # bge-m3's layout (FlagEmbedding's sparse_linear.pt and colbert_linear.pt beside it), base-sized
    "m3-xlm-roberta-base": ("XLMRoberta", {**BASE, "type_vocab_size": 1, "max_position_embeddings": 514}, "m3"),
    "qwen3-0.6b": (
        "Qwen3",
        {
            "hidden_size": 1024,
            "num_hidden_layers": 28,
            "num_attention_heads": 16,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "intermediate_size": 3072,
            "max_position_embeddings": 32768,
        },
        "lasttoken",
    ),
}


def build(dest: Path, shape: str) -> Path:
    """SHAPES[shape] as a sentence-transformers folder at dest/shape: encoder, pooling, Normalize."""
    import torch
    import transformers
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    from tests.tiny_models import save_with_tokenizer

    stem, config, pooling = SHAPES[shape]
    torch.manual_seed(0)
    head = "ForMaskedLM" if pooling == "splade" else "Model"
    with torch.device("meta"):  # sized first, then materialised once: no second random init
        model = getattr(transformers, f"{stem}{head}")(
            getattr(transformers, f"{stem}Config")(vocab_size=30522, pad_token_id=0, **config)
        )
    model = model.to_empty(device="cpu")
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0, 0.02)
        if pooling == "splade":  # ~100 weights an input, as trained SPLADE models have, not half the vocabulary
            model.cls.predictions.bias.fill_(-2.0)
    encoder = save_with_tokenizer(model, dest / f"{shape}-hf", MODEL)
    if pooling == "splade":
        return _splade(encoder, dest / shape)
    if pooling == "colbert":
        return _colbert(encoder, dest / shape)
    transformer = Transformer(str(encoder), max_seq_length=256)
    width = transformer.get_embedding_dimension()
    folder = dest / shape
    mode = "cls" if pooling == "m3" else pooling
    SentenceTransformer(modules=[transformer, Pooling(width, pooling_mode=mode), Normalize()], device="cpu").save(
        str(folder)
    )
    if pooling == "m3":
        torch.save({"weight": torch.randn(1, width) * 0.02, "bias": torch.zeros(1)}, folder / "sparse_linear.pt")
        torch.save(
            {"weight": torch.randn(width, width) * 0.02, "bias": torch.zeros(width)}, folder / "colbert_linear.pt"
        )
    return folder


def _colbert(encoder: Path, folder: Path) -> Path:
    """PyLate's folder layout around `encoder` (as tests.tiny_kinds.build_colbert writes it)."""
    import shutil

    from tests.tiny_kinds import write_pylate_files

    shutil.copytree(encoder, folder)
    return write_pylate_files(folder, hidden=768, dims=128, query_length=32, document_length=256)


def _splade(encoder: Path, folder: Path) -> Path:
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import MLMTransformer, SpladePooling

    modules = [MLMTransformer(str(encoder), max_seq_length=256), SpladePooling("max")]
    SparseEncoder(modules=modules, device="cpu").save(str(folder))
    return folder


if __name__ == "__main__":
    for name in sys.argv[2:] or list(SHAPES):
        print(build(Path(sys.argv[1]), name))
