"""Load-generation pieces the benchmarks share: cheap keep-alive clients and an out-of-process prober.

The load generator shares 2 cores with the server, so it must cost little: a raw asyncio
HTTP/1.1 client (~0.1 ms of CPU a request) instead of a full client library. Probes run in
their own process so their latency is the server's, not the load generator's event loop.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import multiprocessing
import os
import random
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "models" / "all-MiniLM-L6-v2"

_TEXT = (
    "the model server answers quickly while batching many small requests into one pass over "
    "weights kept warm in memory so that every client sees low latency and high throughput even "
    "when traffic arrives in bursts from many machines at once across the network"
)
WORDS = _TEXT.split(" ")


def run(coro: Coroutine[Any, Any, T]) -> T:
    """asyncio.run on uvloop (uvicorn's standard extra installs it): the load generator's CPU per
    request falls from ~0.13 to ~0.09 ms, CPU the server it measures no longer has to share."""
    import uvloop

    return uvloop.run(coro)


def in_turn(
    servers: dict[str, Any], rounds: int, measure: Callable[[Any], T], warm: Callable[[Any], Any] | None = None
) -> dict[str, list[T]]:
    """`measure` of each of `servers` (tests.server_process.ServerProcess, by name; stopped at the end)
    once a round, the order reversed every other round (A B, B A, ...) so the machine's drift within a
    run hits them alike; each ready, its engines up and `warm` run on it first."""
    named = list(servers.items())
    results: dict[str, list[T]] = {name: [] for name in servers}
    try:
        for _, server in named:
            server.wait_ready().wait_engines()
            if warm is not None:
                warm(server)
        for number in range(rounds):
            for name, server in named if number % 2 == 0 else named[::-1]:
                results[name].append(measure(server))
    finally:
        for _, server in named:
            server.stop()
    return results


def compiled(folder: Path) -> dict[str, Any]:
    """ServerProcess settings for compiled engines, the artifact built into `folder` before ready (the
    test harness's default is compile=off)."""
    return {"compile": "required", "compile_cache": folder / "compile-cache"}


def chosen(**settings: Any) -> dict[str, Any]:
    """The settings given a value (a flag left unset keeps the server's default)."""
    return {name: value for name, value in settings.items() if value}


def sentences(n: int, seed: int = 0) -> list[str]:
    """Sentences of 4-64 words."""
    rng = random.Random(seed)
    return [" ".join(rng.choices(WORDS, k=rng.randint(4, 64))) for _ in range(n)]


def process_tree(pid: int) -> list[int]:
    """`pid` and every process below it (engines are the forkserver's children, not the server's)."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        found.append(todo.pop())
        todo += parents.get(found[-1], [])
    return found


def cpu_ticks(pid: int) -> int:
    """utime + stime of one process, in clock ticks (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0
    return int(fields[11]) + int(fields[12])


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) one process has used; 0 once it is gone."""
    return cpu_ticks(pid) / os.sysconf("SC_CLK_TCK")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)] if ordered else float("nan")


class Connection:
    """One keep-alive HTTP/1.1 connection on asyncio streams."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(
        self, path: str, body: Any, headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        """POST `body` as JSON (bytes: JSON already encoded, as for bench.images' large bodies), with
        `headers` more (an API key)."""
        if self.writer is None or self.writer.is_closing():
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        assert self.reader is not None
        payload = body if isinstance(body, bytes) else json.dumps(body).encode()
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self.writer.write(
            f"POST {path} HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\n{extra}"
            f"content-length: {len(payload)}\r\n\r\n".encode()
            + payload
        )
        head = (await self.reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        status = int(head[0].split(" ")[1])
        headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in head[1:] if h)}
        data = await self.reader.readexactly(int(headers.get("content-length", 0)))
        if headers.get("connection") == "close":
            self.writer.close()
        return status, headers, data

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def _probe(port: int, path: str, interval: float, conn: Any) -> None:
    latencies: list[float] = []
    client = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.send("ready")
    while not conn.poll(interval):
        started = time.perf_counter()
        client.request("GET", path)
        client.getresponse().read()
        latencies.append((time.perf_counter() - started) * 1000)
    conn.send(latencies)


class Prober:
    """GET `path` every `interval` seconds from another process; stop() returns latencies in ms.
    Returns once that process has started: its interpreter's start (~0.3 s of CPU) is not paid
    inside the load it measures (it was the slowest request of every 1-client window)."""

    def __init__(self, port: int, path: str = "/health/live", interval: float = 0.02) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_probe, args=(port, path, interval, child), daemon=True)
        self._proc.start()
        self._conn.recv()  # "ready"

    def stop(self) -> list[float]:
        self._conn.send("stop")
        latencies: list[float] = self._conn.recv()
        self._proc.join()
        return latencies
