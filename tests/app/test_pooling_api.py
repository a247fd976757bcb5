"""classify, score, rerank, pooling, tokenize and TEI routes against transformers run directly."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.app.test_errors import assert_openai_error
from tests.server_process import Served

TEXTS = ["I loved this film.", "It was fine, I guess.", "Terrible service, never again!", "", "ok"]
QUERY = "Where is the Eiffel Tower?"
DOCS = [
    "The Eiffel Tower is in Paris.",
    "Bananas are yellow.",
    "Paris is the capital of France and home of the tower.",
    "The tower was finished in 1889.",
]


def reference_logits(folder: Path, texts: list[str], pairs: list[str] | None = None) -> np.ndarray:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    with torch.inference_mode():
        batch = tokenizer(texts, pairs, padding=True, return_tensors="pt")
        return model(**batch).logits.numpy().astype(np.float64)


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def test_classify_equals_transformers(classifier_server: Served, classifier_dir: Path) -> None:
    r = classifier_server.post("/classify", json={"input": TEXTS})
    assert r.status_code == 200, r.text
    data = r.json()["data"]
    expected = softmax(reference_logits(classifier_dir, TEXTS))
    np.testing.assert_allclose([d["probs"] for d in data], expected, atol=1e-5, rtol=0)
    labels = ["negative", "neutral", "positive"]
    assert [d["label"] for d in data] == [labels[i] for i in expected.argmax(axis=1)]
    assert {d["num_classes"] for d in data} == {3}
    assert [d["index"] for d in data] == list(range(len(TEXTS)))


def test_tei_predict(classifier_server: Served, classifier_dir: Path) -> None:
    single = classifier_server.post("/predict", json={"inputs": TEXTS[0]}).json()
    expected = softmax(reference_logits(classifier_dir, TEXTS[:1]))[0]
    assert single[0]["label"] == ["negative", "neutral", "positive"][expected.argmax()]
    assert [s["score"] for s in single] == sorted((s["score"] for s in single), reverse=True)
    np.testing.assert_allclose(sorted(s["score"] for s in single), sorted(expected), atol=1e-5)
    many = classifier_server.post("/predict", json={"inputs": [[t] for t in TEXTS[:2]]}).json()
    assert len(many) == 2 and len(many[0]) == 3


def test_tei_predict_reads_a_list_of_two_texts_as_a_pair(classifier_server: Served, classifier_dir: Path) -> None:
    """As TEI: ["a", "b"] is one [text, text] input, scored as the pair."""
    pair = classifier_server.post("/predict", json={"inputs": TEXTS[:2]}).json()
    expected = softmax(reference_logits(classifier_dir, TEXTS[:1], TEXTS[1:2]))[0]
    np.testing.assert_allclose(sorted(s["score"] for s in pair), sorted(expected), atol=1e-5)


def test_score_equals_transformers(cross_encoder_server: Served, cross_encoder_dir: Path) -> None:
    expected = 1 / (1 + np.exp(-reference_logits(cross_encoder_dir, [QUERY] * len(DOCS), DOCS)[:, 0]))
    one_to_n = cross_encoder_server.post("/score", json={"text_1": QUERY, "text_2": DOCS})
    assert one_to_n.status_code == 200, one_to_n.text
    np.testing.assert_allclose([d["score"] for d in one_to_n.json()["data"]], expected, atol=1e-5, rtol=0)
    n_to_n = cross_encoder_server.post("/score", json={"text_1": [QUERY] * len(DOCS), "text_2": DOCS})
    np.testing.assert_allclose([d["score"] for d in n_to_n.json()["data"]], expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("route", ["/rerank", "/v1/rerank"])
def test_rerank_orders_like_score(cross_encoder_server: Served, route: str) -> None:
    scores = [
        d["score"] for d in cross_encoder_server.post("/score", json={"text_1": QUERY, "text_2": DOCS}).json()["data"]
    ]
    order = sorted(range(len(DOCS)), key=lambda i: -scores[i])
    r = cross_encoder_server.post(route, json={"query": QUERY, "documents": DOCS})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [x["index"] for x in results] == order
    np.testing.assert_allclose([x["relevance_score"] for x in results], sorted(scores, reverse=True), atol=1e-6)
    assert [x["document"]["text"] for x in results] == [DOCS[i] for i in order]
    top = cross_encoder_server.post(
        route, json={"query": QUERY, "documents": DOCS, "top_n": 2, "return_documents": False}
    ).json()["results"]
    assert [x["index"] for x in top] == order[:2]
    assert all("document" not in x for x in top)


def test_rerank_in_tei_shape(cross_encoder_server: Served, cross_encoder_dir: Path) -> None:
    """A /rerank naming its documents `texts` (TEI) gets TEI's bare ranked list; raw_scores gives logits."""
    logits = reference_logits(cross_encoder_dir, [QUERY] * len(DOCS), DOCS)[:, 0]
    order = list(np.argsort(-logits, kind="stable"))
    ranks = cross_encoder_server.post("/rerank", json={"query": QUERY, "texts": DOCS, "return_text": True}).json()
    assert [r["index"] for r in ranks] == order
    np.testing.assert_allclose([r["score"] for r in ranks], 1 / (1 + np.exp(-logits[order])), atol=1e-5)
    assert [r["text"] for r in ranks] == [DOCS[i] for i in order]
    raw = cross_encoder_server.post("/rerank", json={"query": QUERY, "texts": DOCS, "raw_scores": True}).json()
    np.testing.assert_allclose([r["score"] for r in raw], logits[order], atol=1e-5)
    assert all("text" not in r for r in raw)


