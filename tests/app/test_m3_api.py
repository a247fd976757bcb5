"""bge-m3 served over HTTP: /v1/embeddings and /pooling answer any subset of its dense vector,
lexical weights and ColBERT vectors from one engine batch, TEI's /embed_sparse its lexical weights,
all equal to FlagEmbedding's BGEM3FlagModel; its heads as BAAI ships them (torch pickles) served by
default, a head pickle that is not tensors only refused."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.app.inprocess import serving
from tests.checkpoints import code_running_head
from tests.flag_reference import m3_embedder
from tests.server_process import Served
from tests.tiny_kinds import build_m3

TEXTS = ["the warm pool model", "Hello world, the engine", "naïve café"]


@pytest.fixture(scope="module")
def m3_dir(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_m3(tmp_path_factory.mktemp("m3") / "m3", model_dir)


@pytest.fixture(scope="module")
def m3(m3_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serving(m3_dir) as proc:
        yield proc


@pytest.fixture(scope="module")
def reference(m3_dir: Path) -> dict[str, Any]:
    model = m3_embedder()(str(m3_dir), use_fp16=False, devices="cpu")
    return model.encode(TEXTS, return_dense=True, return_sparse=True, return_colbert_vecs=True)  # type: ignore[no-any-return]


def same_lexical(got: list[dict[str, Any]], expected: list[dict[str, float]]) -> None:
    for item, weights in zip(got, expected, strict=True):
        assert [str(i) for i in item["indices"]] == sorted(weights, key=int)
        np.testing.assert_allclose(item["values"], [weights[str(i)] for i in item["indices"]], atol=1e-5)


def test_embeddings_answer_all_three_outputs_from_one_batch(m3: Served, reference: dict[str, Any]) -> None:
    """outputs [dense, sparse, multi_vector] on /v1/embeddings: each item has `embedding`, `sparse`
    {indices, values} and `multi_vector`, equal to FlagEmbedding's; one input's three outputs take
    one engine forward."""
    everything = ["dense", "sparse", "multi_vector"]
    before = m3.batches()
    one = m3.post("/v1/embeddings", json={"input": TEXTS[0], "outputs": everything})
    assert one.status_code == 200, one.text
    assert m3.batches() == before + 1 and set(one.json()["data"][0]) >= {"embedding", "sparse", "multi_vector"}
    r = m3.post("/v1/embeddings", json={"input": TEXTS, "outputs": everything})
    assert r.status_code == 200, r.text
    data = r.json()["data"]
    np.testing.assert_allclose([d["embedding"] for d in data], reference["dense_vecs"], atol=1e-5)
    same_lexical([d["sparse"] for d in data], reference["lexical_weights"])
    for d, expected in zip(data, reference["colbert_vecs"], strict=True):
        np.testing.assert_allclose(d["multi_vector"], expected, atol=1e-5)


def test_a_subset_is_answered_alone(m3: Served, reference: dict[str, Any]) -> None:
    """/pooling with outputs [sparse] answers the lexical weights and nothing else; no outputs
    answers the dense vector as for any embedding model."""
    r = m3.post("/pooling", json={"input": TEXTS, "outputs": ["sparse"]})
    assert r.status_code == 200, r.text
    assert all(set(d["data"]) == {"sparse"} for d in r.json()["data"])
    same_lexical([d["data"]["sparse"] for d in r.json()["data"]], reference["lexical_weights"])
    r = m3.post("/v1/embeddings", json={"input": TEXTS})
    np.testing.assert_allclose([d["embedding"] for d in r.json()["data"]], reference["dense_vecs"], atol=1e-5)


def test_tei_embed_sparse_answers_lexical_weights(m3: Served, reference: dict[str, Any]) -> None:
    """TEI's /embed_sparse on bge-m3: its lexical weights as [{index, value}], pruned by top_k."""
    r = m3.post("/embed_sparse", json={"inputs": TEXTS})
    assert r.status_code == 200, r.text
    got = [{"indices": [e["index"] for e in row], "values": [e["value"] for e in row]} for row in r.json()]
    same_lexical(got, reference["lexical_weights"])
    r = m3.post("/embed_sparse", json={"inputs": TEXTS, "top_k": 2})
    assert [len(row) for row in r.json()] == [min(2, len(w)) for w in reference["lexical_weights"]]


def test_models_list_the_three_outputs(m3: Served) -> None:
    """/v1/models says the model answers dense, sparse and multi_vector; the engine phase names the heads."""
    (card,) = m3.get("/v1/models").json()["data"]
    assert card["outputs"] == ["dense", "sparse", "multi_vector"]
    assert m3.phase("engine")["detail"]["head"] == "bge-m3 (dense, sparse, multi_vector)"


def test_a_head_that_is_not_tensors_only_is_refused_and_dense_served(m3_dir: Path, tmp_path: Path) -> None:
    """sparse_linear.pt with an object that would run code if unpickled: the model starts and serves
    its dense vector, the code never runs; /health/startup's engine detail and the 400 for another
    output name the file; /v1/models lists dense alone."""
    marker = tmp_path / "ran"
    hostile = code_running_head(m3_dir, tmp_path / "m3", "sparse_linear.pt", marker)
    with serving(hostile) as server:
        assert server.post("/v1/embeddings", json={"input": TEXTS}).status_code == 200
        assert "sparse_linear.pt is not tensors only" in server.phase("engine")["detail"]["heads_refused"]
        r = server.post("/v1/embeddings", json={"input": TEXTS, "outputs": ["sparse"]})
        assert r.status_code == 400 and "sparse_linear.pt is not tensors only" in r.json()["error"]["message"], r.text
        assert server.get("/v1/models").json()["data"][0]["outputs"] == ["dense"]
    assert not marker.exists()


def test_quantized_encodings_with_outputs_are_400(m3: Served) -> None:
    """int8 (any encoding but float) applies to the dense vector alone: with `outputs`, a 400 naming both."""
    body = {"input": TEXTS, "outputs": ["dense", "sparse"], "encoding_format": "int8"}
    r = m3.post("/v1/embeddings", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == "encoding_format", r.text
    assert "'outputs'" in r.json()["error"]["message"]
