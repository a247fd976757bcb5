"""Throughput and latency at 1, 8 and 32 clients against the raw model, with a liveness prober.

Prints ratios against sentence-transformers `encode` measured in the same run; never asserts.
Usage: .venv/bin/python bench/load.py [--seconds 15] [--clients 1,8,32]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.server_process import ROOT, ServerProcess  # noqa: E402

MODEL = ROOT / "models" / "all-MiniLM-L6-v2"
WORDS = (
    "the model server answers quickly while batching many small requests into one pass over "
    "weights kept warm in memory so that every client sees low latency and high throughput even "
    "when traffic arrives in bursts from many machines at once across the network"
).split()


def sentences(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choices(WORDS, k=rng.randint(4, 64))) for _ in range(n)]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)] if ordered else float("nan")


def raw_model(texts: list[str], threads: int) -> tuple[float, float]:
    """Sentences/s at batch 32 and single-sentence latency (ms) of the bare model."""
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(threads)
    model = SentenceTransformer(str(MODEL), device="cpu")
    model.encode(texts[:64], batch_size=32)
    started = time.perf_counter()
    model.encode(texts, batch_size=32)
    throughput = len(texts) / (time.perf_counter() - started)
    singles = []
    for text in texts[:100]:
        t0 = time.perf_counter()
        model.encode([text], batch_size=1)
        singles.append((time.perf_counter() - t0) * 1000)
    return throughput, statistics.median(singles)


async def probe(url: str, stop: asyncio.Event, out: list[float]) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        while not stop.is_set():
            t0 = time.perf_counter()
            await http.get("/health/live")
            out.append((time.perf_counter() - t0) * 1000)
            await asyncio.sleep(0.02)


async def load(url: str, clients: int, seconds: float, texts: list[str]) -> dict[str, float]:
    latencies: list[float] = []
    probes: list[float] = []
    stop = asyncio.Event()
    errors = 0

    async def client(seed: int) -> None:
        nonlocal errors
        rng = random.Random(seed)
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            while not stop.is_set():
                t0 = time.perf_counter()
                r = await http.post("/v1/embeddings", json={"input": rng.choice(texts)})
                if r.status_code == 200:
                    latencies.append((time.perf_counter() - t0) * 1000)
                else:
                    errors += 1

    prober = asyncio.create_task(probe(url, stop, probes))
    tasks = [asyncio.create_task(client(i)) for i in range(clients)]
    started = time.perf_counter()
    await asyncio.sleep(seconds)
    stop.set()
    await asyncio.gather(*tasks, prober)
    elapsed = time.perf_counter() - started
    return {
        "inputs_s": len(latencies) / elapsed,
        "p50": pct(latencies, 0.5),
        "p99": pct(latencies, 0.99),
        "probe_p50": pct(probes, 0.5),
        "probe_p99": pct(probes, 0.99),
        "probe_max": max(probes, default=float("nan")),
        "errors": errors,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--clients", default="1,8,32")
    args = parser.parse_args()
    texts = sentences(2000)
    threads = os.cpu_count() or 1
    raw_tput, raw_single = raw_model(texts[:640], threads)
    print(f"raw model: {raw_tput:.1f} sentences/s at batch 32, single sentence p50 {raw_single:.1f} ms")
    with tempfile.TemporaryDirectory() as tmp:
        server = ServerProcess(MODEL, Path(tmp) / "server.log", log_level="warning").wait_ready()
        try:
            print("clients  inputs/s  x_raw  p50_ms  p99_ms  probe_p50  probe_p99  probe_max  errors")
            for clients in (int(c) for c in args.clients.split(",")):
                r = asyncio.run(load(server.url, clients, args.seconds, texts))
                print(
                    f"{clients:7d}  {r['inputs_s']:8.1f}  {r['inputs_s'] / raw_tput:5.2f}  {r['p50']:6.1f}  "
                    f"{r['p99']:6.1f}  {r['probe_p50']:9.1f}  {r['probe_p99']:9.1f}  "
                    f"{r['probe_max']:9.1f}  {r['errors']:6d}"
                )
                if clients == 1:
                    print(f"         single-client p50 - raw single = {r['p50'] - raw_single:+.1f} ms")
        finally:
            server.stop()


if __name__ == "__main__":
    main()
