"""LoRA adapters of a SPLADE and a ColBERT model over HTTP (WARMPOOL_ADAPTERS): a request naming the
adapter gets SparseEncoder + PEFT's weights (MultiVectorEncoder + PEFT's token vectors) on each surface
that names a model; requests of the base and of the adapter sent together each get their own model's."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.app.inprocess import InProcessServer, serving
from tests.lora_adapters import build_adapter, multi_vector_reference, sparse_reference

TEXTS = ["Hello world, the warm pool model", "a", "naïve café 🙂"]
QUERY = "what keeps the warm pool model loaded?"
DOCS = ["the warm pool keeps models loaded; engines restart.", "Hello, world!", "a model of the text"]


@pytest.fixture(scope="module")
def splade_adapter(splade_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    targets = ["query", "value", "intermediate.dense", "transform.dense", "decoder"]  # the masked-LM head's too
    return build_adapter(
        tmp_path_factory.mktemp("adapters") / "legal", splade_dir, 1, encoder="SparseEncoder", target_modules=targets
    )


@pytest.fixture(scope="module")
def colbert_adapter(colbert_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_adapter(tmp_path_factory.mktemp("adapters") / "legal", colbert_dir, 1, encoder="MultiVectorEncoder")


@pytest.fixture(scope="module")
def splade(splade_dir: Path, splade_adapter: Path) -> Iterator[InProcessServer]:
    with serving(splade_dir, served_model_name="base", adapters=f"legal={splade_adapter}") as served:
        yield served


@pytest.fixture(scope="module")
def colbert(colbert_dir: Path, colbert_adapter: Path) -> Iterator[InProcessServer]:
    with serving(colbert_dir, served_model_name="base", adapters=f"legal={colbert_adapter}") as served:
        yield served


def sparse_rows(data: list[dict[str, Any]]) -> np.ndarray:
    out = np.zeros((len(data), 30522), dtype=np.float32)
    for row, item in enumerate(data):
        out[row, item["embedding"]["indices"]] = item["embedding"]["values"]
    return out


def together(calls: dict[str, Callable[[], Any]]) -> dict[str, Any]:
    """Each call's answer, every call sent several times at once (the engine's groups mix them): one answer
    per call when all its sends agree."""
    with ThreadPoolExecutor(8) as pool:
        sent = {name: [pool.submit(call) for _ in range(4)] for name, call in calls.items()}
        answers = {name: [future.result() for future in futures] for name, futures in sent.items()}
    for name, got in answers.items():
        for other in got[1:]:
            np.testing.assert_allclose(_flat(other), _flat(got[0]), atol=1e-5, rtol=0, err_msg=name)
    return {name: got[0] for name, got in answers.items()}


def _flat(answer: Any) -> np.ndarray:
    """An answer's numbers in one array (a list of token-vector arrays of different lengths concatenated)."""
    return np.concatenate([np.ravel(part) for part in answer]) if isinstance(answer, list) else np.asarray(answer)


def test_openai_embeddings_of_a_splade_adapter_are_peft_s(
    splade: InProcessServer, splade_dir: Path, splade_adapter: Path
) -> None:
    """/v1/embeddings naming the adapter: its {indices, values}; the base's beside it, sent together, its own."""

    def embed(model: str) -> Callable[[], Any]:
        def call() -> Any:
            r = splade.post("/v1/embeddings", json={"model": model, "input": TEXTS})
            assert r.status_code == 200, r.text
            assert r.json()["model"] == model
            return sparse_rows(r.json()["data"])

        return call

    got = together({"legal": embed("legal"), "base": embed("base")})
    expected = sparse_reference(splade_dir, splade_adapter, TEXTS)
    np.testing.assert_allclose(got["legal"], expected, atol=1e-5, rtol=0)
    np.testing.assert_allclose(got["base"], sparse_reference(splade_dir, None, TEXTS), atol=1e-5, rtol=0)
    assert np.abs(got["legal"] - got["base"]).max() > 1e-2


def test_score_of_a_splade_adapter_is_the_dot_product_of_its_weights(
    splade: InProcessServer, splade_dir: Path, splade_adapter: Path
) -> None:
    r = splade.post("/score", json={"model": "legal", "text_1": TEXTS[0], "text_2": TEXTS[1:]})
    assert r.status_code == 200, r.text
    weights = sparse_reference(splade_dir, splade_adapter, TEXTS)
    np.testing.assert_allclose([d["score"] for d in r.json()["data"]], weights[1:] @ weights[0], rtol=1e-5)


def test_pooling_of_a_colbert_adapter_is_peft_s_token_vectors(
    colbert: InProcessServer, colbert_dir: Path, colbert_adapter: Path
) -> None:
    """vLLM's /pooling naming the adapter: documents' and queries' token vectors; the base's, sent together,
    its own."""

    def pooled(model: str, extra: dict[str, Any]) -> Callable[[], Any]:
        def call() -> Any:
            r = colbert.post("/pooling", json={"model": model, "input": DOCS, **extra})
            assert r.status_code == 200, r.text
            return [np.asarray(d["data"], dtype=np.float32) for d in r.json()["data"]]

        return call

    query = {"input_type": "search_query"}
    got = together(
        {
            "legal documents": pooled("legal", {}),
            "legal queries": pooled("legal", query),
            "base documents": pooled("base", {}),
        }
    )
    for name, adapter, role in (
        ("legal documents", colbert_adapter, "document"),
        ("legal queries", colbert_adapter, "query"),
        ("base documents", None, "document"),
    ):
        expected = multi_vector_reference(colbert_dir, adapter, DOCS, role)
        assert [g.shape for g in got[name]] == [e.shape for e in expected], name
        for g, e in zip(got[name], expected, strict=True):
            np.testing.assert_allclose(g, e, atol=1e-5, rtol=0, err_msg=name)


def test_score_and_rerank_of_a_colbert_adapter_are_maxsim_of_its_vectors(
    colbert: InProcessServer, colbert_dir: Path, colbert_adapter: Path
) -> None:
    query = multi_vector_reference(colbert_dir, colbert_adapter, [QUERY], "query")[0]
    documents = multi_vector_reference(colbert_dir, colbert_adapter, DOCS, "document")
    expected = np.array([(query @ d.T).max(axis=1).sum() for d in documents])
    r = colbert.post("/score", json={"model": "legal", "text_1": QUERY, "text_2": DOCS})
    assert r.status_code == 200, r.text
    np.testing.assert_allclose([d["score"] for d in r.json()["data"]], expected, atol=1e-4)
    r = colbert.post("/rerank", json={"model": "legal", "query": QUERY, "documents": DOCS})
    assert r.status_code == 200, r.text
    order = [x["index"] for x in r.json()["results"]]
    assert order == list(np.argsort(-expected, kind="stable"))
    np.testing.assert_allclose([x["relevance_score"] for x in r.json()["results"]], expected[order], atol=1e-4)
