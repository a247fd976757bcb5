"""Models of the native families beyond BERT behind one real server (a model each): sentence-transformers' numbers over
HTTP, on the native backend, with nothing of transformers preloaded. (tests/unit/test_families.py checks
exactness case by case in-process; these check the served path once per family.)"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from tests.server_process import ServerProcess
from tests.tiny_models import TinyFolders

TEXTS = ["", "Hello world", "naïve café 日本語 🙂 Привет мир", "the warm pool engine keeps models loaded " * 20]
QUERY = "what is a warm pool"
DOCS = ["Hello world, the warm pool model", "日本語のテキスト", "naïve café " * 40, ""]


EMBEDDERS = {"xlm-roberta": None, "mpnet": None, "modernbert": None, "embeddinggemma": "query"}
EMBEDDERS |= {"nomic-bert": "document", "gte": None, "qwen3": "query"}
RERANKERS = ("xlm-roberta-reranker", "qwen3-reranker")


@pytest.fixture(scope="module")
def served(tiny: TinyFolders, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One ready server for every family's folder (one engine each, each model by its folder's name),
    checked to run each natively with only the engine preloaded."""
    names = [*EMBEDDERS, *RERANKERS]
    models = ",".join(f"{name}={tiny[name]}" for name in names)
    log = tmp_path_factory.mktemp("families") / "server.log"
    server = ServerProcess(tiny[names[0]], log, models=models, engines=1).wait_ready()
    try:
        assert server.phase("forkserver")["detail"]["preload"] == ["engine.process", "engine.forkserver_preload"]
        for name in names:
            assert server.phase(f"engine:{name}")["detail"]["backend"] == "native", name
        yield server
    finally:
        assert server.stop() == 0


def score_and_rerank(server: ServerProcess, model: str) -> tuple[list[float], dict[int, float]]:
    """/score's scores of QUERY against DOCS, and /rerank's by document index, from `model`."""
    body = {"model": model, "truncate_prompt_tokens": -1}
    r = server.post("/score", json={"text_1": QUERY, "text_2": DOCS, **body})
    assert r.status_code == 200, r.text
    scores = [d["score"] for d in r.json()["data"]]
    r = server.post("/rerank", json={"query": QUERY, "documents": DOCS, **body})
    assert r.status_code == 200, r.text
    return scores, {d["index"]: d["relevance_score"] for d in r.json()["results"]}


@pytest.mark.parametrize(("name", "prompt"), EMBEDDERS.items())
def test_embeddings_equal_sentence_transformers(
    served: ServerProcess, tiny: TinyFolders, name: str, prompt: str | None
) -> None:
    """/v1/embeddings of an XLM-RoBERTa folder (CLS pooling, a Dense module, Normalize), an MPNet one
    (mean pooling, a residual Dense module, Normalize), a ModernBERT one (mean pooling, a Dense module,
    Normalize), an EmbeddingGemma one (mean pooling, two Dense modules, Normalize; its query prompt by
    prompt_name), a NomicBERT one (mean pooling, Normalize; its document prompt), a GTE one (CLS pooling,
    Normalize) and a Qwen3-Embedding one (last token, Normalize; its instruction prompt) equal
    SentenceTransformer.encode within 1e-5, a text cut at the model's maximum length included."""
    from sentence_transformers import SentenceTransformer

    body = {"input": TEXTS, "model": name, "truncate_prompt_tokens": -1, **({"prompt_name": prompt} if prompt else {})}
    r = served.post("/v1/embeddings", json=body)
    assert r.status_code == 200, r.text
    got = np.asarray([d["embedding"] for d in r.json()["data"]])
    expected = SentenceTransformer(str(tiny[name]), device="cpu").encode(TEXTS, prompt_name=prompt)
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)


def test_reranker_scores_equal_cross_encoder(served: ServerProcess, tiny: TinyFolders) -> None:
    """/score and /rerank of an XLM-RoBERTa reranker give CrossEncoder.predict's scores within 1e-5, a pair
    cut at the model's maximum length included."""
    from sentence_transformers import CrossEncoder

    folder = tiny["xlm-roberta-reranker"]
    scores, ranked = score_and_rerank(served, "xlm-roberta-reranker")
    expected = CrossEncoder(str(folder), device="cpu").predict([(QUERY, doc) for doc in DOCS])
    np.testing.assert_allclose(scores, expected, atol=1e-5, rtol=0)
    np.testing.assert_allclose([ranked[i] for i in range(len(DOCS))], expected, atol=1e-5, rtol=0)


def test_qwen3_reranker_scores_equal_the_model_cards(served: ServerProcess, tiny: TinyFolders) -> None:
    """/score and /rerank of a Qwen3-Reranker folder (Qwen3ForCausalLM, no sentence-transformers modules)
    give the model card's P(yes) over its prompt, computed with transformers, within 1e-5, a pair cut at
    the model's maximum length included."""
    from tests.qwen3_reference import model_card_prompts, model_card_scores

    folder = tiny["qwen3-reranker"]
    scores, ranked = score_and_rerank(served, "qwen3-reranker")
    limit = next(m for m in served.get("/v1/models").json()["data"] if m["id"] == "qwen3-reranker")["max_model_len"]
    prompts = model_card_prompts(folder, [(QUERY, doc) for doc in DOCS], limit)
    assert max(len(ids) for ids in prompts) == limit  # the long document was cut
    expected = model_card_scores(folder, prompts)
    np.testing.assert_allclose(scores, expected, atol=1e-5, rtol=0)
    np.testing.assert_allclose([ranked[i] for i in range(len(DOCS))], expected, atol=1e-5, rtol=0)
