"""Offered load at 2x capacity: accepted throughput against capacity, time to a 429, probe latency.

Capacity is measured first in the same run (32 closed-loop clients). Then requests arrive
open-loop at twice that rate for --seconds; the server runs with a small admission limit so
that overload shows within the run. Prints, never asserts.
Usage: .venv/bin/python -m bench.overload [--seconds 20] [--permits 64]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time
from pathlib import Path

from bench.common import MODEL, Connection, Prober, pct, run, sentences
from bench.load import load
from tests.server_process import ServerProcess


async def offered(port: int, rate: float, seconds: float, texts: list[str]) -> dict[str, float]:
    idle: asyncio.Queue[Connection] = asyncio.Queue()
    for _ in range(256):
        idle.put_nowait(Connection(port))
    accepted: list[float] = []
    rejected: list[float] = []
    other = 0
    unsent = 0
    rng = random.Random(1)

    async def one(conn: Connection) -> None:
        nonlocal other
        started = time.perf_counter()
        status, _, _ = await conn.post("/v1/embeddings", {"input": rng.choice(texts)})
        elapsed = (time.perf_counter() - started) * 1000
        if status == 200:
            accepted.append(elapsed)
        elif status == 429:
            rejected.append(elapsed)
        else:
            other += 1
        idle.put_nowait(conn)

    prober = Prober(port)
    tasks = []
    begin = time.perf_counter()
    sent = 0
    while (now := time.perf_counter() - begin) < seconds:
        due = int(now * rate) - sent
        for _ in range(due):
            if idle.empty():
                unsent += 1
            else:
                tasks.append(asyncio.create_task(one(idle.get_nowait())))
        sent += due
        await asyncio.sleep(0.002)
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - begin
    probes = prober.stop()
    while not idle.empty():
        idle.get_nowait().close()
    return {
        "accepted_s": len(accepted) / elapsed,
        "rejected": len(rejected),
        "reject_p50": pct(rejected, 0.5),
        "reject_p99": pct(rejected, 0.99),
        "accept_p99": pct(accepted, 0.99),
        "probe_p99": pct(probes, 0.99),
        "probe_max": max(probes, default=float("nan")),
        "other": other,
        "unsent": unsent,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--permits", type=int, default=64)
    parser.add_argument("--engines", type=int, help="WARMPOOL_ENGINES (default: the server's)")
    args = parser.parse_args()
    texts = sentences(2000)
    with tempfile.TemporaryDirectory() as tmp:
        server = ServerProcess(
            MODEL,
            Path(tmp) / "server.log",
            log_level="warning",
            max_concurrent_inputs=args.permits,
            **({"engines": args.engines} if args.engines else {}),
        ).wait_ready()
        server.wait_engines()
        try:
            capacity = run(load(server.port, 32, 10, texts)).inputs_s
            r = run(offered(server.port, 2 * capacity, args.seconds, texts))
        finally:
            server.stop()
    print(
        f"capacity (32 closed-loop clients): {capacity:.1f} inputs/s; offered {2 * capacity:.1f}/s "
        f"for {args.seconds:.0f}s with {args.permits} admission permits"
    )
    print(
        f"accepted {r['accepted_s']:.1f} inputs/s = {r['accepted_s'] / capacity:.2f} x capacity "
        f"(accepted p99 {r['accept_p99']:.0f} ms)"
    )
    print(f"429s: {r['rejected']:.0f}, time to 429 p50 {r['reject_p50']:.1f} ms, p99 {r['reject_p99']:.1f} ms")
    print(f"/health/live probe p99 {r['probe_p99']:.2f} ms, max {r['probe_max']:.2f} ms")
    print(f"other statuses: {r['other']:.0f}; not sent for lack of a free client connection: {r['unsent']:.0f}")


if __name__ == "__main__":
    main()
