"""The native families (BERT, RoBERTa, XLM-RoBERTa, MPNet, ModernBERT) and sentence-transformers' Dense modules give
sentence-transformers' and transformers' numbers: whole forward passes of tiny random models in-process,
tokenized as the server tokenizes, and the pieces in which the families differ."""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
os.environ["DO_NOT_TRACK"] = "1"

import functools
import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from common.modelfolder import (
    DENSE_ACTIVATIONS,
    NATIVE_ACTIVATIONS,
    NATIVE_FAMILIES,
    DenseLayer,
    ModelError,
    read_model_folder,
)
from common.wire import Tokens
from engine import dense
from engine.device import Placement
from engine.families import LOADERS
from engine.layers import ACTIVATIONS
from engine.model import PoolingModel
from engine.modernbert import layer_types, rope_theta
from engine.mpnet import relative_position_bucket
from engine.packed import Packed, offset_positions
from server.outputs import activate, normalize
from server.tokenizer import TokenizerPool
from tests.tiny_models import MAX_TOKENS, TINY, TinyFolders

EMBEDDERS = [
    "xlm-roberta",
    "roberta",
    "mpnet",
    "bert",
    "modernbert",
    "distilbert",
]  # distilbert: the transformers fallback
NATIVE = [name for name in TINY if name != "distilbert"]
TEXTS = [
    "",
    "a",
    "Hello world, the warm pool model",
    "naïve café 日本語 🙂 Привет мир, and ∮ ☃ 🚀 the tokenizers do not know",
    "a literal <pad> in a text: RoBERTa and MPNet give it the padding position",
    "the warm pool engine keeps models loaded " * 20,  # far past MAX_TOKENS: cut there
]
PAIRS = [
    ("what is a warm pool", "Hello world, the warm pool model"),
    ("日本語", "naïve café " * 40),  # cut at MAX_TOKENS
    ("", "x"),
    ("Привет мир", "a literal <pad> here"),
]

Engines = Callable[[str], PoolingModel]


@pytest.fixture(scope="module")
def engines(tiny: TinyFolders) -> Engines:
    """The engine's model of a TINY folder, loaded once per module."""
    return functools.cache(lambda name: PoolingModel(read_model_folder(tiny[name]), threads=1))


def server_tokens(folder: Path, inputs: list[str] | list[tuple[str, str]]) -> list[Tokens]:
    """The inputs as the server tokenizes them, cut at the model's maximum."""
    pool, limit = TokenizerPool(folder), read_model_folder(folder).max_model_len
    if isinstance(inputs[0], tuple):
        return pool.encode_pairs(inputs, truncate=limit)  # type: ignore[arg-type]
    return pool.encode_batch(inputs, truncate=limit)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", list(TINY))
def test_folders_of_a_native_family_are_served_natively(tiny: TinyFolders, name: str) -> None:
    """Every tiny folder of bert, roberta, xlm-roberta and mpnet, as transformers and sentence-transformers
    save them, is read as native; the DistilBERT one is left to transformers."""
    assert read_model_folder(tiny[name]).native is (name in NATIVE)


@pytest.mark.parametrize("name", EMBEDDERS)
def test_embeddings_match_sentence_transformers(tiny: TinyFolders, engines: Engines, name: str) -> None:
    """The engine's vectors, normalised where the folder says so, are SentenceTransformer.encode's within
    1e-5: every pooling mode the folders use, their Dense modules, texts empty, unicode, with a literal pad
    token, and one cut at the model's maximum length."""
    from sentence_transformers import SentenceTransformer

    model = engines(name)
    tokens = server_tokens(tiny[name], TEXTS)
    assert len(tokens[-1].input_ids) == model.info.max_model_len == MAX_TOKENS  # the long text was cut
    got = model.forward(tokens)
    got = normalize(got) if model.info.normalize else got
    expected = SentenceTransformer(str(tiny[name]), device="cpu").encode(TEXTS)
    assert got.shape == expected.shape == (len(TEXTS), model.info.dimensions)
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", NATIVE)
def test_a_packed_batch_gives_the_rows_of_single_forwards(tiny: TinyFolders, engines: Engines, name: str) -> None:
    """Inputs of mixed lengths packed into one batch give, row for row, what each gives alone."""
    model = engines(name)
    tokens = server_tokens(tiny[name], PAIRS if model.info.kind != "embedding" else TEXTS)
    together = model.forward(tokens)
    alone = np.concatenate([model.forward([item]) for item in tokens])
    np.testing.assert_allclose(together, alone, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", ["xlm-roberta-reranker", "modernbert-reranker"])
def test_reranker_scores_match_cross_encoder(tiny: TinyFolders, engines: Engines, name: str) -> None:
    """An XLM-RoBERTa and a ModernBERT (mean-pooled) sequence classifier with one label score pairs as
    CrossEncoder.predict does (its sigmoid), within 1e-5, a pair cut at the model's maximum length included."""
    from sentence_transformers import CrossEncoder

    folder = tiny[name]
    tokens = server_tokens(folder, PAIRS)
    assert max(len(t.input_ids) for t in tokens) == MAX_TOKENS
    got = activate(engines(name).forward(tokens))[:, 0]
    expected = CrossEncoder(str(folder), device="cpu").predict(PAIRS)
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)


