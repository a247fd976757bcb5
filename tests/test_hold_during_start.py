"""WARMPOOL_HOLD_DURING_START=on: a request that arrives while the appliance starts (even while the
early responder still has the port) is held and answered once the model is ready, instead of a
503; past WARMPOOL_LOAD_WAIT it is a 503 with Retry-After. Readiness probes are unchanged."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from tests.server_process import ServerProcess, wait_for


def send_early(server: ServerProcess, body: dict[str, Any]) -> tuple[dict[str, Any], threading.Thread]:
    """Once the port answers probes (the early responder), post `body` from a thread; what was seen
    then: the readiness status before sending, and the response."""
    live = wait_for(lambda: (r := server.get("/health/live")).status_code == 200 and r, 30, "liveness", 0.01)
    assert live.status_code == 200
    seen: dict[str, Any] = {"ready_before": server.get("/health/ready").status_code}

    def post() -> None:
        with httpx.Client(base_url=server.url, timeout=90) as client:
            seen["response"] = client.post("/v1/embeddings", json=body)

    thread = threading.Thread(target=post)
    thread.start()
    return seen, thread


def test_a_request_sent_while_starting_is_answered_once_ready(model_dir: Path, tmp_path: Path) -> None:
    """Posted while readiness is still 503, the request is held and answered 200 with the vector a
    request after the start gets; readiness itself still said 503 meanwhile."""
    server = ServerProcess(model_dir, tmp_path / "hold.log", hold_during_start="on")
    try:
        seen, thread = send_early(server, {"input": "held while starting"})
        assert seen["ready_before"] == 503
        thread.join(90)
        r = seen["response"]
        assert r.status_code == 200, r.text
        server.wait_ready()
        later = server.post("/v1/embeddings", json={"input": "held while starting"}).json()["data"][0]["embedding"]
        np.testing.assert_allclose(r.json()["data"][0]["embedding"], later, atol=1e-6)
    finally:
        assert server.stop() == 0


def test_a_request_held_past_the_load_wait_is_a_503_with_retry_after(model_dir: Path, tmp_path: Path) -> None:
    """With WARMPOOL_LOAD_WAIT shorter than the start, the held request is answered 503 with
    Retry-After when the wait runs out, before the model is ready."""
    server = ServerProcess(model_dir, tmp_path / "hold.log", hold_during_start="on", load_wait=0.3)
    try:
        seen, thread = send_early(server, {"input": "too early"})
        thread.join(30)
        r = seen["response"]
        assert r.status_code == 503 and r.headers["retry-after"], r.text
        assert "starting" in r.json()["error"]["message"]
        server.wait_ready()  # and then served, as ever
        assert server.post("/v1/embeddings", json={"input": "in time"}).status_code == 200
    finally:
        assert server.stop() == 0
