"""Interactive latency under a bulk flood, with and without request priorities.

One server; an interactive client sends 1-input requests back to back at priority 0 while bulk
clients (32 inputs a request) saturate it, first at the same priority, then at a lower one
(`"priority": 1`: vLLM's semantics, lower runs first), with the interactive client alone between
them. Conditions alternate round by round, so drift hits them alike. Prints the interactive p50/p99
of each condition and their ratios to the unloaded p99; never asserts.
Usage: .venv/bin/python -m bench.priority [--rounds 3] [--seconds 8] [--bulk-clients 8] [--bulk-inputs 32]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time
from pathlib import Path

from bench.common import MODEL, Connection, pct, run, sentences
from engine.runtime.batching import URGENT_WINDOW_S
from tests.server_process import ServerProcess

# name: (bulk priority or None for no bulk, whether the interactive client runs)
CONDITIONS = {
    "alone": (None, True),
    "bulk, same priority": (0, True),
    "bulk at priority 1": (1, True),
    "bulk at priority 1, no interactive client": (1, False),
}


async def phase(  # type: ignore[no-untyped-def]
    port: int, seconds: float, bulk: int, bulk_inputs: int, priority: int | None, texts: list[str], ask: bool
):
    """(interactive latencies in ms, bulk inputs answered) over `seconds`; no bulk when priority is
    None, no interactive client unless `ask`."""
    deadline = time.perf_counter() + seconds
    latencies: list[float] = []
    answered = 0

    async def interactive() -> None:
        rng, conn = random.Random(1), Connection(port)
        await asyncio.sleep(0.5 if priority is not None else 0)  # the flood first
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            status, _, _ = await conn.post("/v1/embeddings", {"input": rng.choice(texts)})
            if status == 200:
                latencies.append((time.perf_counter() - t0) * 1000)
        conn.close()

    async def flood(seed: int) -> None:
        nonlocal answered
        rng, conn = random.Random(seed), Connection(port)
        while time.perf_counter() < deadline:
            body = {"input": rng.sample(texts, bulk_inputs), "priority": priority}
            status, _, _ = await conn.post("/v1/embeddings", body)
            answered += bulk_inputs if status == 200 else 0
        conn.close()

    floods = [flood(i + 10) for i in range(bulk)] if priority is not None else []
    await asyncio.gather(*([interactive()] if ask else []), *floods)
    return latencies, answered


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--bulk-clients", type=int, default=8)
    parser.add_argument("--bulk-inputs", type=int, default=32)
    args = parser.parse_args()
    texts = sentences(2000)
    results: dict[str, tuple[list[float], int, float]] = {c: ([], 0, 0.0) for c in CONDITIONS}
    with tempfile.TemporaryDirectory() as tmp:
        server = ServerProcess(MODEL, Path(tmp) / "server.log", log_level="warning").wait_ready()
        try:
            server.wait_engines()
            for round_ in range(args.rounds):
                order = list(CONDITIONS) if round_ % 2 == 0 else list(CONDITIONS)[::-1]
                for condition in order:
                    priority, ask = CONDITIONS[condition]
                    if not ask:  # let the engines forget the urgent traffic: bulk alone runs full groups
                        time.sleep(URGENT_WINDOW_S)
                    measured = phase(
                        server.port, args.seconds, args.bulk_clients, args.bulk_inputs, priority, texts, ask
                    )
                    lat, done = run(measured)
                    before = results[condition]
                    results[condition] = (before[0] + lat, before[1] + done, before[2] + args.seconds)
        finally:
            server.stop()
    alone_p99 = pct(results["alone"][0], 0.99)
    for condition, (lat, done, seconds) in results.items():
        if not lat:
            print(f"{condition}: bulk {done / seconds:.0f} inputs/s")
            continue
        p50, p99 = pct(lat, 0.5), pct(lat, 0.99)
        bulk = f", bulk {done / seconds:.0f} inputs/s" if done else ""
        print(
            f"{condition}: interactive p50 {p50:.1f} ms, p99 {p99:.1f} ms ({p99 / alone_p99:.2f}x alone's p99), "
            f"{len(lat)} requests{bulk}"
        )


if __name__ == "__main__":
    main()
