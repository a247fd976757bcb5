"""A busy tenant beside a light one, on two trees' servers (A: this tree, B: --b-source) loaded in turn, as
bench.paired does: what the light tenant waits and what the busy one serves.

One keys file of two tenants without quotas: `busy` keeps --clients connections sending 1-input requests
as fast as they are answered, `light` sends 1-input requests at --rate a second at exponentially
distributed gaps (an independent client). Each round loads A then B (B then A the next), --seconds each.
Prints per server the busy tenant's inputs/s (each round's and the mean) and the light one's p50/p99.
Never asserts.
What it shows: how engines share their work between tenants (server/core/engine_routing.py).
Usage: .venv/bin/python -m bench.busy_tenant [--b-source DIR] [--clients 32] [--rate 20] [--rounds 4]
       [--seconds 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

from bench.common import MODEL, ROOT, Connection, in_turn, pct, run, sentences
from bench.tenants import paced
from tests.server_process import ServerProcess

KEYS = {"busy": "key-busy", "light": "key-light"}


async def closed_loop(port: int, key: str, clients: int, seconds: float, texts: list[str]) -> float:
    """Inputs/s answered 200 to `clients` connections each sending its next request when answered."""
    done = 0
    deadline = time.perf_counter() + seconds

    async def client(seed: int) -> None:
        nonlocal done
        conn, headers = Connection(port), {"authorization": f"Bearer {key}"}
        while time.perf_counter() < deadline:
            status, _, _ = await conn.post(
                "/v1/embeddings", {"input": texts[(seed * 131 + done) % len(texts)]}, headers
            )
            done += status == 200
        conn.close()

    await asyncio.gather(*(client(i) for i in range(clients)))
    return done / seconds


async def round_(port: int, args: argparse.Namespace, texts: list[str]) -> tuple[float, list[float]]:
    """(the busy tenant's inputs/s, the light one's latencies of its 200s) over one load of --seconds."""
    busy, light = await asyncio.gather(
        closed_loop(port, KEYS["busy"], args.clients, args.seconds, texts),
        paced(port, KEYS["light"], args.rate, args.seconds, texts, 5, poisson=True),
    )
    return busy, [ms for status, ms in light if status == 200]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--b-source", type=Path, default=ROOT, help="source tree B runs from (default: this one)")
    parser.add_argument("--clients", type=int, default=32, help="the busy tenant's connections")
    parser.add_argument("--rate", type=float, default=20, help="the light tenant's requests a second")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=8)
    args = parser.parse_args()
    texts = sentences(500)
    with tempfile.TemporaryDirectory() as tmp:
        keys = Path(tmp) / "keys.json"
        keys.write_text(json.dumps({"tenants": {t: {"keys": [k], "scopes": ["inference"]} for t, k in KEYS.items()}}))
        servers = {
            name: ServerProcess(MODEL, Path(tmp) / f"{i}.log", source=source, log_level="warning", api_keys_file=keys)
            for i, (name, source) in enumerate({"A (this tree)": ROOT, f"B ({args.b_source})": args.b_source}.items())
        }
        measured = in_turn(servers, args.rounds, lambda server: run(round_(server.port, args, texts)))
    results = {name: ([r[0] for r in rounds], [ms for r in rounds for ms in r[1]]) for name, rounds in measured.items()}
    print(f"a busy tenant of {args.clients} clients beside a light one of {args.rate:g} requests/s:")
    for name, (rates, latencies) in results.items():
        print(
            f"{name}: busy {statistics.mean(rates):.1f} inputs/s (rounds {' '.join(f'{r:.0f}' for r in rates)}); "
            f"light p50 {pct(latencies, 0.5):.1f} p99 {pct(latencies, 0.99):.1f} ms ({len(latencies)} requests)"
        )


if __name__ == "__main__":
    main()
