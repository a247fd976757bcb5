"""/v1/embeddings gives sentence-transformers' vectors, to raw HTTP and to the openai client."""

from __future__ import annotations

import base64

import numpy as np
import pytest
from openai import OpenAI

from tests.server_process import Served

LONG = " ".join(["warm pools start fast and stay responsive under load"] * 30)
SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "A man is eating food.",
    "Ein Mann isst Essen.",
    "Un homme mange de la nourriture.",
    "日本語の文章も埋め込めます。",
    "Emoji too 🚀🔥 and accents: café, naïve, façade.",
    "",
    " ",
    "a",
    "What is the capital of France?",
    "Paris is the capital and most populous city of France.",
    "Embeddings map text to vectors in a shared space.",
    "Dynamic batching groups concurrent requests into one forward pass.",
    "The forkserver preloads torch so engines start in milliseconds.",
    "ÅÄÖ åäö ß ñ ç ø",
    "Mixed CASE and Numbers 12345 and symbols #$%&*!",
    "tabs\tand\nnewlines\r\ninside",
    "Привет, как дела?",
    "مرحبا بالعالم",
    "Ceci est une phrase un peu plus longue, avec des virgules, des points; et des deux-points: voilà.",
    LONG,  # longer than 256 tokens: needs truncation
    " ".join(["token"] * 254),  # 254 words + 2 specials = exactly the maximum
]
FITTING = [s for s in SENTENCES if s is not LONG]


def reference(st_model, texts: list[str]) -> np.ndarray:  # type: ignore[no-untyped-def]
    return np.asarray(st_model.encode(texts, batch_size=8, convert_to_numpy=True))


def vectors(response: dict) -> np.ndarray:  # type: ignore[type-arg]
    return np.asarray([d["embedding"] for d in sorted(response["data"], key=lambda d: d["index"])])


def test_one_by_one_equals_sentence_transformers(server: Served, st_model) -> None:  # type: ignore[no-untyped-def]
    got = []
    for text in FITTING:
        r = server.post("/v1/embeddings", json={"input": text})
        assert r.status_code == 200, r.text
        got.append(vectors(r.json())[0])
    np.testing.assert_allclose(np.asarray(got), reference(st_model, FITTING), atol=1e-5, rtol=0)


def test_list_equals_sentence_transformers(server: Served, st_model) -> None:  # type: ignore[no-untyped-def]
    r = server.post("/v1/embeddings", json={"input": FITTING, "model": "all-MiniLM-L6-v2"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and body["model"] == "all-MiniLM-L6-v2"
    assert [d["index"] for d in body["data"]] == list(range(len(FITTING)))
    np.testing.assert_allclose(vectors(body), reference(st_model, FITTING), atol=1e-5, rtol=0)
    expected_tokens = sum(len(st_model.tokenizer(t)["input_ids"]) for t in FITTING)
    assert body["usage"] == {"prompt_tokens": expected_tokens, "total_tokens": expected_tokens}


def test_truncation_matches_sentence_transformers(server: Served, st_model) -> None:  # type: ignore[no-untyped-def]
    r = server.post("/v1/embeddings", json={"input": [LONG], "truncate_prompt_tokens": -1})
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(vectors(r.json()), reference(st_model, [LONG]), atol=1e-5, rtol=0)
    assert r.json()["usage"]["prompt_tokens"] == 256


def test_token_ids_equal_text(server: Served, st_model) -> None:  # type: ignore[no-untyped-def]
    texts = ["A man is eating food.", "Paris is the capital of France."]
    ids = [st_model.tokenizer(t)["input_ids"] for t in texts]
    one = server.post("/v1/embeddings", json={"input": ids[0]}).json()
    many = server.post("/v1/embeddings", json={"input": ids}).json()
    ref = reference(st_model, texts)
    np.testing.assert_allclose(vectors(one)[0], ref[0], atol=1e-5, rtol=0)
    np.testing.assert_allclose(vectors(many), ref, atol=1e-5, rtol=0)


def test_dimensions_truncate_and_renormalise(server: Served, st_model) -> None:  # type: ignore[no-untyped-def]
    r = server.post("/v1/embeddings", json={"input": "A man is eating food.", "dimensions": 64})
    assert r.status_code == 200, r.text
    got = vectors(r.json())[0]
    ref = reference(st_model, ["A man is eating food."])[0][:64]
    assert got.shape == (64,)
    np.testing.assert_allclose(got, ref / np.linalg.norm(ref), atol=1e-5, rtol=0)


@pytest.mark.parametrize("encoding_format", ["float", "base64", None])
def test_openai_client(server: Served, st_model, encoding_format: str | None) -> None:  # type: ignore[no-untyped-def]
    """None: the client asks for base64 itself and decodes it; "base64": the caller decodes."""
    client = OpenAI(http_client=server.client, base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    texts = SENTENCES[:6]
    extra = {"encoding_format": encoding_format} if encoding_format else {}
    result = client.embeddings.create(model="all-MiniLM-L6-v2", input=texts, **extra)  # type: ignore[arg-type]
    raw = [d.embedding for d in result.data]
    if encoding_format == "base64":
        raw = [np.frombuffer(base64.b64decode(e), dtype="<f4") for e in raw]  # type: ignore[arg-type]
    got = np.asarray(raw)
    np.testing.assert_allclose(got, reference(st_model, texts), atol=1e-5, rtol=0)
    assert result.usage.prompt_tokens > 0


def test_base64_is_little_endian_float32(server: Served) -> None:
    as_float = server.post("/v1/embeddings", json={"input": "hi"}).json()["data"][0]["embedding"]
    raw = server.post("/v1/embeddings", json={"input": "hi", "encoding_format": "base64"})
    decoded = np.frombuffer(base64.b64decode(raw.json()["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_array_equal(decoded, np.asarray(as_float, dtype=np.float32))


def test_models_and_timing_headers(server: Served) -> None:
    models = server.get("/v1/models").json()
    assert models["data"][0]["id"] == "all-MiniLM-L6-v2"
    assert models["data"][0]["kind"] == "embedding"
    r = server.post("/v1/embeddings", json={"input": "hi"}, headers={"x-request-id": "abc-123"})
    assert r.headers["x-request-id"] == "abc-123"
    for header in ("x-queue-time", "x-tokenization-time", "x-inference-time", "x-total-time"):
        assert float(r.headers[header]) >= 0
    assert server.get("/health").status_code == 200
