"""Where the slowest requests wait: each request's stage times under closed-loop load, by latency band.

N clients post one sentence at a time to TEI's `/embed`, whose answers carry TEI's timing headers
(server/core/timings.py: x-total-time, x-tokenization-time, x-queue-time, x-inference-time, in ms).
After a warm-up, every request's latency at the client is kept with its headers; the requests are
sorted by latency and, for the median band (p45-p55), p90-p95 and the slowest 1 %, the mean of each
stage prints: tokenizing, queue (submitted to the engines until the last row is back, less the
forward), the forward's share, the rest of the handler, and outside the handler (the connection, the
event loop, the client). The client's own event-loop lag prints beside (a stalled client measures
itself). Never asserts.
Usage: .venv/bin/python -m bench.tail [--clients 32] [--seconds 15] [--compiled] [--engines N] [--dtype D]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from pathlib import Path

from bench.common import MODEL, Connection, chosen, compiled, pct, run, sentences
from tests.server_process import ServerProcess

STAGES = ("x-total-time", "x-tokenization-time", "x-queue-time", "x-inference-time")
BANDS = (("p45-p55", 0.45, 0.55), ("p90-p95", 0.90, 0.95), ("slowest 1 %", 0.99, 1.0))


async def client(conn: Connection, texts: list[str], until: float, rows: list[tuple[float, ...]], seed: int) -> None:
    rng = random.Random(seed)
    while time.monotonic() < until:
        started = time.perf_counter()
        status, headers, _ = await conn.post("/embed", {"inputs": rng.choice(texts)})
        if status == 200:
            rows.append(((time.perf_counter() - started) * 1000, *(float(headers[name]) for name in STAGES)))


async def lag(until: float, lags: list[float], every_s: float = 0.005) -> None:
    while time.monotonic() < until:
        started = time.perf_counter()
        await asyncio.sleep(every_s)
        lags.append((time.perf_counter() - started - every_s) * 1000)


async def measure(port: int, clients: int, seconds: float) -> tuple[list[tuple[float, ...]], list[float]]:
    texts = sentences(2000)
    conns = [Connection(port) for _ in range(clients)]  # opened in the warm-up, outside the timed part
    warm: list[tuple[float, ...]] = []
    until = time.monotonic() + 3
    await asyncio.gather(*(client(c, texts, until, warm, i) for i, c in enumerate(conns)))
    rows: list[tuple[float, ...]] = []
    lags: list[float] = []
    until = time.monotonic() + seconds
    await asyncio.gather(lag(until, lags), *(client(c, texts, until, rows, 100 + i) for i, c in enumerate(conns)))
    for conn in conns:
        conn.close()
    return rows, lags


def report(rows: list[tuple[float, ...]], lags: list[float], seconds: float) -> None:
    rows.sort()
    print(
        f"{len(rows)} requests, {len(rows) / seconds:.1f}/s; client p50 {pct([r[0] for r in rows], 0.5):.1f} ms, "
        f"p99 {pct([r[0] for r in rows], 0.99):.1f} ms; client loop lag p99 {pct(lags, 0.99):.1f} ms, "
        f"max {max(lags, default=0.0):.1f}"
    )
    print("band          client  = outside + handler (tokenize  queue  forward  rest)   ms, means")
    for name, low, high in BANDS:
        band = rows[int(low * len(rows)) : max(int(high * len(rows)), int(low * len(rows)) + 1)]
        client_ms, total, tokenize, queue, forward = (statistics.mean(column) for column in zip(*band, strict=True))
        rest = total - tokenize - queue - forward
        print(
            f"{name:12} {client_ms:7.1f} = {client_ms - total:7.1f} + {total:7.1f} ({tokenize:8.1f} {queue:6.1f} "
            f"{forward:8.1f} {rest:5.1f})"
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--compiled", action="store_true", help="compiled engines (built before ready)")
    parser.add_argument("--engines", type=int, help="WARMPOOL_ENGINES (default: the server's)")
    parser.add_argument("--dtype", help="WARMPOOL_DTYPE (default: the server's)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        settings = chosen(engines=args.engines, dtype=args.dtype) | (compiled(Path(tmp)) if args.compiled else {})
        server = ServerProcess(MODEL, Path(tmp) / "server.log", log_level="warning", **settings).wait_ready(1200)
        server.wait_engines()
        try:
            rows, lags = run(measure(server.port, args.clients, args.seconds))
        finally:
            server.stop()
    report(rows, lags, args.seconds)


if __name__ == "__main__":
    main()