def test_embedding_model_scores_by_cosine(server: Served, st_model) -> None:  # type: ignore[no-untyped-def]
    vectors = st_model.encode([QUERY, *DOCS], normalize_embeddings=True)
    expected = vectors[1:] @ vectors[0]
    r = server.post("/score", json={"text_1": QUERY, "text_2": DOCS})
    assert r.status_code == 200, r.text
    np.testing.assert_allclose([d["score"] for d in r.json()["data"]], expected, atol=1e-5, rtol=0)
    ranked = server.post("/rerank", json={"query": QUERY, "documents": DOCS}).json()["results"]
    assert [x["index"] for x in ranked] == list(np.argsort(-expected, kind="stable"))


def test_pooling_is_the_raw_pooled_output(server: Served) -> None:
    pooled = np.asarray(server.post("/pooling", json={"input": DOCS}).json()["data"][0]["data"])
    embedded = np.asarray(server.post("/v1/embeddings", json={"input": DOCS}).json()["data"][0]["embedding"])
    assert abs(np.linalg.norm(pooled) - 1) > 1e-3  # before the Normalize module
    np.testing.assert_allclose(pooled / np.linalg.norm(pooled), embedded, atol=1e-5)


def test_tei_embed(server: Served) -> None:
    bare = server.post("/embed", json={"inputs": DOCS[:2]}).json()
    openai = server.post("/v1/embeddings", json={"input": DOCS[:2]}).json()["data"]
    np.testing.assert_allclose(bare, [d["embedding"] for d in openai], atol=1e-6)
    raw = server.post("/embed", json={"inputs": DOCS[0], "normalize": False}).json()
    assert abs(np.linalg.norm(raw[0]) - 1) > 1e-3
    long = server.post("/embed", json={"inputs": "word " * 400, "truncate": True})
    assert long.status_code == 200


def test_tokenize_round_trip(server: Served, st_model) -> None:  # type: ignore[no-untyped-def]
    text = "Tokenizers split words: unbelievable!"
    r = server.post("/tokenize", json={"prompt": text}).json()
    assert r["tokens"] == st_model.tokenizer(text)["input_ids"]
    assert r["count"] == len(r["tokens"]) and r["max_model_len"] == 256
    bare = server.post("/tokenize", json={"prompt": text, "add_special_tokens": False}).json()
    assert bare["count"] == r["count"] - 2
    back = server.post("/detokenize", json={"tokens": bare["tokens"]}).json()["prompt"]
    assert back == st_model.tokenizer.decode(bare["tokens"])
    again = server.post("/tokenize", json={"prompt": back, "add_special_tokens": False}).json()
    assert again["tokens"] == bare["tokens"]


