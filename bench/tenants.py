"""Tenants' quotas: does a noisy tenant over its quota slow the others, and what does the check cost?

1. One server with a keys file of three tenants. Two quiet tenants send paced 1-input requests;
   in the `noisy` condition a third tenant sends at 5x its `requests_per_second` (most of it refused
   with 429 at the request's head), in the `at its quota` condition at exactly its quota (the work
   the quota admits, nothing refused). Conditions rotate round by round, so drift hits them alike.
   Prints the quiet tenants' p50/p99 in each condition and the ratio to the condition without it:
   noisy against at-its-quota is what the traffic over the quota costs the others.
2. A paired micro-bench of the key check in process (TenantGuard on an app that answers nothing):
   a tenant with quotas admitted, the same tenant refused (429), against the single
   WARMPOOL_API_KEY (no quota) measured in the same run. Target: the quota check within 20 us a request.
Never asserts.
Every request is sent at its time whatever the answers before it (open loop), so each condition's
load is the same however slowly the server answers. By default every client sends in step (its
requests evenly spaced from one start: the two quiet tenants' arrive together); --poisson sends at
exponentially distributed gaps of the same mean, as independent clients do.
Usage: .venv/bin/python -m bench.tenants [--rounds 3] [--seconds 8] [--quiet-rate 20] [--noisy-quota 10]
       [--noisy-inputs 1] [--poisson]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import MODEL, Connection, pct, run, sentences
from tests.server_process import ServerProcess

QUIET = {"quiet-a": "key-quiet-a", "quiet-b": "key-quiet-b"}
NOISY_KEY = "key-noisy"


def keys_file(path: Path, noisy_quota: float) -> Path:
    tenants: dict[str, Any] = {name: {"keys": [key], "scopes": ["inference"]} for name, key in QUIET.items()}
    tenants["noisy"] = {"keys": [NOISY_KEY], "scopes": ["inference"], "quota": {"requests_per_second": noisy_quota}}
    path.write_text(json.dumps({"tenants": tenants}))
    return path


async def paced(
    port: int,
    key: str,
    rate: float,
    seconds: float,
    texts: list[str],
    seed: int,
    inputs: int = 1,
    poisson: bool = False,
) -> list[tuple[int, float]]:
    """(status, ms) of requests of `inputs` texts sent at `rate` a second for `seconds`, each at its time
    whatever the answers before it (open loop: a slow answer neither delays the next request nor
    stretches the round, so the load is the same whatever the server does), on as many keep-alive
    connections as are in flight at once: evenly spaced from the start, or (`poisson`) at exponentially
    distributed gaps of that mean, as independent clients send."""
    idle: list[Connection] = []
    opened: list[Connection] = []
    out: list[tuple[int, float]] = []
    headers = {"authorization": f"Bearer {key}"}

    async def send(body: dict[str, Any]) -> None:
        if not idle:
            opened.append(Connection(port))
            idle.append(opened[-1])
        conn = idle.pop()
        t0 = time.perf_counter()
        status, _, _ = await conn.post("/v1/embeddings", body, headers)
        out.append((status, (time.perf_counter() - t0) * 1000))
        idle.append(conn)

    rng = random.Random(seed)
    start, at = time.perf_counter(), 0.0
    sent = []
    for i in range(int(rate * seconds)):
        at = at + rng.expovariate(rate) if poisson else i / rate
        delay = start + at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        first = seed + i * inputs
        batch = [texts[(first + j) % len(texts)] for j in range(inputs)]
        sent.append(asyncio.ensure_future(send({"input": batch if inputs > 1 else batch[0]})))
    await asyncio.gather(*sent)
    for conn in opened:
        conn.close()
    return out


async def phase(
    port: int, args: argparse.Namespace, connections: int, texts: list[str]
) -> tuple[list[float], int, int]:
    """(quiet tenants' latencies of their 200s, the third tenant's 200s, its 429s), the third tenant
    sending `connections` streams of requests at its quota each (0: not at all)."""
    quiet = [
        paced(port, key, args.quiet_rate, args.seconds, texts, i * 97, poisson=args.poisson)
        for i, key in enumerate(QUIET.values())
    ]
    # each stream at its quota: five send 5x its rate
    third = [
        paced(port, NOISY_KEY, args.noisy_quota, args.seconds, texts, 7 + i, args.noisy_inputs, args.poisson)
        for i in range(connections)
    ]
    results = await asyncio.gather(*quiet, *third)
    latencies = [ms for r in results[: len(quiet)] for status, ms in r if status == 200]
    statuses = [status for r in results[len(quiet) :] for status, _ in r]
    return latencies, statuses.count(200), statuses.count(429)


# conditions: the third tenant's streams of requests at its quota each
CONDITIONS = {"without the third tenant": 0, "with it at its quota": 1, "with the noisy tenant (5x)": 5}


def micro(n: int, rounds: int) -> dict[str, float]:
    """us per request through TenantGuard, each condition's best round (rounds alternate)."""
    from server.http.metrics import Metrics
    from server.tenants.guard import StaticKeys, TenantGuard
    from server.tenants.keysfile import keyring, single_key_ring

    async def app(scope: Any, receive: Any, send: Any) -> None:
        return None

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    async def send(message: Any) -> None:
        return None

    quota = {"requests_per_second": 1e12, "tokens_per_minute": 10**9, "concurrent": 1000}
    ring = keyring({"tenants": {"t": {"keys": ["quota-key"], "scopes": ["inference"], "quota": quota}}})
    tight = keyring({"tenants": {"t": {"keys": ["quota-key"], "scopes": ["inference"], "quota": {"concurrent": 1}}}})
    metrics = Metrics(dict)
    tight_source = StaticKeys(tight)
    tight_source.limits["t"].admit()  # its one concurrent slot held for the whole run: every request refused
    guards = {
        "single key, no quota (baseline)": TenantGuard(app, StaticKeys(single_key_ring("quota-key")), metrics, _closed),
        "tenant with quotas, admitted": TenantGuard(app, StaticKeys(ring), metrics, _closed),
        "tenant over quota, refused (429)": TenantGuard(app, tight_source, metrics, _closed),
    }
    headers = [(b"authorization", b"Bearer quota-key")]
    best = {name: float("inf") for name in guards}
    for round_ in range(rounds):
        order = list(guards) if round_ % 2 == 0 else list(guards)[::-1]
        for name in order:
            guard = guards[name]
            t0 = time.perf_counter()
            for _ in range(n):
                scope = {"type": "http", "method": "POST", "path": "/v1/embeddings", "headers": headers}
                coro = guard(scope, receive, send)
                with contextlib.suppress(StopIteration):  # nothing awaits a real event: it ends at once
                    coro.send(None)
            best[name] = min(best[name], (time.perf_counter() - t0) / n * 1e6)
    return best


