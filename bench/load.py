"""Throughput and latency at 1, 8 and 32 clients against the raw model, with a liveness prober.

Prints ratios against sentence-transformers `encode` (batch 32, same thread count) measured in
the same run, right before and after each level; never asserts.
Usage: .venv/bin/python -m bench.load [--seconds 15] [--clients 1,8,32] [--engines N]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

from bench.common import MODEL, Connection, Prober, pct, sentences
from tests.server_process import ServerProcess


class RawModel:
    """sentence-transformers `encode` on the same sentences: the baseline every ratio divides by."""

    def __init__(self, texts: list[str], threads: int) -> None:
        import torch
        from sentence_transformers import SentenceTransformer

        torch.set_num_threads(threads)
        self.texts = texts
        self.model = SentenceTransformer(str(MODEL), device="cpu")
        self.model.encode(texts[:64], batch_size=32)

    def measure(self) -> tuple[float, float]:
        """Sentences/s at batch 32 and single-sentence latency (ms)."""
        started = time.perf_counter()
        self.model.encode(self.texts, batch_size=32)
        throughput = len(self.texts) / (time.perf_counter() - started)
        singles = []
        for text in self.texts[:100]:
            t0 = time.perf_counter()
            self.model.encode([text], batch_size=1)
            singles.append((time.perf_counter() - t0) * 1000)
        return throughput, statistics.median(singles)


async def load(port: int, clients: int, seconds: float, texts: list[str]) -> dict[str, float]:
    latencies: list[float] = []
    errors = 0
    deadline = time.perf_counter() + seconds

    async def client(seed: int) -> None:
        nonlocal errors
        rng = random.Random(seed)
        conn = Connection(port)
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            status, _, _ = await conn.post("/v1/embeddings", {"input": rng.choice(texts)})
            if status == 200:
                latencies.append((time.perf_counter() - t0) * 1000)
            else:
                errors += 1
        conn.close()

    prober = Prober(port)
    started = time.perf_counter()
    await asyncio.gather(*(client(i) for i in range(clients)))
    elapsed = time.perf_counter() - started
    probes = prober.stop()
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
    parser.add_argument("--engines", type=int, help="WARMPOOL_ENGINES (default: the server's)")
    args = parser.parse_args()
    texts = sentences(2000)
    threads = os.cpu_count() or 1
    raw = RawModel(texts[:640], threads)
    # The machine drifts: the raw model runs before each level and after the last (the server
    # idle meanwhile), and each level is compared with the runs just before and after it.
    baselines = [raw.measure()]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        extra = {"engines": args.engines} if args.engines else {}
        server = ServerProcess(MODEL, Path(tmp) / "server.log", log_level="warning", **extra).wait_ready()
        server.wait_engines()
        try:
            for clients in (int(c) for c in args.clients.split(",")):
                rows.append((clients, asyncio.run(load(server.port, clients, args.seconds, texts))))
                baselines.append(raw.measure())
        finally:
            server.stop()
    print(
        f"raw model ({threads} threads), sentences/s at batch 32 before each level and after the last: "
        + " / ".join(f"{b[0]:.1f}" for b in baselines)
    )
    print("clients  inputs/s  x_raw  p50_ms  p99_ms  probe_p50  probe_p99  probe_max  errors")
    for i, (clients, r) in enumerate(rows):
        raw_tput = (baselines[i][0] + baselines[i + 1][0]) / 2
        print(
            f"{clients:7d}  {r['inputs_s']:8.1f}  {r['inputs_s'] / raw_tput:5.2f}  {r['p50']:6.1f}  "
            f"{r['p99']:6.1f}  {r['probe_p50']:9.2f}  {r['probe_p99']:9.2f}  {r['probe_max']:9.2f}  "
            f"{r['errors']:6.0f}"
        )
        if clients == 1:
            raw_single = (baselines[i][1] + baselines[i + 1][1]) / 2
            print(
                f"         1-client p50 {r['p50']:.1f} ms - raw single-sentence p50 {raw_single:.1f} ms "
                f"= {r['p50'] - raw_single:+.1f} ms"
            )


if __name__ == "__main__":
    main()
