"""Pooling gives sentence-transformers' vectors: the arithmetic on random tensors, padded and packed,
and the whole forward pass of the real model in-process, for every pooling mode."""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
os.environ["DO_NOT_TRACK"] = "1"

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer

from common.modelfolder import read_model_folder
from common.st_modules import PoolingMode
from common.wire import Tokens
from engine.heads.pooling import pool, pool_packed
from engine.layers.packed import Packed
from engine.runtime.model import PoolingModel
from server.core.outputs import normalize
from tests.checkpoints import linked_copy

MODES: tuple[PoolingMode, ...] = ("mean", "cls", "max", "lasttoken", "weightedmean", "mean_sqrt_len_tokens")
POOLING_KEYS: dict[PoolingMode, str] = {
    "mean": "pooling_mode_mean_tokens",
    "cls": "pooling_mode_cls_token",
    "max": "pooling_mode_max_tokens",
    "lasttoken": "pooling_mode_lasttoken",
    "weightedmean": "pooling_mode_weightedmean_tokens",
    "mean_sqrt_len_tokens": "pooling_mode_mean_sqrt_len_tokens",
}
LENGTHS = [1, 7, 3, 12, 1, 5]  # varied, with length 1 (first and last token are the same) twice
DIM = 16
TEXTS = [
    "",
    "a",
    "short text",
    "a somewhat longer sentence to pool over, with punctuation and numbers: 42, 3.14!",
    "mid length text here",
    "Warm pools keep engine processes loaded so that the first request after a restart does not pay for "
    "importing torch, reading the weights from disk and the first forward pass's allocations.",
]


def st_pooling(dim: int, mode: PoolingMode) -> torch.nn.Module:
    """sentence-transformers' Pooling module (its 6.x home, or `models` in older releases)."""
    try:
        from sentence_transformers.sentence_transformer.modules import Pooling
    except ImportError:  # sentence-transformers < 6
        from sentence_transformers.models import Pooling  # type: ignore[no-redef]
    return Pooling(dim, pooling_mode=mode)  # type: ignore[no-any-return]


def st_pool(hidden: torch.Tensor, mask: torch.Tensor, mode: PoolingMode) -> torch.Tensor:
    """sentence-transformers' pooled vectors for a padded batch (on copies: older releases edit in place)."""
    features = {"token_embeddings": hidden.clone(), "attention_mask": mask.clone()}
    return st_pooling(hidden.shape[-1], mode)(features)["sentence_embedding"]  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def batch() -> tuple[list[Tokens], torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row tokens, and the same rows as a padded batch (hidden [B, L, H], mask [B, L]) and packed ([T, H]).

    Padding cells hold large values, so arithmetic that lets them in cannot agree with sentence-transformers.
    """
    gen = torch.Generator().manual_seed(1234)
    tokens = [Tokens(torch.randint(1, 1000, (n,), generator=gen).tolist()) for n in LENGTHS]
    longest = max(LENGTHS)
    hidden = 100.0 + torch.rand((len(LENGTHS), longest, DIM), generator=gen)
    mask = torch.zeros((len(LENGTHS), longest), dtype=torch.long)
    for row, n in enumerate(LENGTHS):
        hidden[row, :n] = torch.randn((n, DIM), generator=gen)
        mask[row, :n] = 1
    packed = torch.cat([hidden[row, :n] for row, n in enumerate(LENGTHS)])
    return tokens, hidden, mask, packed


@pytest.mark.parametrize("mode", MODES)
def test_pool_matches_sentence_transformers(
    batch: tuple[list[Tokens], torch.Tensor, torch.Tensor, torch.Tensor], mode: PoolingMode
) -> None:
    """pool() on a padded batch gives sentence-transformers' Pooling output within 1e-6."""
    _, hidden, mask, _ = batch
    got = pool(hidden, mask, mode)
    expected = st_pool(hidden, mask, mode)
    assert got.shape == (len(LENGTHS), DIM)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize("mode", MODES)
def test_pool_packed_matches_sentence_transformers(
    batch: tuple[list[Tokens], torch.Tensor, torch.Tensor, torch.Tensor], mode: PoolingMode
) -> None:
    """pool_packed() on the same rows packed without padding gives sentence-transformers' padded output
    within 1e-6."""
    tokens, hidden, mask, packed = batch
    got = pool_packed(packed, Packed.of(tokens), mode)
    expected = st_pool(hidden, mask, mode)
    assert got.shape == (len(LENGTHS), DIM)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)


def folder_with_pooling(model_dir: Path, target: Path, mode: PoolingMode) -> Path:
    """A copy of the model folder whose 1_Pooling config turns on `mode` alone."""
    folder = target / f"minilm-{mode}"
    linked_copy(model_dir, folder)
    config_path = folder / "1_Pooling" / "config.json"
    config = json.loads(config_path.read_text())
    config.update({key: False for key in [*config, *POOLING_KEYS.values()] if key.startswith("pooling_mode")})
    config[POOLING_KEYS[mode]] = True
    config_path.write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def folders(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[PoolingMode, Path]:
    target = tmp_path_factory.mktemp("pooling")
    return {mode: folder_with_pooling(model_dir, target, mode) for mode in MODES}


@pytest.fixture(scope="module")
def models(folders: dict[PoolingMode, Path]) -> dict[PoolingMode, PoolingModel]:
    return {mode: PoolingModel(read_model_folder(folder), threads=1) for mode, folder in folders.items()}


@pytest.fixture(scope="module")
def tokens(model_dir: Path) -> list[Tokens]:
    """TEXTS as the server tokenizes them: special tokens added, no padding."""
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tokenizer.no_padding()
    return [Tokens(enc.ids) for enc in tokenizer.encode_batch(TEXTS, add_special_tokens=True)]


def embed(model: PoolingModel, items: list[Tokens]) -> np.ndarray[Any, Any]:
    """The engine's vectors as the server returns them: normalised where the folder says so."""
    out = model.forward(items)
    return normalize(out) if model.info.normalize else out


@pytest.mark.parametrize("mode", MODES)
def test_rewritten_folder_reads_as_its_pooling_mode(folders: dict[PoolingMode, Path], mode: PoolingMode) -> None:
    """A folder whose 1_Pooling config turns on one mode is read as that mode, with Normalize kept."""
    info = read_model_folder(folders[mode])
    assert (info.pooling, info.normalize) == (mode, True)


@pytest.mark.parametrize("mode", MODES)
def test_forward_matches_sentence_transformers(
    folders: dict[PoolingMode, Path], models: dict[PoolingMode, PoolingModel], tokens: list[Tokens], mode: PoolingMode
) -> None:
    """The real model's forward pass, pooled with `mode` and normalised, gives SentenceTransformer.encode's
    vectors within 1e-5, for texts of every length including the empty one."""
    from sentence_transformers import SentenceTransformer

    expected = SentenceTransformer(str(folders[mode]), device="cpu").encode(TEXTS)
    got = embed(models[mode], tokens)
    assert got.shape == expected.shape == (len(TEXTS), models[mode].info.dimensions)
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("mode", MODES)
def test_packed_batch_gives_the_rows_of_single_forwards(
    models: dict[PoolingMode, PoolingModel], tokens: list[Tokens], mode: PoolingMode
) -> None:
    """A packed batch of inputs of mixed lengths gives, row for row, what each input gives alone."""
    model = models[mode]
    assert model.packed  # the native, packed path is the one under test
    together = model.forward(tokens)
    alone = np.concatenate([model.forward([item]) for item in tokens])
    np.testing.assert_allclose(together, alone, atol=1e-5, rtol=0)
