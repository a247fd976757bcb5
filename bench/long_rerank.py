"""Reranking long documents by their best passage (`long_inputs: "chunk"`) against truncating them.

A query against `--documents` documents of about `--tokens` tokens each, on a cross-encoder (the
embedded model's encoder under a random-weight relevance head: timing only) and on the embedded bi-encoder:
the time of one /v1/rerank with `long_inputs: "chunk"` against the same with `"truncate"`, rounds
alternating. Prints the median ms of each and the ratio, with the passages the chunked request
scored. Never asserts.
Usage: .venv/bin/python -m bench.long_rerank [--documents 20] [--tokens 2000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from bench.common import MODEL, WORDS
from tests.server_process import ServerProcess

QUERY = "when does the model server answer quickly under bursts of traffic"


def documents(count: int, tokens: int) -> list[str]:
    words = [WORDS[(i * 7 + d) % len(WORDS)] for d in range(count) for i in range(int(tokens * 0.8))]
    size = len(words) // count
    return [" ".join(words[d * size : (d + 1) * size]) for d in range(count)]


def cross_encoder(dest: Path) -> Path:
    """all-MiniLM-L6-v2's encoder under a random one-label head: a reranker's shape and cost."""
    from transformers import AutoTokenizer, BertForSequenceClassification

    BertForSequenceClassification.from_pretrained(MODEL, num_labels=1).save_pretrained(dest)
    AutoTokenizer.from_pretrained(MODEL).save_pretrained(dest)
    return dest


def timed(server: ServerProcess, docs: list[str], mode: str) -> tuple[float, int]:
    body = {"query": QUERY, "documents": docs, "long_inputs": mode, "return_documents": False}
    t0 = time.perf_counter()
    answer = server.post("/v1/rerank", json=body)
    ms = (time.perf_counter() - t0) * 1000
    assert answer.status_code == 200, answer.text
    return ms, int(answer.json()["usage"]["prompt_tokens"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--documents", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    docs = documents(args.documents, args.tokens)
    with tempfile.TemporaryDirectory() as tmp:
        cross = cross_encoder(Path(tmp) / "cross")
        for label, folder in (("cross-encoder", cross), ("bi-encoder", MODEL)):
            server = ServerProcess(folder, Path(tmp) / f"{label}.log", log_level="warning", cache_bytes="0")
            server.wait_ready().wait_engines()
            try:
                times: dict[str, list[float]] = {"chunk": [], "truncate": []}
                tokens: dict[str, int] = {}
                timed(server, docs[:2], "chunk")  # warm
                for round_ in range(args.rounds):
                    for mode in ("chunk", "truncate") if round_ % 2 == 0 else ("truncate", "chunk"):
                        ms, tokens[mode] = timed(server, docs, mode)
                        times[mode].append(ms)
            finally:
                server.stop()
            chunk, cut = statistics.median(times["chunk"]), statistics.median(times["truncate"])
            print(
                f"{label}: {args.documents} documents of ~{args.tokens} tokens; chunk {chunk:.0f} ms "
                f"({tokens['chunk']} tokens scored), truncate {cut:.0f} ms ({tokens['truncate']} tokens): "
                f"{chunk / cut:.2f} x"
            )


if __name__ == "__main__":
    main()
