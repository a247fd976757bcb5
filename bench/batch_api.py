"""The Batch API against the same lines sent as requests, against sentence-transformers, and beside a
live client.

One server on the embedded model (cache off). `--lines` lines of one mixed-length text each:
1. as one Batch API job (upload, create, poll until completed): lines/s from create to completed;
2. as `--clients` concurrent clients each sending one line's body to /v1/embeddings: inputs/s;
3. sentence-transformers' encode at batch 32 on the same texts, in this process: inputs/s;
4. one interactive client (1-text requests, back to back) for `--seconds` alone, then while a job
   of the same lines runs: its p50/p99 in each.
Prints each rate and the Batch API's ratio to the others, and the interactive client's p50/p99 ratio.
The server's engines are compiled, their artifact built first (the default `compile=auto` with its
cache warm; built beside the measured load instead, at nice 19, it would finish after the bench, which
would time eager engines); `--settings compile=off` times eager ones. Never asserts.
Usage: .venv/bin/python -m bench.batch_api [--lines 20000] [--clients 32] [--seconds 15]
       [--settings batch_concurrency=64,...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.common import MODEL, Connection, pct, run, sentences
from bench.paired import settings
from server.batches.runner import BATCH_PRIORITY
from tests.server_process import ServerProcess

POLL_S = 0.2


def upload(server: ServerProcess, texts: list[str]) -> str:
    lines = [
        json.dumps({"custom_id": f"l{i}", "method": "POST", "url": "/v1/embeddings", "body": {"input": t}})
        for i, t in enumerate(texts)
    ]
    files = {"file": ("in.jsonl", ("\n".join(lines) + "\n").encode(), "application/jsonl")}
    answer = server.client.post("/v1/files", files=files, data={"purpose": "batch"}, timeout=300)
    assert answer.status_code == 200, answer.text
    return str(answer.json()["id"])


def job(server: ServerProcess, file_id: str) -> tuple[str, float]:
    """(batch id, its time from create); returns once it started (for 4: a job in progress)."""
    body = {"input_file_id": file_id, "endpoint": "/v1/embeddings", "completion_window": "24h"}
    answer = server.post("/v1/batches", json=body)
    assert answer.status_code == 200, answer.text
    return str(answer.json()["id"]), time.perf_counter()


def wait_done(server: ServerProcess, batch_id: str) -> dict[str, Any]:
    while True:
        record: dict[str, Any] = server.get(f"/v1/batches/{batch_id}").json()
        if record["status"] in ("completed", "failed", "cancelled", "expired"):
            return record
        time.sleep(POLL_S)


async def clients(port: int, texts: list[str], count: int, priority: int = 0) -> float:
    """inputs/s of `count` clients taking the texts one request each."""
    queue = list(reversed(texts))

    async def client() -> None:
        conn = Connection(port)
        while queue:
            status, _, _ = await conn.post("/v1/embeddings", {"input": queue.pop(), "priority": priority})
            assert status == 200
        conn.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(count)))
    return len(texts) / (time.perf_counter() - t0)


async def interactive(port: int, seconds: float, texts: list[str]) -> list[float]:
    conn, out, end = Connection(port), [], time.perf_counter() + seconds
    i = 0
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        status, _, _ = await conn.post("/v1/embeddings", {"input": texts[i % len(texts)]})
        assert status == 200
        out.append((time.perf_counter() - t0) * 1000)
        i += 1
    conn.close()
    return out


def sentence_transformers_rate(texts: list[str]) -> float:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(MODEL), device="cpu")
    model.encode(texts[:64], batch_size=32)
    t0 = time.perf_counter()
    model.encode(texts, batch_size=32)
    return len(texts) / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=20000)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--settings", default="", help="the server's settings, e.g. batch_concurrency=64")
    args = parser.parse_args()
    texts = sentences(args.lines, seed=11)
    probe = sentences(200, seed=12)
    with tempfile.TemporaryDirectory() as tmp:
        chosen: dict[str, Any] = {
            "compile": "required",
            "compile_cache": Path(tmp) / "compile-cache",
            **settings(args.settings),
        }
        if chosen["compile"] != "off":
            ServerProcess(MODEL, Path(tmp) / "build.log", **chosen).wait_ready(timeout=1200).stop()
        server = ServerProcess(
            MODEL,
            Path(tmp) / "server.log",
            log_level="warning",
            cache_bytes="0",
            batch_dir=Path(tmp) / "batches",
            **chosen,
        )
        server.wait_ready().wait_engines()
        server.client = httpx.Client(base_url=server.url, timeout=60)
        try:
            # warm, at the job's bulk priority: an interactive request would shrink the engines' bulk
            # groups for the next URGENT_WINDOW_S (engine.runtime.batching), the job's first seconds
            run(clients(server.port, texts[:256], args.clients, priority=BATCH_PRIORITY))
            file_id = upload(server, texts)
            batch_id, started = job(server, file_id)
            record = wait_done(server, batch_id)
            batch_rate = args.lines / (time.perf_counter() - started)
            assert record["request_counts"]["completed"] == args.lines, record
            client_rate = run(clients(server.port, texts, args.clients))
            alone = run(interactive(server.port, args.seconds, probe))
            batch_id, _ = job(server, file_id)
            beside = run(interactive(server.port, args.seconds, probe))
            server.client.post(f"/v1/batches/{batch_id}/cancel").raise_for_status()  # its rate is measured above
            wait_done(server, batch_id)
        finally:
            server.stop()
    st_rate = sentence_transformers_rate(texts)
    print(f"{args.lines} lines of 4-64 words, all-MiniLM-L6-v2 float32, compile={chosen['compile']}")
    print(f"Batch API: {batch_rate:.1f} lines/s")
    print(
        f"{args.clients} clients, one line a request: {client_rate:.1f} inputs/s "
        f"(Batch API {batch_rate / client_rate:.2f} x)"
    )
    print(f"sentence-transformers encode, batch 32: {st_rate:.1f} inputs/s (Batch API {batch_rate / st_rate:.2f} x)")
    a50, a99, b50, b99 = pct(alone, 0.5), pct(alone, 0.99), pct(beside, 0.5), pct(beside, 0.99)
    print(f"interactive client alone: p50 {a50:.1f} ms, p99 {a99:.1f} ms ({len(alone)} requests)")
    print(
        f"beside a job: p50 {b50:.1f} ms ({b50 / a50:.2f} x), p99 {b99:.1f} ms ({b99 / a99:.2f} x) "
        f"({len(beside)} requests)"
    )


if __name__ == "__main__":
    main()
