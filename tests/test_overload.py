"""Overload, metrics and disconnects: say no quickly, keep serving what was accepted, show it."""

from __future__ import annotations

import socket
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.server_process import ServerProcess, wait_for

LONG = " ".join(["load"] * 120)  # 122 tokens


def metrics(server: ServerProcess) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of /metrics, keyed by name and sorted labels, parsed by prometheus_client."""
    samples = {}
    for family in text_string_to_metric_families(server.get("/metrics").text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def moved(before: dict, after: dict, name: str, **labels: str) -> float:  # type: ignore[type-arg]
    key = (name, tuple(sorted(labels.items())))
    return after.get(key, 0.0) - before.get(key, 0.0)


def test_excess_inputs_get_429_and_accepted_ones_succeed(
    model_dir: Path,
    tmp_path: Path,
    st_model,  # type: ignore[no-untyped-def]
) -> None:
    server = ServerProcess(model_dir, tmp_path / "server.log", max_concurrent_inputs=16).wait_ready()
    texts = [f"{LONG} number {i}" for i in range(4)]
    expected = st_model.encode(texts, normalize_embeddings=True)
    live_codes: list[int] = []
    stop = threading.Event()

    def probe() -> None:
        with httpx.Client(base_url=server.url, timeout=10) as http:
            while not stop.is_set():
                live_codes.append(http.get("/health/live").status_code)

    def post() -> httpx.Response:
        with httpx.Client(base_url=server.url, timeout=60) as http:
            return http.post("/v1/embeddings", json={"input": texts})

    try:
        prober = threading.Thread(target=probe)
        prober.start()
        with ThreadPoolExecutor(24) as pool:
            responses = list(pool.map(lambda _: post(), range(24)))
        stop.set()
        prober.join()
        codes = Counter(r.status_code for r in responses)
        assert set(codes) == {200, 429}, codes
        for r in responses:
            if r.status_code == 429:
                assert r.headers["retry-after"] == "1"
                assert r.json()["error"]["code"] == "overloaded"
            else:
                got = np.asarray([d["embedding"] for d in r.json()["data"]])
                np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)
        assert live_codes and set(live_codes) == {200}
        after = metrics(server)
        assert after[("warmpool_rejections_total", (("reason", "overloaded"),))] == codes[429]
        assert after[("warmpool_inputs_in_flight", ())] == 0
    finally:
        stop.set()
        server.stop()


def test_metrics_move_by_exactly_the_requests_made(server: ServerProcess) -> None:
    before = metrics(server)
    for body in ({"input": "one"}, {"input": ["two"]}, {"input": ["a", "b", "c", "d", "e"]}):
        assert server.post("/v1/embeddings", json=body).status_code == 200
    assert server.post("/v1/embeddings", json={"input": []}).status_code == 400
    assert server.post("/tokenize", json={"prompt": "x"}).status_code == 200
    after = metrics(server)
    route = {"route": "/v1/embeddings"}
    assert moved(before, after, "warmpool_request_duration_seconds_count", **route, status="200") == 3
    assert moved(before, after, "warmpool_request_duration_seconds_count", **route, status="400") == 1
    assert moved(before, after, "warmpool_request_duration_seconds_count", route="/tokenize", status="200") == 1
    assert moved(before, after, "warmpool_request_duration_seconds_count", route="/metrics", status="200") == 1
    assert moved(before, after, "warmpool_batch_size_sum", model="all-MiniLM-L6-v2") == 7  # inputs the engine ran
    for name in ("queue_time", "inference_time"):  # per model
        assert moved(before, after, f"warmpool_{name}_seconds_count", model="all-MiniLM-L6-v2") == 3, name
    assert moved(before, after, "warmpool_tokenization_time_seconds_count") == 3
    assert after[("warmpool_queue_depth", ())] == 0
    phases = {k[1]: v for k, v in after.items() if k[0] == "warmpool_startup_phase_duration_seconds"}
    assert {dict(labels)["phase"] for labels in phases} == {
        "bind",
        "prefetch",
        "forkserver",
        "engine",
        "warmup",
        "compile",
        "ready",
    }
    prefetch = server.phase("prefetch")["detail"]  # what it read: what it found in the page cache it did not
    read = prefetch["bytes_done"] - prefetch["bytes_cached"]
    assert prefetch["bytes_done"] > 80_000_000
    assert after[("warmpool_prefetch_bytes", (("model", "all-MiniLM-L6-v2"),))] == read


def test_disconnected_client_inputs_never_run(server: ServerProcess) -> None:
    blocker_texts = [f"{LONG} {LONG} blocker {i}" for i in range(48)]
    before = metrics(server)
    with ThreadPoolExecutor(1) as pool:
        blocker = pool.submit(server.post, "/v1/embeddings", json={"input": blocker_texts})
        # Rows stream back as they finish, so the queue depth falls from 48 at once: wait on the
        # blocker having been sent (depth above 0) and on admission permits, which it holds to its end.
        wait_for(lambda: metrics(server)[("warmpool_queue_depth", ())] > 0, 30, "the blocker to queue")
        body = b'{"input": ["left one", "left two", "left three"]}'
        with socket.create_connection(("127.0.0.1", server.port)) as raw:
            raw.sendall(
                b"POST /v1/embeddings HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\n\r\n%s" % (len(body), body)
            )
            wait_for(lambda: metrics(server)[("warmpool_inputs_in_flight", ())] >= 51, 30, "the request to be admitted")
        assert blocker.result(timeout=120).status_code == 200
    wait_for(lambda: metrics(server)[("warmpool_queue_depth", ())] == 0, 30, "an empty queue")
    after = metrics(server)
    ran = moved(before, after, "warmpool_batch_size_sum", model="all-MiniLM-L6-v2")
    assert ran == 48  # the blocker's inputs, not the 3 left behind
    assert moved(before, after, "warmpool_client_disconnects_total") == 1
    assert after[("warmpool_inputs_in_flight", ())] == 0


@pytest.mark.alone  # three 16k-token batches on one engine: starved beside another worker, it is stalled out
def test_request_past_its_timeout_gets_503_and_its_queued_inputs_are_dropped(model_dir: Path, tmp_path: Path) -> None:
    server = ServerProcess(model_dir, tmp_path / "server.log", request_timeout=0.5, engines=1).wait_ready()
    try:
        before = metrics(server)
        # ~48k tokens: three batches of the 16k-token budget, each well over the 0.5 s timeout.
        r = server.post("/v1/embeddings", json={"input": [f"{LONG} {LONG} slow {i}" for i in range(200)]})
        assert r.status_code == 503
        assert r.json()["error"]["message"] == "timed out waiting for the engine"
        wait_for(lambda: metrics(server)[("warmpool_queue_depth", ())] == 0, 30, "an empty queue")
        # The batch under way still runs to its end; then short requests are answered again.
        wait_for(lambda: server.post("/v1/embeddings", json={"input": "short"}).status_code == 200, 60, "a 200")
        after = metrics(server)
        assert moved(before, after, "warmpool_batch_size_sum", model="all-MiniLM-L6-v2") < 200  # the rest never ran
        assert after[("warmpool_inputs_in_flight", ())] == 0
    finally:
        server.stop()


def test_body_over_the_limit_is_413(server: ServerProcess) -> None:
    r = server.post("/v1/embeddings", json={"input": "x" * (3 * 1024 * 1024)})
    assert r.status_code == 413
    assert "limit" in r.json()["error"]["message"]