def test_classifier_logits_match_transformers(tiny: TinyFolders, engines: Engines) -> None:
    """An MPNet sequence classifier's logits are transformers' within 1e-5."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    folder = tiny["mpnet-classifier"]
    got = engines("mpnet-classifier").forward(server_tokens(folder, TEXTS))
    tokenizer = AutoTokenizer.from_pretrained(folder)
    reference = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    with torch.inference_mode():
        batch = tokenizer(TEXTS, padding=True, truncation=True, max_length=MAX_TOKENS, return_tensors="pt")
        expected = reference(**batch).logits.numpy()
    assert got.shape == (len(TEXTS), 3)
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", ["xlm-roberta", "mpnet", "bert", "modernbert", "xlm-roberta-reranker"])
def test_half_precision_follows_float32(tiny: TinyFolders, engines: Engines, name: str) -> None:
    """In bfloat16 (as on a GPU, here on the CPU) every family runs, with its attention bias and Dense
    modules in that dtype, and stays near its float32 outputs."""
    info = read_model_folder(tiny[name])
    half = PoolingModel(info, threads=1, placement=Placement(torch.device("cpu"), torch.bfloat16))
    tokens = server_tokens(tiny[name], PAIRS if info.kind != "embedding" else TEXTS)
    np.testing.assert_allclose(half.forward(tokens), engines(name).forward(tokens), atol=0.1, rtol=0)


def test_offset_positions_match_transformers() -> None:
    """RoBERTa's position ids on the packed layout are transformers' create_position_ids_from_input_ids,
    input by input, padding ids inside an input included."""
    from transformers.models.xlm_roberta.modeling_xlm_roberta import XLMRobertaEmbeddings

    gen = torch.Generator().manual_seed(3)
    inputs = [torch.randint(0, 4, (n,), generator=gen) for n in (1, 9, 4, 17)]  # ids 0-3: pad (1) is frequent
    got = offset_positions(Packed.of([Tokens(ids.tolist()) for ids in inputs]), padding_idx=1)
    expected = torch.cat([XLMRobertaEmbeddings.create_position_ids_from_input_ids(ids[None], 1)[0] for ids in inputs])
    assert torch.equal(got, expected)


def test_relative_position_buckets_match_transformers() -> None:
    """MPNet's buckets of relative distance are transformers' for distances within and past 128 both ways."""
    from transformers.models.mpnet.modeling_mpnet import MPNetEncoder

    relative = torch.arange(-600, 600)
    assert torch.equal(relative_position_bucket(relative), MPNetEncoder.relative_position_bucket(relative))


@pytest.mark.parametrize(
    "old",
    [
        {"num_hidden_layers": 7},
        {"num_hidden_layers": 5, "global_attn_every_n_layers": 2, "global_rope_theta": 8e4, "local_rope_theta": 5e3},
    ],
    ids=["defaults", "named"],
)
def test_modernbert_configs_of_the_older_format_read_as_transformers_reads_them(old: dict[str, Any]) -> None:
    """Configs on the hub predate layer_types and rope_parameters (global_attn_every_n_layers,
    global/local_rope_theta, or nothing): each layer's attention and rotary base are transformers'."""
    from transformers import ModernBertConfig

    reference = ModernBertConfig(**old)
    assert layer_types(old) == reference.layer_types
    for kind in ("full_attention", "sliding_attention"):
        assert rope_theta(old, kind) == reference.rope_parameters[kind]["rope_theta"]


def test_every_native_family_has_a_loader() -> None:
    """The model types common.modelfolder calls native are exactly those engine.families loads."""
    assert set(LOADERS) == set(NATIVE_FAMILIES)


@pytest.mark.parametrize("name", sorted(NATIVE_ACTIVATIONS))
def test_hidden_activations_match_transformers(name: str) -> None:
    """Each hidden_act a native family accepts computes transformers' ACT2FN function within 1e-6."""
    from transformers.activations import ACT2FN

    x = torch.linspace(-6, 6, 1001)
    torch.testing.assert_close(ACTIVATIONS[name](x), ACT2FN[name](x), atol=1e-6, rtol=0)


@pytest.mark.parametrize("class_path", sorted(DENSE_ACTIVATIONS))
def test_dense_activations_match_their_torch_modules(class_path: str) -> None:
    """Each Dense activation_function accepted computes what its torch.nn class computes."""
    module, _, name = class_path.rpartition(".")
    x = torch.linspace(-6, 6, 1001)
    expected = getattr(importlib.import_module(module), name)()(x)
    torch.testing.assert_close(dense.ACTIVATIONS[DENSE_ACTIVATIONS[class_path]](x), expected, atol=0, rtol=0)


def test_a_dense_module_without_weights_is_a_model_error_naming_its_folder(tmp_path: Path) -> None:
    """A Dense module whose folder has neither weights file fails the load with a ModelError naming it."""
    with pytest.raises(ModelError, match="Dense module") as caught:
        dense.load((DenseLayer(path=tmp_path, in_features=4, out_features=2),), torch.device("cpu"), torch.float32)
    assert str(tmp_path) in str(caught.value)
