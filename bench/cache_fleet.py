"""The result cache across a fleet: two appliances sharing one Redis, and that Redis killed mid-run.

Three servers on the same model, measured in the same run: A and B with the cache on and one
redis-server behind both (Debian's, as tests/redis_server.py starts it), and one with the cache off.
- Sharing: A's first pass over `--rows` distinct texts (each a miss, written to Redis), then B's
  first pass over the same texts: B's hit ratio (x-cache) and inputs/s against A's first pass.
- Outage: `--clients` clients send distinct texts to A (each missing its LRU: a Redis lookup) for
  `--phase` seconds, then redis-server is killed (SIGKILL) and the load goes on for `--phase` seconds,
  then it is started again on its port and the load goes on `--phase` seconds more: failed requests
  and p99 of each phase against the cache-off server's p99 under the same load (the target: no failed
  request, the outage's p99 within 1.5x); recovery: A's breaker, Redis's keys again, and B's hits on
  the texts A answered once the breaker's cooldown had passed after the restart.
One input a request. Prints; never asserts.
Usage: .venv/bin/python -m bench.cache_fleet [--rows 2000] [--clients 32] [--phase 10] [--cache-timeout S]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import MODEL, Connection, pct, run, sentences
from server.core.shared_cache import BREAKER_COOLDOWN_S
from tests.redis_server import RedisServer
from tests.server_process import ServerProcess, wait_for


@dataclass
class Sample:
    """One request: when it came back (monotonic), its latency, status (0: no answer) and x-cache."""

    text: str
    done: float
    ms: float
    status: int
    cache: str


def distinct(seed: int) -> Iterator[str]:
    """Texts that never repeat (4-64 words and a serial number), in batches of 1000 sentences."""
    for round_ in itertools.count():
        for i, text in enumerate(sentences(1000, seed=seed * 100_000 + round_)):
            yield f"{text} {seed}-{round_}-{i}"


async def drive(port: int, texts: Iterator[str], clients: int, stop: asyncio.Event | None = None) -> list[Sample]:
    """Each text as one request, `clients` at a time, until `texts` ends or `stop` is set; a request
    that fails on the connection is a Sample with status 0 (the client reconnects)."""
    samples: list[Sample] = []

    async def client() -> None:
        conn = Connection(port)
        while not (stop is not None and stop.is_set()) and (text := next(texts, None)) is not None:
            started = time.monotonic()
            try:
                status, headers, _ = await conn.post("/v1/embeddings", {"input": text})
            except (OSError, asyncio.IncompleteReadError, ValueError):
                status, headers = 0, {}
                conn.close()
            done = time.monotonic()
            samples.append(Sample(text, done, (done - started) * 1000, status, headers.get("x-cache", "")))
        conn.close()

    await asyncio.gather(*(client() for _ in range(clients)))
    return samples


def rate(samples: list[Sample], seconds: float) -> str:
    failed = sum(s.status != 200 for s in samples)
    return f"{len(samples) / seconds:8.1f} inputs/s  p99 {pct([s.ms for s in samples], 0.99):7.1f} ms  failed {failed}"


def hit_ratio(samples: list[Sample]) -> float:
    return sum(s.cache == "hit" for s in samples) / max(len(samples), 1)


def shared_stats(server: ServerProcess) -> dict[str, Any]:
    cache: dict[str, Any] = server.get("/status").json()["cache"]
    return cache


def writes_settled(server: ServerProcess) -> dict[str, Any]:
    """The cache's figures once no Redis write is in flight (A's last answers written)."""
    found: dict[str, Any] = wait_for(
        lambda: (c := shared_stats(server))["shared"]["writes_in_flight"] == 0 and c, 30, "Redis writes done"
    )
    return found


def sharing(a: ServerProcess, b: ServerProcess, redis: RedisServer, rows: int, clients: int) -> None:
    texts = list(itertools.islice(distinct(1), rows))
    started = time.monotonic()
    first = run(drive(a.port, iter(texts), clients))
    a_s = time.monotonic() - started
    stats = writes_settled(a)
    print(f"A, first pass over {rows} distinct texts: {rate(first, a_s)}  hit ratio {hit_ratio(first):.2f}")
    print(f"  Redis holds {redis.keys()} keys; A's Redis: {stats['shared']}")
    started = time.monotonic()
    second = run(drive(b.port, iter(texts), clients))
    b_s = time.monotonic() - started
    print(f"B, first pass over A's texts:        {rate(second, b_s)}  hit ratio {hit_ratio(second):.2f}")
    print(f"  B's Redis: {shared_stats(b)['shared']}")
    print(f"  B/A: inputs/s {len(second) / b_s / (len(first) / a_s):.2f}x")


async def for_seconds(port: int, texts: Iterator[str], clients: int, seconds: float) -> list[Sample]:
    stop = asyncio.Event()
    asyncio.get_running_loop().call_later(seconds, stop.set)
    return await drive(port, texts, clients, stop)


async def outage_run(port: int, redis: RedisServer, clients: int, phase_s: float) -> tuple[list[Sample], list[float]]:
    """Load on `port` for three phases: Redis up, killed, started again. The samples, and when the load
    began, Redis was killed, it answered again, and the load ended."""
    stop = asyncio.Event()
    load = asyncio.ensure_future(drive(port, distinct(3), clients, stop))
    marks = [time.monotonic()]
    await asyncio.sleep(phase_s)
    marks.append(time.monotonic())
    await asyncio.to_thread(redis.stop)  # blocking calls off the loop: the clients keep driving
    await asyncio.sleep(phase_s)
    await asyncio.to_thread(redis.start)
    marks.append(time.monotonic())
    await asyncio.sleep(phase_s)
    stop.set()
    samples = await load
    return samples, [*marks, time.monotonic()]


def outage(
    a: ServerProcess, b: ServerProcess, off: ServerProcess, redis: RedisServer, clients: int, phase_s: float
) -> None:
    baseline = run(for_seconds(off.port, distinct(2), clients, phase_s))
    off_p99 = pct([s.ms for s in baseline], 0.99)
    print(f"{clients} clients, distinct texts, {phase_s:.0f} s a phase: inputs/s, p99, failed requests")
    print(f"  {'cache off':>24}: {rate(baseline, phase_s)}")
    errors_before = shared_stats(a)["shared"]["errors"]
    samples, marks = run(outage_run(a.port, redis, clients, phase_s))
    labels = ("cache on, Redis up", "Redis killed", "Redis started again")
    spans = list(itertools.pairwise(marks))  # (start, end) of each phase
    phases = {
        label: [s for s in samples if start <= s.done < end] for label, (start, end) in zip(labels, spans, strict=True)
    }
    for (label, within), (start, end) in zip(phases.items(), spans, strict=True):
        p99 = pct([s.ms for s in within], 0.99)
        print(f"  {label:>24}: {rate(within, end - start)}  (p99 {p99 / off_p99:.2f}x cache off)")
    stats = writes_settled(a)
    print(f"  A's Redis after: {stats['shared']} ({stats['shared']['errors'] - errors_before} failed calls)")
    print(f"  Redis holds {redis.keys()} keys after its restart")
    settled = marks[2] + BREAKER_COOLDOWN_S + 1  # the breaker lets a call through again after its cooldown
    recovered = [s.text for s in phases[labels[2]] if s.done > settled and s.status == 200]
    if recovered:
        again = run(drive(b.port, iter(recovered), clients))
        print(
            f"  B over {len(recovered)} texts A answered from {settled - marks[2]:.0f} s after the restart:"
            f" hit ratio {hit_ratio(again):.2f}; B's Redis: {shared_stats(b)['shared']}"
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--phase", type=float, default=10.0, help="seconds of each outage phase")
    parser.add_argument("--cache-timeout", type=float, help="WARMPOOL_CACHE_TIMEOUT (the server's default if unset)")
    parser.add_argument("--model", type=Path, default=MODEL)
    args = parser.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="bench-cache-fleet-"))
    redis = RedisServer(logs).start()
    shared = {"cache_url": redis.url} | ({"cache_timeout": args.cache_timeout} if args.cache_timeout else {})
    servers = {
        "a": ServerProcess(args.model, logs / "a.log", cache_bytes="64Mi", **shared),
        "b": ServerProcess(args.model, logs / "b.log", cache_bytes="64Mi", **shared),
        "off": ServerProcess(args.model, logs / "off.log", cache_bytes="0"),
    }
    try:
        for server in servers.values():
            server.wait_ready().wait_engines()
        print(f"Redis {redis.url}; logs in {logs}")
        sharing(servers["a"], servers["b"], redis, args.rows, args.clients)
        outage(servers["a"], servers["b"], servers["off"], redis, args.clients, args.phase)
    finally:
        for server in servers.values():
            server.stop()
        redis.stop()


if __name__ == "__main__":
    main()