def test_models_report_their_kind(classifier_server: Served, cross_encoder_server: Served) -> None:
    assert classifier_server.get("/v1/models").json()["data"][0]["kind"] == "classification"
    assert cross_encoder_server.get("/v1/models").json()["data"][0]["kind"] == "cross-encoder"


@pytest.mark.parametrize(
    ("route", "body", "words"),
    [
        ("/score", {"text_1": QUERY}, ["text_2"]),
        ("/score", {"text_1": [QUERY, QUERY, QUERY], "text_2": DOCS}, ["3 inputs", "4"]),
        ("/score", {"text_1": [], "text_2": DOCS}, ["text_1", "empty"]),
        ("/rerank", {"documents": DOCS}, ["query"]),
        ("/rerank", {"query": QUERY}, ["documents"]),
        ("/rerank", {"query": QUERY, "documents": []}, ["documents", "empty"]),
        ("/rerank", {"query": QUERY, "documents": DOCS, "top_n": 0}, ["top_n"]),
        ("/rerank", {"query": QUERY, "documents": DOCS, "top_n": -2}, ["top_n"]),
        ("/classify", {"input": []}, ["empty"]),
        ("/v1/embeddings", {"input": "x"}, ["/v1/embeddings", "cross-encoder"]),
        ("/detokenize", {"tokens": [999999]}, ["999999"]),
    ],
)
def test_bad_input_on_new_routes(cross_encoder_server: Served, route: str, body: dict, words: list) -> None:  # type: ignore[type-arg]
    assert_openai_error(cross_encoder_server.post(route, json=body), 400, *words)


def test_routes_the_model_cannot_serve(server: Served, classifier_server: Served) -> None:
    assert_openai_error(server.post("/classify", json={"input": "x"}), 400, "'embedding'")
    assert_openai_error(classifier_server.post("/score", json={"text_1": "a", "text_2": "b"}), 400, "'classification'")
    tei = classifier_server.post("/embed", json={"inputs": "a"})
    assert tei.status_code == 400 and "'classification'" in tei.json()["error"]  # TEI's error shape


def test_tei_embed_all_gives_every_tokens_hidden_state(server: Served, model_dir: Path) -> None:
    """/embed_all answers, per input, the model's last hidden state for each of its tokens."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    texts = [DOCS[0], "short", DOCS[2]]
    r = server.post("/embed_all", json={"inputs": texts})
    assert r.status_code == 200, r.text
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir).eval()
    for text, got in zip(texts, r.json(), strict=True):
        with torch.inference_mode():
            expected = model(**tokenizer(text, return_tensors="pt")).last_hidden_state[0].numpy()
        np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)
    pooled = server.post("/embed", json={"inputs": texts}).json()  # the same batch kinds still pool
    assert len(pooled) == 3 and len(pooled[0]) == 384
    tokens = sum(len(tokenizer(t)["input_ids"]) for t in texts)
    assert len(r.content) <= tokens * 384 * 16  # what the response budget counts per token


def test_tei_embed_all_past_the_response_budget_is_a_400_before_any_engine_work(server: Served) -> None:
    """400 inputs of ~240 tokens would answer ~600 MB of JSON from a 0.5 MB body: refused with the
    setting named, in TEI's shape, and no engine batch runs for it."""

    def batches() -> str:
        return next(
            line for line in server.get("/metrics").text.splitlines() if line.startswith("warmpool_batch_size_count")
        )

    before = batches()
    r = server.post("/embed_all", json={"inputs": ["warm " * 240] * 400})
    assert r.status_code == 400 and r.json()["error_type"] == "validation"
    assert "WARMPOOL_MAX_RESPONSE_BYTES" in r.json()["error"]
    assert batches() == before
