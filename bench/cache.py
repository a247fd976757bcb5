"""The exact result cache: what it buys on a corpus with repeats, what it costs on one without, a
hit's latency against a miss, and the HTTP process's RSS after many distinct inputs, bounded.

Two servers on the same model, cache off (WARMPOOL_CACHE_BYTES=0, the baseline) and on, measured
in the same run: a corpus where 35 % of the rows repeat earlier ones and one with none, each at
`--clients` clients, in `--rounds` paired rounds (a fresh corpus each, the servers' order alternating:
the machine drifts by more than the cache costs), in requests of each `--corpus-per-request` size
(one input a request puts the per-request cost of HTTP, tokenizing and rendering, the same for a hit,
on the 2 cores the engines share), as inputs/s and p99, the ratio on/off; then at 1 client a hit's
latency against a miss's (distinct inputs, then the same ones again); then, on a fresh server,
`--distinct` inputs through a cache bounded at `--bound`, the HTTP process's RSS growth, and the same
on a fresh server with the cache off: the difference is the cache's own share (the rest grows without
it). Prints; never asserts.
Usage: .venv/bin/python -m bench.cache [--rows 2000] [--clients 32] [--corpus-per-request 1,8] [--rounds 3]
         [--distinct 200000] [--bound 64Mi] [--per-request 128] [--memory-only | --no-memory]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from pathlib import Path

from bench.common import MODEL, WORDS, Connection, cpu_seconds, pct, process_tree, run, sentences
from common.settings import cache_bound
from tests.server_process import ServerProcess


def corpus(rows: int, repeated: float, seed: int) -> list[str]:
    """`rows` sentences, `repeated` of them copies of earlier rows (shuffled in), the rest distinct."""
    rng = random.Random(seed)
    distinct = sentences(rows - int(rows * repeated), seed=seed)
    texts = distinct + [rng.choice(distinct) for _ in range(rows - len(distinct))]
    rng.shuffle(texts)
    return texts


async def drive(port: int, texts: list[str], clients: int, per_request: int = 1) -> tuple[float, list[float]]:
    """The texts in requests of `per_request` (in order), `clients` at a time: inputs/s and each
    request's latency (ms)."""
    queue: asyncio.Queue[str | list[str]] = asyncio.Queue()
    for i in range(0, len(texts), per_request):
        queue.put_nowait(texts[i] if per_request == 1 else texts[i : i + per_request])
    latencies: list[float] = []

    async def client() -> None:
        conn = Connection(port)
        while not queue.empty():
            text = queue.get_nowait()
            started = time.perf_counter()
            status, _, _ = await conn.post("/v1/embeddings", {"input": text})
            assert status == 200, status
            latencies.append((time.perf_counter() - started) * 1000)
        conn.close()

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return len(texts) / (time.perf_counter() - started), latencies


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def short_texts(n: int, seed: int) -> list[str]:
    """n distinct short texts (1-4 words and a serial number, ~10 tokens): a cache entry's size does not
    depend on its text's length, so short ones fill the cache at the least engine time."""
    rng = random.Random(seed)
    return [f"{' '.join(rng.choices(WORDS, k=rng.randint(1, 4)))} {seed}-{i}" for i in range(n)]


async def drive_batched(port: int, texts: list[str], per_request: int, clients: int) -> int:
    """`texts` in requests of `per_request` inputs, `clients` at a time; the requests that failed."""
    queue = [texts[i : i + per_request] for i in range(0, len(texts), per_request)][::-1]
    failed = 0

    async def client() -> None:
        nonlocal failed
        conn = Connection(port)
        while queue:
            status, _, _ = await conn.post("/v1/embeddings", {"input": queue.pop()})
            failed += status != 200
        conn.close()

    await asyncio.gather(*(client() for _ in range(clients)))
    return failed


def measured(server: ServerProcess, texts: list[str], clients: int, size: int, label: str) -> float:
    """One pass of `texts` through `server`: prints inputs/s, p99 and each process's cores; the rate."""
    pids = process_tree(server.proc.pid)
    before, started = [cpu_seconds(p) for p in pids], time.perf_counter()
    rate, latencies = run(drive(server.port, texts, clients, size))
    wall = time.perf_counter() - started
    cores = [(cpu_seconds(p) - b) / wall for p, b in zip(pids, before, strict=True)]
    print(
        f"    {label:>36}: {rate:8.1f}/s  p99 {pct(latencies, 0.99):7.1f}  cores: HTTP process {cores[0]:.2f}, "
        f"engines and forkserver {sum(cores[1:]):.2f}"
    )
    return rate


