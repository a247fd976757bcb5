"""The client libraries people already have, unchanged, against a keyed server: openai,
huggingface_hub's InferenceClient, cohere (v1 and v2) and tei-client. Every result is checked
against sentence-transformers or against the server's own /v1/embeddings and /score, and no call
reaches for anything but 127.0.0.1."""

from __future__ import annotations

import base64
import json
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import API_KEY
from tests.server_process import ServerProcess, serving

TEXTS = ["What is the capital of France?", "Paris is the capital of France.", "Ein Mann isst Essen 🍝"]
QUERY = "Where is the Eiffel Tower?"
DOCS = ["The Eiffel Tower is in Paris.", "Bananas are yellow.", "The tower was finished in 1889."]
PROMPTS = {"query": "query: ", "document": "passage: "}


@pytest.fixture(scope="module")
def prompted_dir(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default model with sentence-transformers prompts, as e5- and bge-style models ship them."""
    folder = tmp_path_factory.mktemp("prompted") / "prompted-minilm"
    shutil.copytree(model_dir, folder)
    config = folder / "config_sentence_transformers.json"
    st = json.loads(config.read_text())
    config.write_text(json.dumps({**st, "prompts": PROMPTS, "default_prompt_name": None}))
    return folder


@pytest.fixture(scope="module")
def embedder(prompted_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("logs") / "embedder.log"
    with serving(prompted_dir, log, api_key=API_KEY) as proc:
        proc.client.headers["authorization"] = f"Bearer {API_KEY}"
        yield proc


@pytest.fixture(scope="module")
def reference(prompted_dir: Path) -> Any:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(prompted_dir), device="cpu")


@pytest.fixture(autouse=True)
def local_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """Every connection a client opens is recorded, and must go to 127.0.0.1. huggingface_hub's
    offline switch refuses even local URLs, so it is lifted here; telemetry stays off."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setenv("DO_NOT_TRACK", "1")
    seen: list[Any] = []
    connect = socket.socket.connect

    def recording(self: socket.socket, address: Any) -> Any:
        seen.append(address)
        return connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", recording)
    yield seen
    assert all(isinstance(a, tuple) and a[0] == "127.0.0.1" for a in seen), seen


def embeddings(server: ServerProcess, texts: list[str], **extra: Any) -> np.ndarray:
    r = server.post("/v1/embeddings", json={"input": texts, **extra})
    assert r.status_code == 200, r.text
    return np.asarray([d["embedding"] for d in r.json()["data"]])


def scores(server: ServerProcess, query: str, docs: list[str]) -> np.ndarray:
    r = server.post("/score", json={"text_1": query, "text_2": docs})
    assert r.status_code == 200, r.text
    return np.asarray([d["score"] for d in r.json()["data"]])


def test_openai_client_with_a_prompt_name(embedder: ServerProcess, reference: Any) -> None:
    """openai's embeddings.create gives sentence-transformers' vectors, with a prompt named in extra_body."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{embedder.url}/v1", api_key=API_KEY, max_retries=0)
    plain = client.embeddings.create(input=TEXTS, model="prompted-minilm")
    np.testing.assert_allclose([d.embedding for d in plain.data], reference.encode(TEXTS), atol=1e-5)
    query = client.embeddings.create(input=TEXTS, model="prompted-minilm", extra_body={"prompt_name": "query"})
    expected = reference.encode(TEXTS, prompt_name="query")
    np.testing.assert_allclose([d.embedding for d in query.data], expected, atol=1e-5)


def test_hf_feature_extraction(embedder: ServerProcess, reference: Any) -> None:
    """InferenceClient.feature_extraction (POST /) equals /v1/embeddings; its prompt_name applies the prompt."""
    from huggingface_hub import InferenceClient

    client = InferenceClient(base_url=embedder.url, api_key=API_KEY)
    np.testing.assert_allclose(client.feature_extraction(TEXTS[0]), embeddings(embedder, TEXTS[:1]), atol=1e-5)
    prompted = client.feature_extraction(TEXTS[0], prompt_name="document")
    np.testing.assert_allclose(prompted, reference.encode(TEXTS[:1], prompt_name="document"), atol=1e-5)


def test_hf_sentence_similarity(embedder: ServerProcess, reference: Any) -> None:
    """InferenceClient.sentence_similarity (POST / with source_sentence) gives the cosine similarities."""
    from huggingface_hub import InferenceClient

    client = InferenceClient(base_url=embedder.url, api_key=API_KEY)
    vectors = reference.encode([QUERY, *DOCS], normalize_embeddings=True)
    similarity = client.sentence_similarity(QUERY, other_sentences=DOCS)
    np.testing.assert_allclose(similarity, vectors[1:] @ vectors[0], atol=1e-5)


def test_hf_text_classification(classifier_server: ServerProcess) -> None:
    """InferenceClient.text_classification (POST /) gives every label with /classify's probability."""
    from huggingface_hub import InferenceClient

    client = InferenceClient(base_url=classifier_server.url, api_key=API_KEY)
    result = client.text_classification(TEXTS[0])
    probs = classifier_server.post("/classify", json={"input": TEXTS[0]}).json()["data"][0]["probs"]
    labels = ["negative", "neutral", "positive"]
    assert len(result) == len(labels)
    assert [r.score for r in result] == sorted((r.score for r in result), reverse=True)
    for r in result:
        assert r.score == pytest.approx(probs[labels.index(r.label)], abs=1e-5)


def test_cohere_v2_embed_types(embedder: ServerProcess, reference: Any) -> None:
    """cohere.ClientV2.embed: search_query takes the model's query prompt; every embedding type
    is derived from those floats as Cohere defines it."""
    import cohere

    client = cohere.ClientV2(base_url=embedder.url, api_key=API_KEY)
    kinds = ["float", "int8", "uint8", "binary", "ubinary", "base64"]
    r = client.embed(texts=TEXTS, model="prompted-minilm", input_type="search_query", embedding_types=kinds)
    floats = np.asarray(r.embeddings.float_)
    np.testing.assert_allclose(floats, reference.encode(TEXTS, prompt_name="query"), atol=1e-5)
    ubinary = np.packbits(floats > 0, axis=1)
    assert np.array_equal(r.embeddings.ubinary, ubinary)
    assert np.array_equal(r.embeddings.binary, ubinary.astype(int) - 128)
    int8 = np.asarray(r.embeddings.int8)
    assert int8.min() >= -128 and int8.max() <= 127
    assert np.array_equal(np.asarray(r.embeddings.uint8), int8 + 128)
    cosine = (int8 * floats).sum(1) / np.linalg.norm(int8, axis=1) / np.linalg.norm(floats, axis=1)
    assert cosine.min() > 0.999
    decoded = [np.frombuffer(base64.b64decode(s), dtype="<f4") for s in r.embeddings.base64]
    np.testing.assert_allclose(decoded, floats, atol=1e-7)
    assert r.meta is not None and r.meta.billed_units is not None and r.meta.billed_units.input_tokens


def test_cohere_v1_embed(embedder: ServerProcess, reference: Any) -> None:
    """cohere.Client.embed (v1): search_document takes the model's document prompt; floats answer bare."""
    import cohere

    client = cohere.Client(base_url=embedder.url, api_key=API_KEY)
    r = client.embed(texts=TEXTS, model="prompted-minilm", input_type="search_document")
    assert r.response_type == "embeddings_floats"
    np.testing.assert_allclose(r.embeddings, reference.encode(TEXTS, prompt_name="document"), atol=1e-5)


def test_cohere_rerank_v1_and_v2(cross_encoder_server: ServerProcess) -> None:
    """cohere's v1 and v2 rerank rank the documents by /score's scores."""
    import cohere

    name = cross_encoder_server.get("/v1/models").json()["data"][0]["id"]
    expected = scores(cross_encoder_server, QUERY, DOCS)
    order = list(np.argsort(-expected, kind="stable"))
    v2 = cohere.ClientV2(base_url=cross_encoder_server.url, api_key=API_KEY).rerank(
        model=name, query=QUERY, documents=DOCS
    )
    v1 = cohere.Client(base_url=cross_encoder_server.url, api_key=API_KEY).rerank(
        model=name, query=QUERY, documents=DOCS, top_n=2
    )
    assert [r.index for r in v2.results] == order
    np.testing.assert_allclose([r.relevance_score for r in v2.results], expected[order], atol=1e-6)
    assert [r.index for r in v1.results] == order[:2]


def test_tei_client_on_an_embedding_model(embedder: ServerProcess, reference: Any) -> None:
    """tei-client: info, embed (with a prompt), tokenize with offsets, decode, prompt names."""
    from tei_client import HttpClient
    from tei_client.models import ModelType

    client = HttpClient(embedder.url, headers={"Authorization": f"Bearer {API_KEY}"})
    assert client.info().server_model_type == ModelType.Embedding
    np.testing.assert_allclose(client.embed(TEXTS), embeddings(embedder, TEXTS), atol=1e-5)
    np.testing.assert_allclose(
        client.embed(TEXTS, prompt_name="query"), reference.encode(TEXTS, prompt_name="query"), atol=1e-5
    )
    (tokens,) = client.tokenize(TEXTS[2])
    assert tokens.get_ids() == reference.tokenizer(TEXTS[2])["input_ids"]
    words = [t for t in tokens.tokens if not t.special]
    assert all(TEXTS[2][t.start : t.stop] == t.text for t in words)
    assert client.decode(tokens.get_ids()) == [reference.tokenizer.decode(tokens.get_ids(), skip_special_tokens=True)]
    assert sorted(client.prompt_names()) == sorted(PROMPTS)


def test_tei_client_rerank(cross_encoder_server: ServerProcess) -> None:
    """tei-client on a cross-encoder: info says reranker; rerank gives /score's scores, best first, with texts."""
    from tei_client import HttpClient
    from tei_client.models import ModelType

    client = HttpClient(cross_encoder_server.url, headers={"Authorization": f"Bearer {API_KEY}"})
    assert client.info().server_model_type == ModelType.Reranker
    ranks = client.rerank(QUERY, DOCS, return_text=True).ranks
    expected = scores(cross_encoder_server, QUERY, DOCS)
    assert [r.index for r in ranks] == list(np.argsort(-expected, kind="stable"))
    np.testing.assert_allclose([r.score for r in ranks], sorted(expected, reverse=True), atol=1e-6)
    assert [r.text for r in ranks] == [DOCS[r.index] for r in ranks]


def test_tei_client_classify(classifier_server: ServerProcess) -> None:
    """tei-client's classify ([[text]] batches) gives /classify's probabilities per label."""
    from tei_client import HttpClient

    client = HttpClient(classifier_server.url, headers={"Authorization": f"Bearer {API_KEY}"})
    results = client.classify(TEXTS[:2])
    data = classifier_server.post("/classify", json={"input": TEXTS[:2]}).json()["data"]
    labels = ["negative", "neutral", "positive"]
    for result, row in zip(results, data, strict=True):
        for s in result.scores:
            assert s.score == pytest.approx(row["probs"][labels.index(s.label)], abs=1e-5)
