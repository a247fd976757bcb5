"""The invariance bench's client side (bench/invariance.py): random compositions around a probe text,
sent by concurrent clients; each vector's raw float32 bits; a server's engines' CPU time, batch metrics
and compile phase, watched while it switches to its compiled forward."""

from __future__ import annotations

import asyncio
import base64
import json
import random
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import MODEL, WORDS, Connection
from tests.server_process import ServerProcess


@dataclass
class Sent:
    """One request's answer: its vectors' bytes, in input order, and when it went and came back."""

    vectors: list[bytes]
    start: float
    end: float


def composition(rng: random.Random, words: int, probe: str) -> tuple[list[str], int]:
    size = rng.randint(1, 50)
    texts = [" ".join(rng.choices(WORDS, k=rng.randint(1, words))) for _ in range(size - 1)]
    at = rng.randint(0, size - 1)
    texts.insert(at, probe)
    return texts, at


def body(texts: list[str]) -> dict[str, Any]:
    return {"input": texts, "encoding_format": "base64"}


def vectors(data: bytes) -> list[bytes]:
    items = sorted(json.loads(data)["data"], key=lambda item: item["index"])
    return [base64.b64decode(item["embedding"]) for item in items]


async def send_all(port: int, requests: list[list[str]], clients: int) -> list[Sent]:
    """Every request once, `clients` at a time on keep-alive connections; answers in request order."""
    answers: list[Sent | None] = [None] * len(requests)
    order = iter(range(len(requests)))

    async def client() -> None:
        conn = Connection(port)
        for i in order:
            start = time.monotonic()
            status, _, data = await conn.post("/v1/embeddings", body(requests[i]))
            if status != 200:
                raise SystemExit(f"request {i} answered {status}: {data[:300]!r}")
            answers[i] = Sent(vectors(data), start, time.monotonic())
        conn.close()

    await asyncio.gather(*(client() for _ in range(clients)))
    return [a for a in answers if a is not None]


def max_diff(a: bytes, b: bytes) -> float:
    return float(np.max(np.abs(np.frombuffer(a, np.float32) - np.frombuffer(b, np.float32))))


def batch_metrics(server: ServerProcess) -> tuple[float, float, float]:
    """Groups run so far, their rows and their tokens, every model's."""
    totals = {"warmpool_batch_size_count": 0.0, "warmpool_batch_size_sum": 0.0, "warmpool_batch_tokens_sum": 0.0}
    for line in server.get("/metrics").text.splitlines():
        name = line.split("{")[0].split(" ")[0]
        if name in totals:
            totals[name] += float(line.split()[-1])
    return totals["warmpool_batch_size_count"], totals["warmpool_batch_size_sum"], totals["warmpool_batch_tokens_sum"]


class CompileWatch:
    """Polls /health/startup on a thread: each engine slot's compile mode over time, and the pids."""

    def __init__(self, server: ServerProcess, interval: float = 0.1) -> None:
        self.server = server
        self.changes: list[tuple[float, str, str]] = []  # (monotonic time, slot, mode)
        self.modes: dict[str, str] = {}
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._poll, args=(interval,), daemon=True)
        self.thread.start()

    def _poll(self, interval: float) -> None:
        while not self.stopping.wait(interval):
            try:
                phase = self.server.phase("compile")
            except Exception:  # a probe lost under load: the next one sees the change
                continue
            for slot, detail in (phase.get("detail") or {}).get("engines", {}).items():
                mode = "compiling" if detail.get("compiling") else detail.get("mode", "?")
                if self.modes.get(slot) != mode:
                    self.modes[slot] = mode
                    self.changes.append((time.monotonic(), slot, mode))

    def switched_at(self) -> dict[str, float]:
        """When each slot was first seen compiled (up to one poll interval late)."""
        seen: dict[str, float] = {}
        for when, slot, mode in self.changes:
            if mode == "compiled":
                seen.setdefault(slot, when)
        return seen

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(5)


def compile_summary(phase: dict[str, Any]) -> str:
    engines = (phase.get("detail") or {}).get("engines", {})
    keep = ("mode", "cache", "seconds", "reason")
    return f"{phase['state']}: " + json.dumps({s: {k: d[k] for k in keep if k in d} for s, d in engines.items()})


def start(log: Path, **settings: Any) -> ServerProcess | str:
    """A ready server, or why it is not served (a precision this CPU lacks fails its start)."""
    server = ServerProcess(MODEL, log, log_level="warning", fail_linger=0, **settings)
    try:
        return server.wait_ready(300)
    except AssertionError:
        server.stop()
        reason = [line for line in log.read_text(errors="replace").splitlines() if "dtype" in line or "error" in line]
        return "not served: " + (reason[-1][-160:] if reason else "the start failed")