def comparisons(servers: dict[str, ServerProcess], rows: int, clients: int, sizes: list[int], rounds: int) -> None:
    """Cache on against off on a corpus with repeats and one without, for each request size, in `rounds`
    paired rounds (a fresh corpus each: the cache holds none of its texts; the order alternating, so
    both see the machine's drift alike): per round inputs/s, p99 and the cores each process used, then
    the median of the per-round ratios on/off; then a hit's latency against a miss."""
    for size, seed in zip(sizes, range(10, 1000, 10), strict=False):
        print(f"{rows} rows, {clients} clients, {size} input(s) a request: inputs/s, p99 ms")
        for label, repeated in (("35% repeated", 0.35), ("no repeats", 0.0)):
            ratios = []
            for r in range(rounds):
                texts = corpus(rows, repeated, seed * 100 + 2 * r + (repeated == 0))
                got = {}
                for mode in ("off", "on") if r % 2 == 0 else ("on", "off"):
                    got[mode] = measured(servers[mode], texts, clients, size, f"{label}, round {r + 1}, cache {mode}")
                ratios.append(got["on"] / got["off"])
            each = ", ".join(f"{x:.2f}" for x in ratios)
            print(f"  {label:>13}: on/off {statistics.median(ratios):.2f}x (rounds {each})")
    on = servers["on"]
    fresh = sentences(200, seed=3)
    _, misses = run(drive(on.port, fresh, 1))
    _, hits = run(drive(on.port, fresh, 1))
    print(
        f"1 client: miss median {statistics.median(misses):.2f} ms, hit median {statistics.median(hits):.2f} ms"
        f" (a hit {statistics.median(misses) / statistics.median(hits):.1f}x faster)"
    )


def grown(server: ServerProcess, distinct: int, per_request: int) -> tuple[float, float, int]:
    """The HTTP process's RSS growth (MB) over `distinct` inputs, their inputs/s and the failed requests."""
    # first-call costs paid, and every executor thread's heap made, before the baseline
    run(drive_batched(server.port, short_texts(8 * per_request, seed=5), per_request, 4))
    before = rss_mb(server.proc.pid)
    started = time.perf_counter()
    failed = run(drive_batched(server.port, short_texts(distinct, seed=4), per_request, 4))
    seconds = time.perf_counter() - started
    return rss_mb(server.proc.pid) - before, distinct / seconds, failed


def memory(model: Path, logs: Path, bound: str, distinct: int, per_request: int) -> None:
    """The HTTP process's RSS growth over `distinct` inputs with the cache off and on (fresh servers,
    the same traffic): the difference is the cache's share, against its bound + 10 %."""
    growth: dict[str, float] = {}
    for mode, cache_bytes in (("off", "0"), ("on", bound)):
        server = ServerProcess(model, logs / f"memory-{mode}.log", cache_bytes=cache_bytes)
        try:
            growth[mode], rate, failed = grown(server.wait_ready(), distinct, per_request)
            cache = server.get("/status").json()["cache"]
        finally:
            server.stop()
        print(
            f"cache {mode:>3}: {distinct} distinct inputs in requests of {per_request} ({rate:.0f} inputs/s,"
            f" {failed} failed requests): HTTP process RSS +{growth[mode]:.1f} MB"
            + (
                f"; cache {cache['bytes'] / 2**20:.1f} MiB, {cache['entries']} entries, {cache['evictions']} evictions"
                if cache["enabled"]
                else ""
            )
        )
    allowed = cache_bound(bound, None) * 1.1 / 1e6
    share = growth["on"] - growth["off"]
    print(
        f"the cache's share (on - off): +{share:.1f} MB against the bound + 10 % {allowed:.1f} MB"
        f" ({share / allowed:.2f}x); all growth with the cache on {growth['on'] / allowed:.2f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--distinct", type=int, default=200_000)
    parser.add_argument("--bound", default="64Mi")
    parser.add_argument("--per-request", type=int, default=128, help="inputs a request in the memory pass")
    parser.add_argument("--corpus-per-request", default="1,8", help="inputs a request in the corpus passes")
    parser.add_argument("--rounds", type=int, default=3, help="paired rounds per corpus and request size")
    parser.add_argument("--model", type=Path, default=MODEL)
    parser.add_argument("--memory-only", action="store_true", help="the memory pass alone")
    parser.add_argument("--no-memory", action="store_true", help="the throughput passes alone")
    args = parser.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="bench-cache-"))
    if not args.memory_only:
        throughput(args, logs)
    if not args.no_memory:
        memory(args.model, logs, args.bound, args.distinct, args.per_request)


def throughput(args: argparse.Namespace, logs: Path) -> None:
    servers = {
        "off": ServerProcess(args.model, logs / "off.log", cache_bytes="0"),
        "on": ServerProcess(args.model, logs / "on.log", cache_bytes=args.bound),
    }
    try:
        for server in servers.values():
            server.wait_ready()
        sizes = [int(n) for n in args.corpus_per_request.split(",")]
        comparisons(servers, args.rows, args.clients, sizes, args.rounds)
    finally:
        for server in servers.values():
            server.stop()


if __name__ == "__main__":
    main()
