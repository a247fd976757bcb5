"""Bursts after idle: N requests sent at once after a pause, as a search fans out its queries, on two
servers (A: this tree, B: --b-source) loaded in turn, as bench.paired does. Each round sends, per
burst, N requests of K inputs together, then after the same pause one request alone. Prints the
slowest request of each burst and the lone request, p50/p90/max, per server. Never asserts.

What it shows: how an engine sizes its threads when several start work at once (engine/runtime/threads.py).
Usage: .venv/bin/python -m bench.bursts [--b-source DIR] [--requests 2] [--inputs 8] [--pause 0.5]
       [--rounds 4] [--bursts 10]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from bench.common import MODEL, ROOT, Connection, in_turn, pct, run, sentences
from tests.server_process import ServerProcess


async def bursts(port: int, args: argparse.Namespace, texts: list[str], count: int) -> tuple[list[float], list[float]]:
    """(each burst's slowest ms, each lone request's ms) over `count` bursts."""
    conns = [Connection(port) for _ in range(args.requests)]

    async def one(i: int, n: int) -> float:
        started = time.perf_counter()
        await conns[i].post("/v1/embeddings", {"input": [texts[(n + j) % len(texts)] for j in range(args.inputs)]})
        return (time.perf_counter() - started) * 1000

    slowest, alone = [], []
    for b in range(count):
        await asyncio.sleep(args.pause)
        took = await asyncio.gather(*(one(i, (b * args.requests + i) * args.inputs) for i in range(args.requests)))
        slowest.append(max(took))
        await asyncio.sleep(args.pause)
        alone.append(await one(0, b * 7))
    for conn in conns:
        conn.close()
    return slowest, alone


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--b-source", type=Path, default=ROOT, help="source tree B runs from (default: this one)")
    parser.add_argument("--requests", type=int, default=2, help="requests sent at once")
    parser.add_argument("--inputs", type=int, default=8, help="inputs in each request")
    parser.add_argument("--pause", type=float, default=0.5, help="seconds idle before each burst")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--bursts", type=int, default=10, help="bursts per server per round")
    args = parser.parse_args()
    texts = sentences(500)
    with tempfile.TemporaryDirectory() as tmp:
        servers = {
            "A (this tree)": ServerProcess(MODEL, Path(tmp) / "a.log", log_level="warning"),
            f"B ({args.b_source})": ServerProcess(
                MODEL, Path(tmp) / "b.log", log_level="warning", source=args.b_source
            ),
        }
        measured = in_turn(
            servers,
            args.rounds,
            lambda server: run(bursts(server.port, args, texts, args.bursts)),
            lambda server: run(bursts(server.port, args, texts, 2)),  # warm: first requests' costs unmeasured
        )
    results = {
        name: ([ms for r in rounds for ms in r[0]], [ms for r in rounds for ms in r[1]])
        for name, rounds in measured.items()
    }
    print(f"{args.requests} requests of {args.inputs} inputs at once after {args.pause} s idle:")
    for name, (slowest, alone) in results.items():
        print(
            f"{name}: the burst's slowest p50 {pct(slowest, 0.5):.1f} p90 {pct(slowest, 0.9):.1f} max "
            f"{max(slowest):.1f} ms; one request alone p50 {pct(alone, 0.5):.1f} p90 {pct(alone, 0.9):.1f} ms"
        )


if __name__ == "__main__":
    main()
