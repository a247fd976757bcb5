"""Long documents in rerank and score (`long_inputs: "chunk"`): each document longer than the room its
query leaves is scored as overlapping passages, and takes the best passage's score (or the mean);
each result names its passage's character span. Checked against the reference libraries scoring
each passage alone: CrossEncoder for a cross-encoder, SentenceTransformer's cosine for a bi-encoder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from transformers import AutoTokenizer

from tests.server_process import Served

QUERY = "When was the tower finished?"
FILLER = [
    "Bananas are yellow and grow in warm places.",
    "The river floods every spring after the snow melts.",
    "A violin has four strings tuned in fifths.",
    "Most cats sleep for more than twelve hours a day.",
]
ANSWER = "The Eiffel Tower was finished in 1889 for the World's Fair."


def long_document(repeats: int, answer_at: int) -> str:
    sentences = [FILLER[i % len(FILLER)] for i in range(repeats)]
    sentences.insert(answer_at, ANSWER)
    return " ".join(sentences)


DOCS = [long_document(60, 45), "Bananas are yellow.", long_document(40, 3)]
OVERLAP = 32  # the documented rule: server/texts/passages.py


def passages(folder: Path, max_len: int, beside: int, text: str) -> list[tuple[int, int]]:
    """The documented cut, made with transformers' tokenizer: windows of (max_len - beside - 8) tokens
    (a 16th of a smaller window), each repeating the last OVERLAP of the one before, as character spans."""
    offsets = AutoTokenizer.from_pretrained(folder)(text, add_special_tokens=False, return_offsets_mapping=True)[
        "offset_mapping"
    ]
    room = max_len - beside - min(8, max_len // 16)
    if len(offsets) <= room:
        return [(0, len(text))]
    spans, start = [], 0
    while True:
        end = min(start + room, len(offsets))
        spans.append((offsets[start][0], offsets[end - 1][1]))
        if end == len(offsets):
            return spans
        start = end - min(OVERLAP, room // 2)


def max_len(server: Served) -> int:
    return int(server.get("/v1/models").json()["data"][0]["max_model_len"])


def expected(scores: dict[int, list[float]], spans: dict[int, list[tuple[int, int]]], how: str) -> dict[int, Any]:
    return {i: (max(s) if how == "max" else float(np.mean(s)), spans[i][int(np.argmax(s))]) for i, s in scores.items()}


@pytest.mark.parametrize("how", ["max", "mean"])
def test_cross_encoder_scores_a_long_document_by_its_passages(
    cross_encoder_server: Served, cross_encoder_dir: Path, how: str
) -> None:
    from sentence_transformers import CrossEncoder

    reference = CrossEncoder(str(cross_encoder_dir), max_length=max_len(cross_encoder_server))
    query_tokens = len(AutoTokenizer.from_pretrained(cross_encoder_dir)(QUERY, add_special_tokens=False)["input_ids"])
    spans = {
        i: passages(cross_encoder_dir, max_len(cross_encoder_server), query_tokens + 3, d) for i, d in enumerate(DOCS)
    }
    assert len(spans[0]) > 2 and len(spans[1]) == 1  # the long ones are cut, the short one is not
    scores = {i: [float(x) for x in reference.predict([(QUERY, DOCS[i][a:b]) for a, b in s])] for i, s in spans.items()}
    want = expected(scores, spans, how)
    body = {"query": QUERY, "documents": DOCS, "long_inputs": "chunk", "passage_scoring": how}
    answer = cross_encoder_server.post("/v1/rerank", json=body)
    assert answer.status_code == 200, answer.text
    for result in answer.json()["results"]:
        score, (start, end) = want[result["index"]]
        assert result["relevance_score"] == pytest.approx(score, abs=1e-5)
        assert result["passage"] == {"start": start, "end": end}


def test_the_winning_passage_holds_the_answer(server: Served) -> None:
    """On the trained all-MiniLM-L6-v2, in TEI's shape: each ranked entry names its passage."""
    answer = server.post("/rerank", json={"query": QUERY, "texts": DOCS[:1], "long_inputs": "chunk"})
    assert answer.status_code == 200, answer.text
    (best,) = answer.json()
    assert ANSWER in DOCS[0][best["passage"]["start"] : best["passage"]["end"]]


def test_a_bi_encoder_scores_a_long_document_by_its_best_passage(server: Served, model_dir: Path, st_model) -> None:  # type: ignore[no-untyped-def]
    spans = {i: passages(model_dir, max_len(server), 2, d) for i, d in enumerate(DOCS)}
    query = st_model.encode([QUERY], normalize_embeddings=True)[0]
    scores = {
        i: [float(v @ query) for v in st_model.encode([DOCS[i][a:b] for a, b in s], normalize_embeddings=True)]
        for i, s in spans.items()
    }
    want = expected(scores, spans, "max")
    answer = server.post("/score", json={"text_1": QUERY, "text_2": DOCS, "long_inputs": "chunk"})
    assert answer.status_code == 200, answer.text
    for item in answer.json()["data"]:
        score, (start, end) = want[item["index"]]
        assert item["score"] == pytest.approx(score, abs=1e-5)
        assert item["passage"] == {"start": start, "end": end}


def test_without_chunk_a_long_document_is_still_refused(cross_encoder_server: Served) -> None:
    answer = cross_encoder_server.post("/v1/rerank", json={"query": QUERY, "documents": DOCS})
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "documents", answer.text


def test_a_document_past_the_window_bound_is_a_400(cross_encoder_server: Served) -> None:
    """WARMPOOL_MAX_WINDOWS (64) bounds a document's passages, counted before any is made."""
    huge = long_document(2000, 0)
    body = {"query": QUERY, "documents": ["short", huge], "long_inputs": "chunk"}
    answer = cross_encoder_server.post("/v1/rerank", json=body)
    assert answer.status_code == 400, answer.text
    assert (
        "documents[1]" in answer.json()["error"]["message"]
        and "WARMPOOL_MAX_WINDOWS" in answer.json()["error"]["message"]
    )