def _closed(path: str, method: str) -> bool:
    return False


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--quiet-rate", type=float, default=20, help="requests a second per quiet tenant")
    parser.add_argument("--noisy-quota", type=float, default=10, help="the noisy tenant's requests_per_second")
    parser.add_argument("--noisy-inputs", type=int, default=1, help="inputs in each of the third tenant's requests")
    parser.add_argument("--poisson", action="store_true", help="independent clients: exponential gaps, not in step")
    parser.add_argument("--micro-requests", type=int, default=200_000)
    args = parser.parse_args()
    texts = sentences(500)
    results: dict[str, tuple[list[float], int, int]] = {name: ([], 0, 0) for name in CONDITIONS}
    p99s: dict[str, list[float]] = {name: [] for name in CONDITIONS}  # each round's
    with tempfile.TemporaryDirectory() as tmp:
        keys = keys_file(Path(tmp) / "keys.json", args.noisy_quota)
        server = ServerProcess(MODEL, Path(tmp) / "server.log", log_level="warning", api_keys_file=keys).wait_ready()
        try:
            server.wait_engines()
            run(paced(server.port, QUIET["quiet-a"], 20, 1.0, texts, 0))  # warm: first requests' costs unmeasured
            names = list(CONDITIONS)
            for round_ in range(args.rounds):
                for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
                    lat, ok, refused = run(phase(server.port, args, CONDITIONS[name], texts))
                    before = results[name]
                    results[name] = (before[0] + lat, before[1] + ok, before[2] + refused)
                    p99s[name].append(pct(lat, 0.99))
        finally:
            server.stop()
    alone = results[names[0]][0]
    base_p50, base_p99 = pct(alone, 0.5), pct(alone, 0.99)
    for name, (lat, ok, refused) in results.items():
        p50, p99 = pct(lat, 0.5), pct(lat, 0.99)
        extra = f"; third tenant: {ok} served, {refused} refused (429)" if CONDITIONS[name] else ""
        print(
            f"{name}: quiet p50 {p50:.1f} ms ({p50 / base_p50:.2f}x), "
            f"p99 {p99:.1f} ms ({p99 / base_p99:.2f}x), {len(lat)} requests{extra}"
        )
    polite, noisy = (results[name][0] for name in names[1:])
    p50, p99 = pct(noisy, 0.5) / pct(polite, 0.5), pct(noisy, 0.99) / pct(polite, 0.99)
    print(f"noisy against at its quota: quiet p50 {p50:.2f}x, p99 {p99:.2f}x")
    for name in names[1:]:  # a round's p99 (a few hundred requests) moves more than the pooled one
        ratios = sorted(p / b for p, b in zip(p99s[name], p99s[names[0]], strict=True))
        print(
            f"{name}: each round's quiet p99 against the same round's without it: median "
            f"{statistics.median(ratios):.2f}x, {ratios[0]:.2f}-{ratios[-1]:.2f}x"
        )
    micro_us = micro(args.micro_requests, 2 * args.rounds)
    baseline = micro_us["single key, no quota (baseline)"]
    for name, us in micro_us.items():
        print(f"key check, {name}: {us:.2f} us/request ({us - baseline:+.2f} us against the baseline)")


if __name__ == "__main__":
    main()
