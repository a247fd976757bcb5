"""A long soak under mixed traffic: memory growth, latency drift and errors by class. Prints, never asserts.

Clients post embeddings of mixed lengths; some requests are oversize (a 400), some malformed
(400), some clients walk away mid-request. Every minute the resident memory (RSS, and RssAnon: without
the file-mapped weights' pages) of every server process is sampled; latencies are grouped
into windows. At the end: RSS and RssAnon growth per hour for each process (a line fitted over the
samples after the first window), p50/p99 per window, and responses by class.
Usage: .venv/bin/python -m bench.soak [--minutes 30] [--window 5] [--clients 16]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time
from collections import Counter
from pathlib import Path

from bench.common import MODEL, Connection, pct, run, sentences
from tests.server_process import ServerProcess


def rss_bytes(pid: int, field: str = "VmRSS") -> int:
    """VmRSS, or RssAnon: anonymous memory (the heap, and the weights the forkserver built, shared
    copy-on-write), without the file-mapped weights' pages, which VmRSS also counts as they are touched."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def name_of(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:60].strip()
    except OSError:
        return "?"


def slope_per_hour(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, bytes), in bytes per hour."""
    if len(points) < 2:
        return 0.0
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    if var == 0:
        return 0.0
    return sum((t - mean_t) * (v - mean_v) for t, v in points) / var * 3600


async def client(port: int, texts: list[str], until: float, seed: int, log: list[tuple[float, float, str]]) -> None:
    """Mostly good requests of 1-8 inputs; 2% oversize, 2% malformed, 2% abandoned mid-request."""
    rng = random.Random(seed)
    conn = Connection(port)
    while time.monotonic() < until:
        roll = rng.random()
        body: object = {"input": rng.sample(texts, rng.randint(1, 8))}
        if roll < 0.02:
            body = {"input": "word " * 2000}
        elif roll < 0.04:
            body = {"input": [1, "mixed"]}
        started = time.monotonic()
        try:
            if roll > 0.98:
                task = asyncio.ensure_future(conn.post("/v1/embeddings", body))
                await asyncio.sleep(0.002)
                task.cancel()
                conn.close()
                conn = Connection(port)
                log.append((started, 0.0, "abandoned"))
                continue
            status, _, _ = await conn.post("/v1/embeddings", body)
            kind = str(status)
        except (OSError, asyncio.IncompleteReadError) as exc:
            kind = f"transport:{type(exc).__name__}"
            conn.close()
            conn = Connection(port)
        log.append((started, (time.monotonic() - started) * 1000, kind))
    conn.close()


async def drive(port: int, clients: int, seconds: float, texts: list[str]) -> list[tuple[float, float, str]]:
    log: list[tuple[float, float, str]] = []
    until = time.monotonic() + seconds
    await asyncio.gather(*(client(port, texts, until, i, log) for i in range(clients)))
    return log


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=30)
    parser.add_argument("--window", type=float, default=5, help="minutes per latency window")
    parser.add_argument("--clients", type=int, default=16)
    args = parser.parse_args()
    texts = sentences(2000)
    with tempfile.TemporaryDirectory() as tmp:
        server = ServerProcess(MODEL, Path(tmp) / "soak.log", log_level="warning").wait_ready()
        server.wait_engines()
        samples: dict[int, list[tuple[float, float]]] = {}
        anon: dict[int, list[tuple[float, float]]] = {}
        started = time.monotonic()
        logs: list[tuple[float, float, str]] = []
        try:
            total = args.minutes * 60
            while (elapsed := time.monotonic() - started) < total:
                for pid in [server.proc.pid, *server.children()]:
                    samples.setdefault(pid, []).append((elapsed, rss_bytes(pid)))
                    anon.setdefault(pid, []).append((elapsed, rss_bytes(pid, "RssAnon")))
                logs += run(drive(server.port, args.clients, min(60.0, total - elapsed), texts))
            names = {pid: name_of(pid) for pid in samples}
        finally:
            server.stop()
    print(f"soak: {args.minutes:g} min, {args.clients} clients, {len(logs)} requests")
    for label, table in (("RSS", samples), ("RssAnon (no file pages)", anon)):
        print(f"{label} per process (MB at start -> end; growth per hour fitted after the first window):")
        for pid, points in table.items():
            steady = [(t, v) for t, v in points if t >= args.window * 60] or points
            print(
                f"  {pid:>7} {names[pid][:44]:44} {points[0][1] / 1e6:7.1f} -> {points[-1][1] / 1e6:7.1f}"
                f"  {slope_per_hour(steady) / 1e6:+7.1f} MB/h"
            )
    print("latency of answered requests per window (ms):")
    width = args.window * 60
    for w in range(int((args.minutes * 60 + width - 1) // width)):
        window = [ms for t, ms, kind in logs if kind == "200" and w * width <= t - logs[0][0] < (w + 1) * width]
        print(
            f"  {w * args.window:5.0f}-{(w + 1) * args.window:<4.0f} min  n={len(window):6}  "
            f"p50 {pct(window, 0.5):7.1f}  p99 {pct(window, 0.99):7.1f}"
        )
    print("responses by class:", dict(Counter(kind for _, _, kind in logs)))


if __name__ == "__main__":
    main()
