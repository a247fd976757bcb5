"""Models of the native families beyond BERT behind a real server: sentence-transformers' numbers over
HTTP, on the native backend, with nothing of transformers preloaded. (tests/unit/test_families.py checks
exactness case by case in-process; these check the served path once per family.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.server_process import ServerProcess
from tests.tiny_models import TinyFolders

TEXTS = ["", "Hello world", "naïve café 日本語 🙂 Привет мир", "the warm pool engine keeps models loaded " * 20]
QUERY = "what is a warm pool"
DOCS = ["Hello world, the warm pool model", "日本語のテキスト", "naïve café " * 40, ""]


def serve(folder: Path, log: Path) -> ServerProcess:
    """A ready server for `folder`, checked to run it natively with only the engine preloaded."""
    server = ServerProcess(folder, log).wait_ready()
    assert server.phase("engine")["detail"]["backend"] == "native"
    assert server.phase("forkserver")["detail"]["preload"] == ["engine.process", "engine.forkserver_preload"]
    return server


def score_and_rerank(server: ServerProcess) -> tuple[list[float], dict[int, float]]:
    """/score's scores of QUERY against DOCS, and /rerank's by document index."""
    r = server.post("/score", json={"text_1": QUERY, "text_2": DOCS, "truncate_prompt_tokens": -1})
    assert r.status_code == 200, r.text
    scores = [d["score"] for d in r.json()["data"]]
    r = server.post("/rerank", json={"query": QUERY, "documents": DOCS, "truncate_prompt_tokens": -1})
    assert r.status_code == 200, r.text
    return scores, {d["index"]: d["relevance_score"] for d in r.json()["results"]}


@pytest.mark.parametrize(
    ("name", "prompt"),
    [
        ("xlm-roberta", None),
        ("mpnet", None),
        ("modernbert", None),
        ("embeddinggemma", "query"),
        ("nomic-bert", "document"),
        ("gte", None),
        ("qwen3", "query"),
    ],
)
def test_embeddings_equal_sentence_transformers(
    tiny: TinyFolders, tmp_path: Path, name: str, prompt: str | None
) -> None:
    """/v1/embeddings of an XLM-RoBERTa folder (CLS pooling, a Dense module, Normalize), an MPNet one
    (mean pooling, a residual Dense module, Normalize), a ModernBERT one (mean pooling, a Dense module,
    Normalize), an EmbeddingGemma one (mean pooling, two Dense modules, Normalize; its query prompt by
    prompt_name), a NomicBERT one (mean pooling, Normalize; its document prompt), a GTE one (CLS pooling,
    Normalize) and a Qwen3-Embedding one (last token, Normalize; its instruction prompt) equal
    SentenceTransformer.encode within 1e-5, a text cut at the model's maximum length included."""
    from sentence_transformers import SentenceTransformer

    server = serve(tiny[name], tmp_path / "server.log")
    try:
        body = {"input": TEXTS, "truncate_prompt_tokens": -1, **({"prompt_name": prompt} if prompt else {})}
        r = server.post("/v1/embeddings", json=body)
        assert r.status_code == 200, r.text
        got = np.asarray([d["embedding"] for d in r.json()["data"]])
    finally:
        assert server.stop() == 0
    expected = SentenceTransformer(str(tiny[name]), device="cpu").encode(TEXTS, prompt_name=prompt)
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)


def test_reranker_scores_equal_cross_encoder(tiny: TinyFolders, tmp_path: Path) -> None:
    """/score and /rerank of an XLM-RoBERTa reranker give CrossEncoder.predict's scores within 1e-5, a pair
    cut at the model's maximum length included."""
    from sentence_transformers import CrossEncoder

    folder = tiny["xlm-roberta-reranker"]
    server = serve(folder, tmp_path / "server.log")
    try:
        scores, ranked = score_and_rerank(server)
    finally:
        assert server.stop() == 0
    expected = CrossEncoder(str(folder), device="cpu").predict([(QUERY, doc) for doc in DOCS])
    np.testing.assert_allclose(scores, expected, atol=1e-5, rtol=0)
    np.testing.assert_allclose([ranked[i] for i in range(len(DOCS))], expected, atol=1e-5, rtol=0)


def test_qwen3_reranker_scores_equal_the_model_cards(tiny: TinyFolders, tmp_path: Path) -> None:
    """/score and /rerank of a Qwen3-Reranker folder (Qwen3ForCausalLM, no sentence-transformers modules)
    give the model card's P(yes) over its prompt, computed with transformers, within 1e-5, a pair cut at
    the model's maximum length included."""
    from tests.qwen3_reference import model_card_prompts, model_card_scores

    folder = tiny["qwen3-reranker"]
    server = serve(folder, tmp_path / "server.log")
    try:
        scores, ranked = score_and_rerank(server)
        limit = server.get("/v1/models").json()["data"][0]["max_model_len"]
    finally:
        assert server.stop() == 0
    prompts = model_card_prompts(folder, [(QUERY, doc) for doc in DOCS], limit)
    assert max(len(ids) for ids in prompts) == limit  # the long document was cut
    expected = model_card_scores(folder, prompts)
    np.testing.assert_allclose(scores, expected, atol=1e-5, rtol=0)
    np.testing.assert_allclose([ranked[i] for i in range(len(DOCS))], expected, atol=1e-5, rtol=0)
