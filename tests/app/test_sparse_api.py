"""A SPLADE model served over HTTP: TEI's /embed_sparse and /v1/embeddings' {indices, values} give
SparseEncoder's weights; pruning by top_k and threshold; a dense model's /embed_sparse is a clear 400."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.app.inprocess import serving
from tests.server_process import Served
from tests.vectors import same_entries

TEXTS = ["Hello world, the warm pool model", "a", "naïve café 🙂"]


@pytest.fixture(scope="module")
def splade_server(splade_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serving(splade_dir) as proc:
        yield proc


@pytest.fixture(scope="module")
def expected(splade_dir: Path) -> np.ndarray:
    from sentence_transformers import SparseEncoder

    encoder = SparseEncoder(str(splade_dir), device="cpu")
    return encoder.encode(TEXTS, convert_to_tensor=True).to_dense().numpy()  # type: ignore[no-any-return]


def dense(rows: list[tuple[list[int], list[float]]], width: int) -> np.ndarray:
    out = np.zeros((len(rows), width), dtype=np.float32)
    for row, (indices, values) in enumerate(rows):
        out[row, indices] = values
    return out


def test_embed_sparse_gives_sparse_encoders_weights(splade_server: Served, expected: np.ndarray) -> None:
    """TEI's shape: per input its non-zero weights as {index, value}, indices ascending, equal to
    SparseEncoder.encode's within 1e-5 and with the same entries."""
    r = splade_server.post("/embed_sparse", json={"inputs": TEXTS})
    assert r.status_code == 200, r.text
    rows = [([e["index"] for e in entries], [e["value"] for e in entries]) for entries in r.json()]
    assert all(indices == sorted(indices) and indices for indices, _ in rows)
    got = dense(rows, expected.shape[1])
    same_entries(got, expected)
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)


def test_openai_embeddings_answer_indices_and_values_pruned_as_asked(
    splade_server: Served, expected: np.ndarray
) -> None:
    """/v1/embeddings on a SPLADE model answers {indices, values} per input; top_k keeps the k largest
    weights, threshold those above it; base64 or dimensions are a 400 naming the field."""
    full = splade_server.post("/v1/embeddings", json={"input": TEXTS}).json()["data"]
    got = dense([(d["embedding"]["indices"], d["embedding"]["values"]) for d in full], expected.shape[1])
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)
    top = splade_server.post("/v1/embeddings", json={"input": TEXTS, "top_k": 5}).json()["data"]
    for d, row in zip(top, got, strict=True):  # the server's own weights: no near-tie can differ
        assert d["embedding"]["indices"] == sorted(np.argsort(-row, kind="stable")[:5].tolist())
    cut = float(np.median(got[got > 0]))
    above = splade_server.post("/v1/embeddings", json={"input": TEXTS, "threshold": cut}).json()["data"]
    assert [d["embedding"]["indices"] for d in above] == [np.flatnonzero(row > cut).tolist() for row in got]
    refused = splade_server.post("/v1/embeddings", json={"input": TEXTS, "encoding_format": "base64"})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "encoding_format"


def test_score_and_rerank_are_the_dot_product_of_the_weights(splade_server: Served, expected: np.ndarray) -> None:
    """/score and /rerank on a SPLADE model score by the dot product of the two inputs' weights,
    SparseEncoder's similarity, best first on /rerank."""
    scores = expected[0] @ expected[1:].T
    r = splade_server.post("/score", json={"text_1": TEXTS[0], "text_2": TEXTS[1:]})
    assert r.status_code == 200, r.text
    np.testing.assert_allclose([d["score"] for d in r.json()["data"]], scores, rtol=1e-5)
    ranked = splade_server.post("/rerank", json={"query": TEXTS[0], "documents": TEXTS[1:]}).json()["results"]
    assert [d["index"] for d in ranked] == np.argsort(-scores, kind="stable").tolist()


