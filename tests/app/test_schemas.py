"""Every surface's responses against that peer's published schema: OpenAI's, Cohere's and
Infinity's from their own client packages, TEI's, vLLM's and Jina's as tests/peer_schemas.py
writes them out. A missing field or a wrong type fails the surface's test."""

from __future__ import annotations

from typing import Any

import cohere
import httpx
import openai.types
import pytest
from infinity_client import models as infinity
from pydantic import BaseModel, TypeAdapter

from tests import peer_schemas as peer
from tests.app.test_pooling_api import DOCS, QUERY, TEXTS
from tests.server_process import Served


def valid(schema: Any, response: httpx.Response) -> None:
    assert response.status_code == 200, response.text
    TypeAdapter(schema).validate_python(response.json(), strict=False)


def test_openai_embeddings_and_models(server: Served) -> None:
    """/v1/embeddings as openai-python's CreateEmbeddingResponse, /v1/models' cards as its Model."""
    valid(openai.types.CreateEmbeddingResponse, server.post("/v1/embeddings", json={"input": TEXTS[:2]}))
    for card in server.get("/v1/models").json()["data"]:
        openai.types.Model.model_validate(card)


@pytest.mark.parametrize(
    ("path", "body", "schema"),
    [
        ("/v1/embeddings", {"input": TEXTS[:2]}, peer.VLLMEmbeddingResponse),
        ("/v1/embeddings", {"input": TEXTS[:2], "encoding_format": "base64"}, peer.VLLMEmbeddingResponse),
        ("/pooling", {"input": TEXTS[:2]}, peer.VLLMPoolingResponse),
        ("/score", {"text_1": QUERY, "text_2": DOCS}, peer.VLLMScoreResponse),
        ("/rerank", {"query": QUERY, "documents": DOCS}, peer.VLLMRerankResponse),
        ("/tokenize", {"prompt": QUERY}, peer.VLLMTokenizeResponse),
        ("/detokenize", {"tokens": [101, 2073, 102]}, peer.VLLMDetokenizeResponse),
    ],
)
def test_vllm_surface(server: Served, path: str, body: dict, schema: type[BaseModel]) -> None:  # type: ignore[type-arg]
    """vLLM's response models, each field it sends present with its type."""
    valid(schema, server.post(path, json=body))


def test_vllm_classify(classifier_server: Served) -> None:
    valid(peer.VLLMClassificationResponse, classifier_server.post("/classify", json={"input": TEXTS[:2]}))


def test_vllm_cross_encoder_score_and_rerank(cross_encoder_server: Served) -> None:
    valid(peer.VLLMScoreResponse, cross_encoder_server.post("/score", json={"text_1": QUERY, "text_2": DOCS}))
    valid(peer.VLLMRerankResponse, cross_encoder_server.post("/rerank", json={"query": QUERY, "documents": DOCS}))


@pytest.mark.parametrize(
    ("path", "body", "schema"),
    [
        ("/embed", {"inputs": TEXTS[:2]}, peer.TEIEmbedResponse),
        ("/", {"inputs": TEXTS[:2]}, peer.TEIEmbedResponse),
        ("/invocations", {"inputs": TEXTS[:2]}, peer.TEIEmbedResponse),
        ("/embed_all", {"inputs": TEXTS[:1]}, peer.TEIEmbedAllResponse),
        ("/similarity", {"inputs": {"source_sentence": QUERY, "sentences": DOCS}}, peer.TEISimilarityResponse),
        ("/rerank", {"query": QUERY, "texts": DOCS, "return_text": True}, peer.TEIRerankResponse),
        ("/tokenize", {"inputs": TEXTS[:2]}, peer.TEITokenizeResponse),
        ("/decode", {"ids": [101, 2073, 102]}, peer.TEIDecodeResponse),
    ],
)
def test_tei_surface(server: Served, path: str, body: dict, schema: type[BaseModel]) -> None:  # type: ignore[type-arg]
    """TEI's OpenAPI response schemas."""
    valid(schema, server.post(path, json=body))


def test_tei_info_of_each_kind(server: Served, classifier_server: Served, cross_encoder_server: Served) -> None:
    """/info's required fields and its model_type, one of embedding, classifier or reranker."""
    kinds = []
    for proc in (server, classifier_server, cross_encoder_server):
        response = proc.get("/info")
        valid(peer.TEIInfo, response)
        kinds.append(next(iter(response.json()["model_type"])))
    assert kinds == ["embedding", "classifier", "reranker"]


def test_tei_predict_and_errors(classifier_server: Served) -> None:
    """/predict's single and batch answers; an error in TEI's {error, error_type}."""
    valid(peer.TEIPredictResponse, classifier_server.post("/predict", json={"inputs": TEXTS[0]}))
    valid(peer.TEIPredictResponse, classifier_server.post("/predict", json={"inputs": [[t] for t in TEXTS[:2]]}))
    error = classifier_server.post("/predict", json={"inputs": []})
    assert error.status_code == 400
    peer.TEIError.model_validate(error.json())


def test_cohere_embed_v1_and_v2(server: Served) -> None:
    """Cohere's EmbedResponse (v1: floats, or by type when asked) and EmbedByTypeResponse (v2)."""
    valid(cohere.EmbedResponse, server.post("/v1/embed", json={"texts": TEXTS[:2]}))
    valid(cohere.EmbedResponse, server.post("/v1/embed", json={"texts": TEXTS[:2], "embedding_types": ["int8"]}))
    body = {"texts": TEXTS[:2], "embedding_types": ["float", "ubinary"], "input_type": "search_document"}
    valid(cohere.EmbedByTypeResponse, server.post("/v2/embed", json=body))


def test_cohere_rerank_v1_and_v2(cross_encoder_server: Served) -> None:
    body = {"query": QUERY, "documents": DOCS, "top_n": 2}
    valid(cohere.RerankResponse, cross_encoder_server.post("/v1/rerank", json=body))
    valid(cohere.V2RerankResponse, cross_encoder_server.post("/v2/rerank", json=body))


def test_jina_rerank(cross_encoder_server: Served) -> None:
    body = {"query": QUERY, "documents": DOCS, "top_n": 3, "return_documents": True}
    valid(peer.JinaRerankResponse, cross_encoder_server.post("/rerank", json=body))


def test_infinity_embeddings_rerank_and_models(server: Served, cross_encoder_server: Served) -> None:
    """Infinity's routes without /v1, read by infinity_client's own models (which raise on a missing field)."""
    embedded = server.post("/embeddings", json={"input": TEXTS[:2], "model": "all-MiniLM-L6-v2"})
    assert embedded.status_code == 200, embedded.text
    result = infinity.OpenAIEmbeddingResult.from_dict(embedded.json())
    assert len(result.data) == 2
    ranked = cross_encoder_server.post("/rerank", json={"query": QUERY, "documents": DOCS})
    assert len(infinity.ReRankResult.from_dict(ranked.json()).results) == len(DOCS)
    listed = server.get("/models")
    assert listed.status_code == 200, listed.text
    assert infinity.OpenAIModelInfo.from_dict(listed.json()).data[0].id == "all-MiniLM-L6-v2"
