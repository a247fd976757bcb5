"""A ColBERT model served over HTTP: per-token vectors on vLLM's /pooling and TEI's /embed_all as
queries or documents, MaxSim on /score and every rerank shape, all equal to sentence-transformers'
MultiVectorEncoder on the same PyLate folder."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.app.inprocess import serving
from tests.conftest import API_KEY
from tests.server_process import Served

QUERY = "what keeps the warm pool model loaded?"
DOCS = ["the warm pool keeps models loaded; engines restart.", "Hello, world!", "a model of the text"]


@pytest.fixture(scope="module")
def colbert(colbert_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serving(colbert_dir, api_key=API_KEY) as proc:
        proc.client.headers["authorization"] = f"Bearer {API_KEY}"
        yield proc


@pytest.fixture(scope="module")
def reference(colbert_dir: Path) -> Any:
    from sentence_transformers import MultiVectorEncoder

    return MultiVectorEncoder(str(colbert_dir), device="cpu")


def maxsim(reference: Any, query: str, documents: list[str]) -> np.ndarray:
    scores = reference.similarity(reference.encode_query([query]), reference.encode_document(documents))
    return scores.numpy()[0]  # type: ignore[no-any-return]


def same_vectors(got: list[Any], expected: list[Any]) -> None:
    assert [np.shape(g) for g in got] == [tuple(e.shape) for e in expected]
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(np.asarray(g, dtype=np.float32), e, atol=1e-5)


def test_pooling_answers_document_and_query_token_vectors(colbert: Served, reference: Any) -> None:
    """/pooling encodes documents by default and queries for input_type search_query (or
    prompt_name query): each input's token vectors, as encode_document / encode_query give them."""
    r = colbert.post("/pooling", json={"input": DOCS})
    assert r.status_code == 200, r.text
    same_vectors([d["data"] for d in r.json()["data"]], reference.encode_document(DOCS))
    for role in ({"input_type": "search_query"}, {"prompt_name": "query"}):
        r = colbert.post("/pooling", json={"input": [QUERY], **role})
        assert r.status_code == 200, r.text
        same_vectors([d["data"] for d in r.json()["data"]], reference.encode_query([QUERY]))


def test_tei_embed_all_answers_token_vectors(colbert: Served, reference: Any) -> None:
    """TEI's /embed_all: a list of token vectors per input; prompt_name query encodes queries."""
    r = colbert.post("/embed_all", json={"inputs": DOCS})
    assert r.status_code == 200, r.text
    same_vectors(r.json(), reference.encode_document(DOCS))
    r = colbert.post("/embed_all", json={"inputs": QUERY, "prompt_name": "query"})
    same_vectors(r.json(), reference.encode_query([QUERY]))


def test_score_and_rerank_are_maxsim(colbert: Served, reference: Any) -> None:
    """/score (text_1 the query), Jina's /rerank and TEI's /rerank score by MaxSim, best first."""
    expected = maxsim(reference, QUERY, DOCS)
    order = list(np.argsort(-expected, kind="stable"))
    r = colbert.post("/score", json={"text_1": QUERY, "text_2": DOCS})
    assert r.status_code == 200, r.text
    np.testing.assert_allclose([d["score"] for d in r.json()["data"]], expected, atol=1e-4)
    r = colbert.post("/rerank", json={"query": QUERY, "documents": DOCS})
    assert [x["index"] for x in r.json()["results"]] == order
    np.testing.assert_allclose([x["relevance_score"] for x in r.json()["results"]], expected[order], atol=1e-4)
    r = colbert.post("/rerank", json={"query": QUERY, "texts": DOCS, "return_text": True})
    assert [(x["index"], x["text"]) for x in r.json()] == [(i, DOCS[i]) for i in order]


def test_cohere_clients_rerank_by_maxsim(colbert: Served, reference: Any) -> None:
    """cohere's v2 and v1 rerank rank the documents by MaxSim."""
    import cohere

    expected = maxsim(reference, QUERY, DOCS)
    order = list(np.argsort(-expected, kind="stable"))
    v2 = cohere.ClientV2(httpx_client=colbert.client, base_url=colbert.url, api_key=API_KEY).rerank(
        model="colbert", query=QUERY, documents=DOCS
    )
    assert [x.index for x in v2.results] == order
    np.testing.assert_allclose([x.relevance_score for x in v2.results], expected[order], atol=1e-4)
    v1 = cohere.Client(httpx_client=colbert.client, base_url=colbert.url, api_key=API_KEY).rerank(
        model="colbert", query=QUERY, documents=DOCS, top_n=1
    )
    assert [x.index for x in v1.results] == order[:1]


def test_the_model_says_it_answers_token_vectors(colbert: Served) -> None:
    """/v1/models lists the multi_vector output and MaxSim; TEI's /info an embedding model without
    pooling; the engine phase names the ColBERT head."""
    (card,) = colbert.get("/v1/models").json()["data"]
    assert (card["outputs"], card["similarity"], card["dimensions"]) == (["multi_vector"], "maxsim", 16)
    assert colbert.get("/info").json()["model_type"] == {"embedding": {"pooling": "none"}}
    assert colbert.phase("engine")["detail"]["head"] == "colbert (16 dims per token)"


def test_pooled_routes_and_long_documents_are_clear_400s(colbert: Served) -> None:
    """/v1/embeddings (one vector per input) and /embed_sparse are refused naming the kind; a
    document past the model's 24 tokens is refused unless truncation is asked for."""
    for path, body in (("/v1/embeddings", {"input": "a"}), ("/embed_sparse", {"inputs": "a"})):
        r = colbert.post(path, json=body)
        assert r.status_code == 400 and "multi-vector" in r.text, r.text
    long = "the warm pool engine " * 10
    assert colbert.post("/pooling", json={"input": long}).status_code == 400
    r = colbert.post("/pooling", json={"input": long, "truncate_prompt_tokens": -1})
    assert r.status_code == 200 and len(r.json()["data"][0]["data"]) == 24


def test_a_long_document_scores_as_its_best_passage(colbert: Served) -> None:
    """long_inputs chunk on a ColBERT model: the best MaxSim among the passages, each as /score
    scores it alone."""
    document = " ".join(f"sentence {i} is about the tower and the river" for i in range(12))
    body = {"text_1": "the tower", "text_2": [document], "long_inputs": "chunk"}
    answer = colbert.post("/score", json=body)
    assert answer.status_code == 200, answer.text
    (item,) = answer.json()["data"]
    passage = document[item["passage"]["start"] : item["passage"]["end"]]
    assert 0 < len(passage) < len(document)
    alone = colbert.post("/score", json={"text_1": "the tower", "text_2": [passage]}).json()["data"][0]["score"]
    assert item["score"] == pytest.approx(alone, abs=1e-6)
