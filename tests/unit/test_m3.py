"""bge-m3 (an XLM-R encoder with FlagEmbedding's sparse_linear and colbert_linear beside it) gives
FlagEmbedding's dense vectors, lexical weights and ColBERT vectors, all three from one forward."""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
os.environ["DO_NOT_TRACK"] = "1"

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from common.modelfolder import read_model_folder
from common.wire import Tokens
from engine.runtime.model import PoolingModel
from server.core import outputs
from server.kinds import m3
from server.protocols.openai import SparseOptions
from server.tokenizing.tokenizer import TokenizerPool
from tests.checkpoints import code_running_head
from tests.flag_reference import m3_embedder
from tests.tiny_kinds import build_m3
from tests.tiny_models import MAX_TOKENS

TEXTS = ["the warm pool model", "Hello world, the engine", "a", "naïve café", "the model text " * 30]
ALL = ("dense", "sparse", "multi_vector")


@pytest.fixture(scope="module")
def folder(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_m3(tmp_path_factory.mktemp("m3") / "m3", model_dir)


@pytest.fixture(scope="module")
def reference(folder: Path) -> dict[str, Any]:
    model = m3_embedder()(str(folder), use_fp16=False, devices="cpu")
    return model.encode(TEXTS, return_dense=True, return_sparse=True, return_colbert_vecs=True, max_length=MAX_TOKENS)  # type: ignore[no-any-return]


def tokens(folder: Path, wanted: tuple[str, ...]) -> list[Tokens]:
    found = TokenizerPool(folder).encode_batch(TEXTS, truncate=MAX_TOKENS)
    return [t._replace(outputs=wanted) for t in found]


def test_the_folder_is_a_dense_model_with_bge_m3_heads(folder: Path) -> None:
    """Both heads are found (as torch pickles, as BAAI ships them), the dense vector pools the first token, natively."""
    info = read_model_folder(folder)
    assert info.kind == "embedding" and info.native and info.pooling == "cls" and info.normalize
    assert info.m3 is not None and [f.name for f in info.m3.files()] == ["sparse_linear.pt", "colbert_linear.pt"]


def test_pickled_heads_load_by_default(folder: Path) -> None:
    """The heads' pickles hold tensors only: torch's weights-only unpickler reads them, no setting needed."""
    model = PoolingModel(read_model_folder(folder), threads=1)
    assert model.m3 is not None and model.m3_refused is None


def test_a_head_pickle_that_would_run_code_is_refused_without_running_it(folder: Path, tmp_path: Path) -> None:
    """sparse_linear.pt holding an object whose unpickling calls exec: plain unpickling runs it (the
    file is live), the engine's load refuses it without running it, names the file, and the model
    answers its dense vector alone."""
    marker = tmp_path / "ran"
    hostile = code_running_head(folder, tmp_path / "m3", "sparse_linear.pt", marker)
    torch.load(hostile / "sparse_linear.pt", weights_only=False)
    assert marker.exists()
    marker.unlink()
    model = PoolingModel(read_model_folder(hostile), threads=1)
    assert not marker.exists()
    assert model.m3 is None and model.m3_refused is not None
    assert "sparse_linear.pt is not tensors only" in model.m3_refused and "exec" in model.m3_refused, model.m3_refused
    assert model.forward(tokens(hostile, ())).shape == (len(TEXTS), 32)


def test_a_head_of_other_shapes_is_refused(folder: Path, tmp_path: Path) -> None:
    """colbert_linear.pt of tensors, but not [D, hidden] and [D]: refused, naming the file and the shapes."""
    misshapen = tmp_path / "m3"
    shutil.copytree(folder, misshapen)
    torch.save({"weight": torch.zeros(8, 16), "bias": torch.zeros(8)}, misshapen / "colbert_linear.pt")
    model = PoolingModel(read_model_folder(misshapen), threads=1)
    assert model.m3 is None
    assert model.m3_refused == "colbert_linear.pt: weight [8, 16] and bias [8], not [D, 32] and [D]"


def test_heads_are_refused_while_the_unpickler_allows_more_than_torch_does(folder: Path) -> None:
    """The weights-only allowlist is process-wide: extended beyond torch's own types (by some library),
    its guarantee is no longer torch's, and the heads stay unread, the reason saying why."""
    with torch.serialization.safe_globals([SparseOptions]):
        model = PoolingModel(read_model_folder(folder), threads=1)
    assert model.m3 is None and model.m3_refused is not None
    assert "allowlist was extended" in model.m3_refused and "SparseOptions" in model.m3_refused, model.m3_refused


def test_three_outputs_match_flag_embedding_from_one_forward(folder: Path, reference: dict[str, Any]) -> None:
    """Dense vectors (normalised), lexical weights (same token ids, weights within 1e-5) and ColBERT
    vectors equal BGEM3FlagModel.encode's, and the encoder ran once for the group."""
    model = PoolingModel(read_model_folder(folder), threads=1)
    calls = []
    model.model.register_forward_hook(lambda *_: calls.append(1))
    items = tokens(folder, ALL)
    rows = model.forward_outputs(items)
    assert len(calls) == 1
    dense = outputs.normalize(np.stack([r["dense"] for r in rows]))
    np.testing.assert_allclose(dense, reference["dense_vecs"], atol=1e-5)
    special = TokenizerPool(folder).special_ids
    assert special == {0, 1, 2, 3}  # <s>, <pad>, </s>, <unk>
    for row, item, expected in zip(rows, items, reference["lexical_weights"], strict=True):
        got = m3.lexical(row["sparse"], item.input_ids, special, SparseOptions(top_k=None, threshold=None))
        assert [str(i) for i in got["indices"]] == sorted(expected, key=int)
        np.testing.assert_allclose(got["values"], [expected[str(i)] for i in got["indices"]], atol=1e-5)
    for row, expected in zip(rows, reference["colbert_vecs"], strict=True):
        np.testing.assert_allclose(row["multi_vector"], expected, atol=1e-5)


def test_a_subset_runs_only_its_heads(folder: Path) -> None:
    """An input asking for the lexical weights alone gets only them, and the ColBERT head does not run."""
    model = PoolingModel(read_model_folder(folder), threads=1)
    assert model.m3 is not None
    ran = []
    model.m3.colbert_linear.register_forward_hook(lambda *_: ran.append(1))
    rows = model.forward_outputs(tokens(folder, ("sparse",)))
    assert all(set(r) == {"sparse"} for r in rows) and not ran


def test_top_k_and_threshold_prune_lexical_weights() -> None:
    """threshold keeps weights above it; top_k the k largest; indices stay ascending; specials drop."""
    weights, ids = np.array([0.5, 0.9, 0.1, 0.7, 0.3]), [0, 40, 41, 42, 40]
    options = SparseOptions(top_k=2, threshold=None)
    assert m3.lexical(weights, ids, frozenset({0}), options) == {"indices": [40, 42], "values": [0.9, 0.7]}
    assert m3.lexical(weights, ids, frozenset(), SparseOptions(threshold=0.6))["indices"] == [40, 42]
