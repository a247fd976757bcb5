"""Adapters of rerankers and classifiers over HTTP (WARMPOOL_ADAPTERS), each with the head it trained
(PEFT's modules_to_save): /score and /v1/rerank answer transformers + PEFT's logits through the
sigmoid (as CrossEncoder scores), /classify their softmax with the base's labels; loaded at run time
too (POST /admin/adapters/{name}/load), where a head of another label count is a 400 saying so."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.app.inprocess import InProcessServer, serving
from tests.lora_adapters import build_head_adapter, text_reference

QUERY = "what is the warm pool"
DOCS = ["the warm pool keeps engines ready", "a cold start", "naïve café 日本語", "engines in a warm pool " * 6]
TEXTS = ["I loved it", "the worst", "it was fine I guess", "naïve café"]


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.fixture(scope="module")
def root(cross_encoder_dir: Path, classifier_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reranker's adapters (`tuned` at the start, `late` at run time) and a 3-label classifier's (the
    reranker's shapes but its labels)."""
    root = tmp_path_factory.mktemp("adapter-root")
    build_head_adapter(root / "tuned", cross_encoder_dir, seed=1)
    build_head_adapter(root / "late", cross_encoder_dir, seed=3, r=2)
    build_head_adapter(root / "three-labels", classifier_dir, seed=1)
    return root


@pytest.fixture(scope="module")
def reranker_adapter(root: Path) -> Path:
    return root / "tuned"


@pytest.fixture(scope="module")
def reranker(cross_encoder_dir: Path, root: Path) -> Iterator[InProcessServer]:
    with serving(
        cross_encoder_dir, served_model_name="base", adapters=f"tuned={root / 'tuned'}", adapter_root=str(root)
    ) as served:
        yield served


def test_score_of_a_reranker_adapter_is_peft_s_sigmoid(
    reranker: InProcessServer, cross_encoder_dir: Path, reranker_adapter: Path
) -> None:
    r = reranker.post("/score", json={"model": "tuned", "text_1": QUERY, "text_2": DOCS})
    assert r.status_code == 200, r.text
    expected = sigmoid(text_reference(cross_encoder_dir, reranker_adapter, [QUERY] * len(DOCS), DOCS)[:, 0])
    np.testing.assert_allclose([d["score"] for d in r.json()["data"]], expected, atol=1e-5, rtol=0)
    base = reranker.post("/score", json={"model": "base", "text_1": QUERY, "text_2": DOCS}).json()["data"]
    assert np.abs(np.array([d["score"] for d in base]) - expected).max() > 1e-3  # the base keeps its own


def test_rerank_with_a_reranker_adapter_orders_by_peft_s_scores(
    reranker: InProcessServer, cross_encoder_dir: Path, reranker_adapter: Path
) -> None:
    r = reranker.post("/v1/rerank", json={"model": "tuned", "query": QUERY, "documents": DOCS})
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "tuned"
    expected = sigmoid(text_reference(cross_encoder_dir, reranker_adapter, [QUERY] * len(DOCS), DOCS)[:, 0])
    results = r.json()["results"]
    assert [x["index"] for x in results] == list(np.argsort(-expected, kind="stable"))
    np.testing.assert_allclose([x["relevance_score"] for x in results], sorted(expected, reverse=True), atol=1e-5)


def test_classify_with_a_classifier_adapter_is_peft_s_softmax(classifier_dir: Path, tmp_path: Path) -> None:
    adapter = build_head_adapter(tmp_path / "tuned", classifier_dir, seed=2)
    with serving(classifier_dir, served_model_name="base", adapters=f"tuned={adapter}") as served:
        r = served.post("/classify", json={"model": "tuned", "input": TEXTS})
    assert r.status_code == 200, r.text
    expected = softmax(text_reference(classifier_dir, adapter, TEXTS))
    data = r.json()["data"]
    np.testing.assert_allclose([d["probs"] for d in data], expected, atol=1e-5, rtol=0)
    assert [d["label"] for d in data] == [["negative", "neutral", "positive"][i] for i in expected.argmax(axis=1)]


def test_a_reranker_adapter_loaded_at_run_time_scores_as_peft(
    reranker: InProcessServer, cross_encoder_dir: Path, root: Path
) -> None:
    r = reranker.post("/admin/adapters/late/load", json={"path": "late"})
    assert r.status_code == 200, r.text
    r = reranker.post("/score", json={"model": "late", "text_1": QUERY, "text_2": DOCS})
    assert r.status_code == 200, r.text
    expected = sigmoid(text_reference(cross_encoder_dir, root / "late", [QUERY] * len(DOCS), DOCS)[:, 0])
    np.testing.assert_allclose([d["score"] for d in r.json()["data"]], expected, atol=1e-5, rtol=0)


def test_a_head_of_another_label_count_is_a_400_at_run_time(reranker: InProcessServer) -> None:
    r = reranker.post("/admin/adapters/three-labels/load", json={"path": "three-labels"})
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert "adapter 'three-labels'" in message and "classifier.weight is [3, 32]" in message, message
    assert "another label count" in message
    assert "three-labels" not in {card["id"] for card in reranker.get("/v1/models").json()["data"]}
