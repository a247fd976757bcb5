"""Chaos under steady load: engines killed and hung, clients leaving mid-request.

Clients keep posting embeddings while, cycle after cycle, an engine is killed with SIGKILL and
another is stopped with SIGSTOP past the stall timeout, and an impatient client walks away from
its requests; first of all the forkserver hangs (SIGSTOP) as an engine dies, so that the re-fork
overruns, the forkserver is replaced, and the cycles then kill and hang engines of both forkservers.
Every request must end as 200 with the right vectors, or as 503/429 with
Retry-After; none may hang, fail with another status or lose its connection; liveness and
readiness answer throughout, and nothing is left admitted or queued afterwards.
"""

from __future__ import annotations

import contextlib
import os
import signal
import statistics
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.server_process import ServerProcess, wait_for

TEXTS = [
    "short",
    "a sentence of middling length about warm pools",
    " ".join(["a much longer input that keeps going"] * 12),
    "ünïcödé and emoji 🚀 survive the chaos",
]
CYCLES = 3
STALL_TIMEOUT_S = 2.0


class Load:
    """Client threads, an impatient client and probes, all recording what they saw until stopped."""

    def __init__(self, server: ServerProcess, expected: np.ndarray) -> None:
        self.server = server
        self.expected = expected
        self.stop = threading.Event()
        self.outcomes: Counter[str] = Counter()
        self.failures: list[str] = []
        self.live: list[tuple[float, float, int]] = []  # (when, seconds, status)
        self.ready: list[int] = []
        self.lock = threading.Lock()

    def note(self, outcome: str, failure: str | None = None) -> None:
        with self.lock:
            self.outcomes[outcome] += 1
            if failure:
                self.failures.append(failure)

    def client(self, index: int) -> None:
        with httpx.Client(base_url=self.server.url, timeout=60) as http:
            while not self.stop.is_set():
                picks = [(index + k) % len(TEXTS) for k in range(1 + index % 3)]
                try:
                    r = http.post("/v1/embeddings", json={"input": [TEXTS[p] for p in picks]})
                except httpx.HTTPError as exc:  # a reset, a hang past 60 s: never acceptable
                    self.note("transport_error", f"{type(exc).__name__}: {exc}")
                    continue
                if r.status_code == 200:
                    got = np.asarray([d["embedding"] for d in r.json()["data"]])
                    ok = np.allclose(got, self.expected[picks], atol=1e-5, rtol=0)
                    self.note("200" if ok else "wrong_vectors", None if ok else "vectors differ")
                elif r.status_code in (429, 503) and r.headers.get("retry-after"):
                    self.note(str(r.status_code))
                else:
                    self.note(f"status_{r.status_code}", r.text[:200])

    def impatient(self) -> None:
        """Leaves each request after 30 ms, mid-flight: some while queued, some while running."""
        body = {"input": [TEXTS[2]] * 16}
        with httpx.Client(base_url=self.server.url, timeout=0.03) as http:
            while not self.stop.is_set():
                with contextlib.suppress(httpx.TimeoutException):
                    http.post("/v1/embeddings", json=body)
                self.note("abandoned")

    def probe(self) -> None:
        with httpx.Client(base_url=self.server.url, timeout=5) as http:
            while not self.stop.is_set():
                started = time.monotonic()
                try:
                    live = http.get("/health/live").status_code
                except httpx.HTTPError:
                    live = 0
                self.live.append((started, time.monotonic() - started, live))
                with contextlib.suppress(httpx.HTTPError):
                    self.ready.append(http.get("/health/ready").status_code)
                self.stop.wait(0.02)  # the probe's period, not a synchronisation

    @contextlib.contextmanager
    def running(self, clients: int) -> Iterator[Load]:
        threads = [threading.Thread(target=self.client, args=(i,)) for i in range(clients)]
        threads += [threading.Thread(target=self.impatient), threading.Thread(target=self.probe)]
        for thread in threads:
            thread.start()
        try:
            yield self
        finally:
            self.stop.set()
            for thread in threads:
                thread.join(90)
            assert not any(t.is_alive() for t in threads), "a client hung"


@pytest.fixture
def chaos_server(model_dir: Path, tmp_path: Path) -> Iterator[ServerProcess]:
    server = ServerProcess(
        model_dir,
        tmp_path / "chaos.log",
        engines=2,
        engine_stall_timeout=STALL_TIMEOUT_S,
        max_restarts=4 * CYCLES,
        request_timeout=30,
    ).wait_ready()
    server.wait_engines()
    yield server
    server.stop()


