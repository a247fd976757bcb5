"""Batch invariance on a real server: a text's vector has the same bits alone and inside requests of
any composition sent by concurrent clients, whichever of two engines computed it (the in-process
check of every precision: tests/unit/test_batch_invariance.py)."""

from __future__ import annotations

import base64
import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from tests.server_process import serving

# 3, 5 and 11 tokens: float32 products of so few rows took another path than inside a larger product
# (engine/precision/rows.py pads them), so these are the texts whose bits moved with their group
PROBES = ("weights", "many small requests", "the server answers quickly while batching many small")
WORDS = ("the", "server", "answers", "quickly", "while", "batching", "many", "small", "requests", "over", "weights")
COMPOSITIONS = 60
CLIENTS = 16


def embeddings(http: httpx.Client, texts: list[str]) -> tuple[list[bytes], int]:
    """Each text's vector as raw float32 bytes (base64 on the wire), and the request's tokens."""
    answer = http.post("/v1/embeddings", json={"input": texts, "encoding_format": "base64"})
    assert answer.status_code == 200, answer.text[:300]
    body = answer.json()
    items = sorted(body["data"], key=lambda item: item["index"])
    return [base64.b64decode(item["embedding"]) for item in items], body["usage"]["prompt_tokens"]


def composition(rng: random.Random) -> tuple[list[str], int, str]:
    """1..30 texts of 1..16 words around one of the probes, at a random place: (texts, its place, probe)."""
    texts = [" ".join(rng.choices(WORDS, k=rng.randint(1, 16))) for _ in range(rng.randint(1, 30))]
    at, probe = rng.randint(0, len(texts)), rng.choice(PROBES)
    texts.insert(at, probe)
    return texts, at, probe


def cpu_ticks(pid: int) -> int:
    """A process's user + system CPU time, in clock ticks (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return int(fields[11]) + int(fields[12])


def test_a_text_has_the_same_bits_alone_and_in_any_request_on_either_engine(model_dir: Path, tmp_path: Path) -> None:
    """Each probe alone on the idle server is its reference; then 16 clients send 60 requests of
    random compositions around the probes, grouped with each other by two engines; every probe's
    vector is bitwise its reference, and both engines took a share of the work."""
    with serving(model_dir, tmp_path / "server.log", engines=2, cache_bytes="0") as server:
        pids = server.wait_engines()["pids"]
        references = {}
        for probe in PROBES:
            (references[probe],), tokens = embeddings(server.client, [probe])
            assert 3 <= tokens <= 11, f"{probe!r} is {tokens} tokens: not a product of few rows"
        rng = random.Random(11)
        requests = [composition(rng) for _ in range(COMPOSITIONS)]
        before = [cpu_ticks(pid) for pid in pids]

        answers: list[list[bytes]] = [[] for _ in requests]
        order = iter(range(len(requests)))  # shared by the clients: each request sent once

        def client() -> None:
            with httpx.Client(base_url=server.url, timeout=60) as http:
                for i in order:
                    answers[i] = embeddings(http, requests[i][0])[0]

        with ThreadPoolExecutor(CLIENTS) as pool:
            for sent in [pool.submit(client) for _ in range(CLIENTS)]:
                sent.result(timeout=120)  # each request has its own 60 s deadline too
        worked = [cpu_ticks(pid) - ticks for pid, ticks in zip(pids, before, strict=True)]

    differ = [
        (probe, len(texts))
        for (texts, at, probe), got in zip(requests, answers, strict=True)
        if got[at] != references[probe]
    ]
    assert not differ, f"{len(differ)}/{COMPOSITIONS} probes got other bits than alone (probe, texts): {differ[:5]}"
    assert min(worked) >= sum(worked) / 5, f"one engine did (almost) nothing: CPU ticks {worked}"
