"""Long inputs on a real server: refused by default, truncated as sentence-transformers truncates,
or chunked into overlapping windows whose token-weighted mean is the vector (checked against the
windows computed here with the tokenizer's own overflow and embedded one by one)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from tests.server_process import Served

LONG = " ".join(f"sentence {i} about warm pools and the engines that serve them." for i in range(60))


def windows(model_dir: Path, text: str, max_tokens: int = 256, overlap: int = 32) -> list[list[int]]:
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tokenizer.no_padding()  # as the server's: a tokenizer.json may pad
    tokenizer.enable_truncation(max_length=max_tokens, stride=overlap)
    encoding = tokenizer.encode(text)
    return [encoding.ids, *(o.ids for o in encoding.overflowing)]


def test_a_long_text_is_refused_by_default_and_truncated_when_asked(server: Served, st_model) -> None:  # type: ignore[no-untyped-def]
    """Without an option a text past the model's 256 tokens is a 400; `long_inputs: truncate` gives
    sentence-transformers' vector of it (which cuts at max_seq_length)."""
    refused = server.post("/v1/embeddings", json={"input": LONG})
    assert refused.status_code == 400 and "256" in refused.json()["error"]["message"]
    cut = server.post("/v1/embeddings", json={"input": LONG, "long_inputs": "truncate"})
    np.testing.assert_allclose(cut.json()["data"][0]["embedding"], st_model.encode(LONG), atol=1e-5, rtol=0)


def test_a_chunked_text_is_the_token_weighted_mean_of_its_windows(server: Served, model_dir: Path) -> None:
    """`long_inputs: chunk`: the vector is the normalised token-weighted mean of its overlapping
    windows' pooled vectors, each window embedded alone (/pooling on its token ids); usage counts
    every window's tokens; a short text beside it is embedded as it always is."""
    ids = windows(model_dir, LONG)
    assert len(ids) >= 3 and all(len(w) <= 256 for w in ids)
    pooled = np.asarray([server.post("/pooling", json={"input": w}).json()["data"][0]["data"] for w in ids])
    lengths = np.asarray([len(w) for w in ids], dtype=np.float64)[:, None]
    mean = (pooled * lengths).sum(axis=0) / lengths.sum()
    expected = mean / np.linalg.norm(mean)
    r = server.post("/v1/embeddings", json={"input": [LONG, "short"], "long_inputs": "chunk"})
    assert r.status_code == 200, r.text
    got = r.json()
    np.testing.assert_allclose(got["data"][0]["embedding"], expected, atol=1e-5, rtol=0)
    short = server.post("/v1/embeddings", json={"input": "short"}).json()["data"][0]["embedding"]
    np.testing.assert_allclose(got["data"][1]["embedding"], short, atol=1e-6, rtol=0)
    assert got["usage"]["prompt_tokens"] == sum(len(w) for w in ids) + 3
    tei = server.post("/embed", json={"inputs": LONG, "long_inputs": "chunk"}).json()
    np.testing.assert_allclose(tei[0], expected, atol=1e-5, rtol=0)


def test_tokenize_counts_a_text_far_longer_than_the_model_takes(server: Served, model_dir: Path) -> None:
    """vLLM's /tokenize counts a text of any length the body limit admits (1 MiB here, ~260,000
    tokens), as clients do to size their chunks; the count is the tokenizer's."""
    text = LONG * 300
    assert len(text) > 1_000_000
    r = server.post("/tokenize", json={"prompt": text})
    assert r.status_code == 200, r.text
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    expected = tokenizer.encode(text).ids
    assert r.json()["count"] == len(expected) and r.json()["tokens"] == expected


def chunk_means(chunks: list[str], windows_: list[tuple[list[int | None], np.ndarray]]) -> np.ndarray:
    """By hand: each chunk's mean over every window of the states of the tokens starting inside it."""
    starts = np.cumsum([0, *(len(c) for c in chunks)])
    sums, counts = np.zeros((len(chunks), windows_[0][1].shape[1])), np.zeros(len(chunks))
    for offsets, states in windows_:
        for offset, state in zip(offsets, states, strict=True):
            if offset is not None:
                owner = int(np.searchsorted(starts, offset, side="right")) - 1
                sums[owner] += state
                counts[owner] += 1
    means = sums / counts[:, None]
    return means / np.linalg.norm(means, axis=1, keepdims=True)  # type: ignore[no-any-return]


