"""PEFT LoRA adapters on the native models with a head after the encoder (engine/layers/lora.py): a SPLADE
model's weights are SparseEncoder + PEFT's (an adapter of the masked LM, its head included), a ColBERT
model's token vectors MultiVectorEncoder + PEFT's; a group mixing the base and an adapter gives each
input its own; a head saved whole is refused."""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
os.environ["DO_NOT_TRACK"] = "1"

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from common.folderjson import ModelError
from common.modelfolder import read_model_folder
from common.settings import Settings
from common.wire import Tokens
from engine.runtime.model import PoolingModel
from server.core.inputs import RequestContext
from server.core.services import ServedModel
from server.kinds import multi_vector
from tests.lora_adapters import BERT_TARGETS, build_adapter, multi_vector_reference, sparse_reference
from tests.unit.pools import pool as pool_of
from tests.vectors import same_entries

TEXTS = ["", "a", "Hello world, the warm pool model", "naïve café 🙂", "the warm pool engine keeps models loaded " * 20]
# the encoder's projections, and the masked-LM head's (it runs per token, as they do)
SPLADE_TARGETS = [*BERT_TARGETS, "transform.dense", "decoder"]


def splade_tokens(folder: Path, adapters: list[str]) -> list[Tokens]:
    info = read_model_folder(folder)
    encoded = pool_of(folder).encode_batch(TEXTS[: len(adapters)], truncate=info.max_model_len)
    return [t._replace(adapter=name) for t, name in zip(encoded, adapters, strict=True)]


@pytest.mark.parametrize("targets", [list(BERT_TARGETS), SPLADE_TARGETS], ids=["encoder", "encoder-and-head"])
def test_a_splade_adapters_weights_match_peft_on_sparse_encoder(
    splade_dir: Path, tmp_path: Path, targets: list[str]
) -> None:
    """PEFT's keys name the masked LM's modules (`bert.encoder…`, `cls.predictions…`): read through the
    checkpoint's names, the weights are SparseEncoder.encode's with the adapter within 1e-5, not the base's."""
    adapter = build_adapter(tmp_path / "adapter", splade_dir, seed=1, encoder="SparseEncoder", target_modules=targets)
    model = PoolingModel(read_model_folder(splade_dir), threads=1, adapters=[("domain", adapter)])
    got = model.forward(splade_tokens(splade_dir, ["domain"] * len(TEXTS)))
    expected = sparse_reference(splade_dir, adapter, TEXTS)
    same_entries(got, expected)
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)
    assert np.abs(sparse_reference(splade_dir, None, TEXTS) - expected).max() > 1e-2  # the update matters


def test_a_splade_group_mixing_the_base_and_an_adapter_gives_each_input_its_own(
    splade_dir: Path, tmp_path: Path
) -> None:
    adapter = build_adapter(tmp_path / "a", splade_dir, seed=2, encoder="SparseEncoder", target_modules=SPLADE_TARGETS)
    model = PoolingModel(read_model_folder(splade_dir), threads=1, adapters=[("a", adapter)])
    mixed = splade_tokens(splade_dir, ["", "a", "a", "", "a"])
    got = model.forward(mixed)
    for row, item in enumerate(mixed):
        np.testing.assert_allclose(got[row], model.forward([item])[0], atol=1e-5, rtol=0)
    np.testing.assert_allclose(got[[0, 3]], sparse_reference(splade_dir, None, [TEXTS[0], TEXTS[3]]), atol=1e-5, rtol=0)


def test_a_splade_adapter_saving_the_masked_lm_head_whole_is_refused(splade_dir: Path, tmp_path: Path) -> None:
    """A copy of a head that runs per token is not served (LoRA on its projections is)."""
    adapter = build_adapter(
        tmp_path / "saved", splade_dir, seed=3, encoder="SparseEncoder", modules_to_save=["transform.dense"]
    )
    with pytest.raises(ModelError, match=r"adapter 'saved'.*saves modules whole.*runs per token"):
        PoolingModel(read_model_folder(splade_dir), threads=1, adapters=[("saved", adapter)])


def colbert_vectors(model: PoolingModel, folder: Path, texts: list[str], role: Any, adapters: list[str]) -> list[Any]:
    """The engine's vectors the model scores, each input with its adapter ("" the base), as the HTTP side keeps them."""
    info = read_model_folder(folder)
    served = ServedModel("colbert", info, pool_of(folder, late=info.late), engine=None)  # type: ignore[arg-type]
    ctx = RequestContext(model=served, served={"colbert": served}, settings=Settings())
    tokens = [t._replace(adapter=a) for t, a in zip(multi_vector.tokenize(texts, ctx, role, -1), adapters, strict=True)]
    rows = model.forward_tokens(tokens)
    return [multi_vector.kept(r, t, role, ctx) for r, t in zip(rows, tokens, strict=True)]


@pytest.mark.parametrize("role", ["query", "document"])
def test_a_colbert_adapters_vectors_match_peft_on_the_multi_vector_encoder(
    colbert_dir: Path, tmp_path: Path, role: str
) -> None:
    """PEFT's keys name the encoder's modules (`encoder.layer…`, under the projection): each token's vector
    is MultiVectorEncoder's with the adapter within 1e-5, queries' and documents' alike."""
    adapter = build_adapter(tmp_path / "adapter", colbert_dir, seed=1, encoder="MultiVectorEncoder")
    model = PoolingModel(read_model_folder(colbert_dir), threads=1, adapters=[("domain", adapter)])
    texts = TEXTS[1:]
    got = colbert_vectors(model, colbert_dir, texts, role, ["domain"] * len(texts))
    expected = multi_vector_reference(colbert_dir, adapter, texts, role)
    assert [g.shape for g in got] == [e.shape for e in expected]
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(g, e, atol=1e-5, rtol=0)
    base = multi_vector_reference(colbert_dir, None, texts, role)
    assert max(np.abs(b - e).max() for b, e in zip(base, expected, strict=True)) > 1e-2  # the update matters


def test_a_colbert_group_mixing_the_base_and_an_adapter_gives_each_input_its_own(
    colbert_dir: Path, tmp_path: Path
) -> None:
    adapter = build_adapter(tmp_path / "a", colbert_dir, seed=2, encoder="MultiVectorEncoder", r=2)
    model = PoolingModel(read_model_folder(colbert_dir), threads=1, adapters=[("a", adapter)])
    texts, names = TEXTS[1:], ["a", "", "a", ""]
    got = colbert_vectors(model, colbert_dir, texts, "document", names)
    for g, text, name in zip(got, texts, names, strict=True):
        np.testing.assert_allclose(g, colbert_vectors(model, colbert_dir, [text], "document", [name])[0], atol=1e-5)
    for g, e in zip(got[1::2], multi_vector_reference(colbert_dir, None, texts[1::2], "document"), strict=True):
        np.testing.assert_allclose(g, e, atol=1e-5, rtol=0)