def engine_detail(server: ServerProcess) -> dict[str, object]:
    detail: dict[str, object] = server.phase("engine")["detail"]
    return detail


def replaced(server: ServerProcess, victim: int) -> bool:
    detail = engine_detail(server)
    return victim not in detail["pids"] and detail["up"] == 2  # type: ignore[operator]


def hang_the_forkserver(server: ServerProcess, load: Load) -> None:
    """SIGSTOP the forkserver and SIGKILL engine 0: the survivor serves while the re-fork overruns and
    the forkserver is replaced; the engine comes back from the new one."""
    detail = engine_detail(server)
    hung = next(m["pid"] for m in detail["memory"] if m["process"] == "forkserver")  # type: ignore[attr-defined]
    victim = detail["pids"][0]  # type: ignore[index]
    os.kill(hung, signal.SIGSTOP)
    try:
        os.kill(victim, signal.SIGKILL)
        served = load.outcomes["200"]
        wait_for(lambda: replaced(server, victim), 90, "the engine back from a new forkserver")
        assert load.outcomes["200"] > served, "the surviving engine served nothing meanwhile"
    finally:
        with contextlib.suppress(ProcessLookupError):  # it is gone by then, unless the test failed
            os.kill(hung, signal.SIGCONT)


@pytest.mark.alone  # a stall is a deadline missed: beside another worker a busy engine could miss it too
def test_chaos_under_load(chaos_server: ServerProcess) -> None:
    """Kill and hang engines in turn under load: nothing but 200 (the healthy server's vectors) or
    503/429 with Retry-After, probes answer while an engine hangs, and everything drains back to zero."""
    server = chaos_server
    # what every answer under chaos must be: the server's own before it (its vectors against
    # sentence-transformers': tests/unit/test_families.py, tests/test_native_families.py)
    healthy = server.post("/v1/embeddings", json={"input": TEXTS})
    assert healthy.status_code == 200, healthy.text
    expected = np.asarray([d["embedding"] for d in healthy.json()["data"]])
    stopped_windows: list[tuple[float, float]] = []
    with Load(server, expected).running(clients=6) as load:
        wait_for(lambda: load.outcomes["200"] >= 20, 60, "load to build up")
        hang_the_forkserver(server, load)
        for cycle in range(CYCLES):
            pids = [int(p) for p in engine_detail(server)["pids"]]  # type: ignore[attr-defined]
            victim = pids[cycle % 2]
            os.kill(victim, signal.SIGKILL)
            wait_for(lambda v=victim: replaced(server, v), 30, "the killed engine's replacement")
            hung = [int(p) for p in engine_detail(server)["pids"]][(cycle + 1) % 2]  # type: ignore[attr-defined]
            os.kill(hung, signal.SIGSTOP)
            started = time.monotonic()
            wait_for(lambda h=hung: replaced(server, h), 30, "the hung engine's replacement")
            stopped_windows.append((started, time.monotonic()))
            served = load.outcomes["200"]
            wait_for(lambda s=served: load.outcomes["200"] >= s + 10, 60, "service after the replacement")
    assert load.failures == [], load.failures[:5]
    assert set(load.outcomes) <= {"200", "503", "429", "abandoned"}, load.outcomes
    assert load.outcomes["abandoned"] > 0
    detail = engine_detail(server)
    assert detail["stalls"] == CYCLES and detail["restarts"] == 2 * CYCLES + 2  # the overrun try, then one
    assert detail["forkserver_replacements"] == 1
    # Readiness told the truth: another engine was up throughout, so it never dropped.
    assert set(load.ready) == {200}, Counter(load.ready)
    # Liveness answered every probe, also while an engine hung (the order implies the bound).
    assert {status for _, _, status in load.live} == {200}
    for start, end in stopped_windows:
        assert any(start <= t <= end for t, _, _ in load.live), "no liveness answer while an engine hung"
    latencies = sorted(seconds for _, seconds, _ in load.live)
    p99 = latencies[int(0.99 * (len(latencies) - 1))]
    print(
        f"chaos: {dict(load.outcomes)}; /health/live p50 {statistics.median(latencies) * 1000:.1f} ms, "
        f"p99 {p99 * 1000:.1f} ms over {len(latencies)} probes"
    )
    wait_for(
        lambda: (
            "warmpool_inputs_in_flight 0.0" in (text := server.get("/metrics").text)
            and "warmpool_queue_depth 0.0" in text
        ),
        30,
        "permits and queue depth back to zero",
    )