def offsets_of(
    model_dir: Path, text: str, max_tokens: int = 256, overlap: int = 32
) -> list[tuple[list[int], list[int | None]]]:
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=max_tokens, stride=overlap)
    encoding = tokenizer.encode(text)
    return [
        (
            e.ids,
            [None if special else start for (start, _), special in zip(e.offsets, e.special_tokens_mask, strict=True)],
        )
        for e in (encoding, *encoding.overflowing)
    ]


def test_late_chunking_pools_each_chunk_from_the_whole_documents_token_states(  # type: ignore[no-untyped-def]
    server: Served, model_dir: Path, st_model
) -> None:
    """`late_chunking`: the chunks are joined and encoded once; each chunk's vector is the normalised
    mean of its own tokens' states (sentence-transformers' token embeddings of the whole text),
    which differs from embedding the chunk alone."""
    chunks = ["The warm pool keeps models loaded. ", "Engines restart in a second. ", "Probes answer at once."]
    ((_, offsets),) = offsets_of(model_dir, "".join(chunks))
    states = st_model.encode("".join(chunks), output_value="token_embeddings").numpy()
    expected = chunk_means(chunks, [(offsets, states)])
    r = server.post("/v1/embeddings", json={"input": chunks, "late_chunking": True})
    assert r.status_code == 200, r.text
    got = np.asarray([d["embedding"] for d in r.json()["data"]])
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)
    alone = np.asarray(st_model.encode(chunks))
    assert np.abs(got - alone).max() > 0.01  # the context moved them


def test_late_chunking_a_document_longer_than_the_model_uses_every_window(server: Served, model_dir: Path) -> None:
    """A document past 256 tokens is encoded as overlapping windows; a chunk's tokens are pooled
    from every window holding them (each window's states from /embed_all on its token ids)."""
    sentences = [s + "." for s in LONG.split(".") if s.strip()]
    found = offsets_of(model_dir, "".join(sentences))
    assert len(found) >= 3
    states = [np.asarray(server.post("/embed_all", json={"inputs": ids}).json()[0]) for ids, _ in found]
    expected = chunk_means(sentences, [(offsets, s) for (_, offsets), s in zip(found, states, strict=True)])
    r = server.post("/v1/embeddings", json={"input": sentences, "late_chunking": True})
    assert r.status_code == 200, r.text
    assert len(r.json()["data"]) == len(sentences)
    np.testing.assert_allclose([d["embedding"] for d in r.json()["data"]], expected, atol=1e-5, rtol=0)


def test_late_chunking_refuses_what_it_cannot_pool(server: Served, classifier_server: Served) -> None:
    """A chunk without a token of its own, a single text and options it does not combine with are
    400s naming the field; a model that is not mean-pooled says so."""
    for body, field in (
        ({"input": ["the warm pool", ""], "late_chunking": True}, "input"),
        ({"input": "one text", "late_chunking": True}, "input"),
        ({"input": ["a", "b"], "late_chunking": True, "long_inputs": "chunk"}, "late_chunking"),
    ):
        r = server.post("/v1/embeddings", json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
    r = classifier_server.post("/v1/embeddings", json={"input": ["a", "b"], "late_chunking": True})
    assert r.status_code == 400, r.text


def test_cohere_embed_chunks_a_long_text_when_asked(server: Served) -> None:
    """Cohere's /v2/embed with `long_inputs: chunk` gives /v1/embeddings' chunked vector; without
    it Cohere's default truncation (END) still cuts the text."""
    chunked = server.post("/v1/embeddings", json={"input": LONG, "long_inputs": "chunk"}).json()["data"][0]["embedding"]
    r = server.post("/v2/embed", json={"texts": [LONG], "long_inputs": "chunk", "embedding_types": ["float"]})
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(r.json()["embeddings"]["float"][0], chunked, atol=1e-6, rtol=0)
    cut = server.post("/v1/embeddings", json={"input": LONG, "long_inputs": "truncate"}).json()["data"][0]["embedding"]
    r = server.post("/v2/embed", json={"texts": [LONG], "embedding_types": ["float"]})
    np.testing.assert_allclose(r.json()["embeddings"]["float"][0], cut, atol=1e-6, rtol=0)