def test_a_chunked_text_is_the_maximum_of_its_windows_weights(splade_server: Served, splade_dir: Path) -> None:
    """`long_inputs: chunk` on a SPLADE model (64 tokens here): each weight is its maximum over the
    text's overlapping windows, each window's weights from /pooling on its token ids."""
    from tokenizers import Tokenizer

    text = " ".join(f"warm pool {i}" for i in range(60))
    tokenizer = Tokenizer.from_file(str(splade_dir / "tokenizer.json"))
    tokenizer.no_padding()  # the folder's tokenizer.json pads to 128, as the server's never does
    tokenizer.enable_truncation(max_length=64, stride=31)  # 32 tokens' overlap, at most half of 62
    encoding = tokenizer.encode(text)
    ids = [encoding.ids, *(o.ids for o in encoding.overflowing)]
    assert len(ids) >= 3
    per_window = [splade_server.post("/pooling", json={"input": w}).json()["data"][0]["data"] for w in ids]
    r = splade_server.post("/embed_sparse", json={"inputs": text, "long_inputs": "chunk"})
    assert r.status_code == 200, r.text
    got = dense([([e["index"] for e in r.json()[0]], [e["value"] for e in r.json()[0]])], 30522)[0]
    np.testing.assert_allclose(got, np.max(per_window, axis=0), atol=1e-6, rtol=0)


def test_info_and_models_say_sparse(splade_server: Served) -> None:
    """TEI's /info says SPLADE pooling, as TEI does for such models; /v1/models the kind, the
    vocabulary-wide dimensions and the output; the engine phase the head it loaded."""
    assert splade_server.get("/info").json()["model_type"] == {"embedding": {"pooling": "splade"}}
    card = splade_server.get("/v1/models").json()["data"][0]
    assert card["kind"] == "sparse" and card["dimensions"] == 30522
    assert card["outputs"] == ["sparse"] and card["pooling"] == "splade"
    assert splade_server.phase("engine")["detail"]["head"] == "splade (max, relu)"


def test_a_dense_model_refuses_sparse_requests_clearly(server: Served) -> None:
    """/embed_sparse on a dense model is a 400 in TEI's shape naming the kind; top_k on its
    /v1/embeddings a 400 naming top_k."""
    r = server.post("/embed_sparse", json={"inputs": "hello"})
    assert r.status_code == 400 and "sparse" in r.json()["error"] and r.json()["error_type"] == "validation"
    r = server.post("/v1/embeddings", json={"input": "hello", "top_k": 3})
    assert r.status_code == 400 and r.json()["error"]["param"] == "top_k"


def test_an_inference_free_model_encodes_queries_without_the_engine(model_dir: Path, tmp_path: Path) -> None:
    """An inference-free Router folder served: documents by the model, queries (prompt_name query)
    by their tokens' weights with no engine batch; /rerank is the dot product of the two, as
    SparseEncoder.similarity of encode_query and encode_document."""
    from sentence_transformers import SparseEncoder

    from tests.tiny_kinds import build_inference_free

    folder = build_inference_free(tmp_path / "inference-free", model_dir)
    reference = SparseEncoder(str(folder), device="cpu")
    query, documents = TEXTS[0], TEXTS[1:]
    with serving(folder) as server:
        r = server.post("/embed_sparse", json={"inputs": documents})
        got = dense([([e["index"] for e in row], [e["value"] for e in row]) for row in r.json()], 30522)
        expected = reference.encode_document(documents, convert_to_tensor=True).to_dense().numpy()
        np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)
        before = server.batches()
        r = server.post("/v1/embeddings", json={"input": [query], "prompt_name": "query"})
        assert r.status_code == 200, r.text
        assert server.batches() == before  # no forward for a query
        item = r.json()["data"][0]["embedding"]
        expected = reference.encode_query([query], convert_to_tensor=True).to_dense().numpy()
        np.testing.assert_allclose(dense([(item["indices"], item["values"])], 30522), expected, atol=1e-5, rtol=0)
        r = server.post("/rerank", json={"query": query, "documents": documents})
        scores = reference.similarity(reference.encode_query([query]), reference.encode_document(documents))
        by_index = {x["index"]: x["relevance_score"] for x in r.json()["results"]}
        np.testing.assert_allclose(
            [by_index[i] for i in range(len(documents))], scores.to_dense().numpy()[0], rtol=1e-5
        )


@pytest.mark.parametrize("encoding", ["binary", "int8"])
def test_quantized_encodings_on_a_sparse_model_are_400(splade_server: Served, encoding: str) -> None:
    """Quantized codes are a dense vector's: a SPLADE model's {indices, values} refuse them."""
    r = splade_server.post("/v1/embeddings", json={"input": TEXTS, "encoding_format": encoding})
    assert r.status_code == 400 and r.json()["error"]["param"] == "encoding_format", r.text
    assert f"encoding_format={encoding}" in r.json()["error"]["message"]
