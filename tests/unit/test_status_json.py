"""GET /status's numbers and GET /'s answers, through the real app and middleware, in process."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from starlette.testclient import TestClient

from common.settings import Settings
from common.startup import StartupState
from server.core.services import Services
from server.http.app import create_app, with_middleware

HTML = {"accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"}  # what Chromium sends


def client_for(**settings: Any) -> Iterator[tuple[TestClient, Services]]:
    with ThreadPoolExecutor(2) as executor:
        svc = Services(settings=Settings(**settings), startup=StartupState(), executor=executor)
        with TestClient(with_middleware(create_app(svc))) as client:
            yield client, svc


@pytest.fixture
def app() -> Iterator[tuple[TestClient, Services]]:
    yield from client_for()


@pytest.fixture
def guarded() -> Iterator[tuple[TestClient, Services]]:
    yield from client_for(api_key="k3y")


def test_requests_count_api_routes_only(app: tuple[TestClient, Services]) -> None:
    """Probes, scrapes, the page, its polls and unknown paths are left out; API requests are counted
    by status class, with their latency sum and cumulative buckets."""
    client, _ = app
    for _ in range(3):
        assert client.post("/v1/embeddings", json={"input": "x"}).status_code == 503  # no model loaded
    for _ in range(2):
        assert client.get("/v1/models").status_code == 200
    for path in ("/health/live", "/metrics", "/status", "/", "/favicon.ico"):
        client.get(path)
    requests = client.get("/status").json()["requests"]
    assert requests["count"] == 5
    assert requests["by_class"] == {"2xx": 2, "5xx": 3}
    assert requests["seconds_sum"] > 0
    bounds = [le for le, _ in requests["buckets"]]
    assert bounds[-1] is None and bounds[:-1] == sorted(bounds[:-1])  # +Inf last, as null
    counts = [n for _, n in requests["buckets"]]
    assert counts == sorted(counts) and counts[-1] == 5  # cumulative, ending at the count


def test_engines_come_from_the_engine_phase_and_the_restart_counters(app: tuple[TestClient, Services]) -> None:
    """Engines up and configured from the phase detail; restarts both in the window and since start."""
    client, svc = app
    svc.startup.start("engine", engines=2, up=1, restarts=1, stalls=1)
    for _ in range(3):
        svc.metrics.restarts.labels(model="a").inc()
    svc.metrics.stalls.labels(model="b").inc()
    assert client.get("/status").json()["engines"] == {
        "configured": 2,
        "up": 1,
        "restarts_total": 3,
        "restarts_in_window": 1,
        "stalls_total": 1,
        "compiled": 0,
        "compile": "pending",
    }


def test_compiled_engines_come_from_the_compile_phase(app: tuple[TestClient, Services]) -> None:
    """The compiled engines are counted from the compile phase's per-engine modes, with its state."""
    client, svc = app
    svc.startup.start("compile", engines={"0": {"mode": "compiled"}, "1": {"mode": "eager", "compiling": True}})
    engines = client.get("/status").json()["engines"]
    assert (engines["compiled"], engines["compile"]) == (1, "running")


def test_queue_depth_and_inputs_are_the_metrics_gauges(app: tuple[TestClient, Services]) -> None:
    """queue_depth and inputs_in_flight read what warmpool_queue_depth and warmpool_inputs_in_flight do."""
    client, svc = app
    svc.metrics.queue_depth.set_function(lambda: 7)
    svc.metrics.in_flight.set_function(lambda: 11)
    body = client.get("/status").json()
    assert (body["queue_depth"], body["inputs_in_flight"]) == (7, 11)
    assert "warmpool_queue_depth 7.0" in client.get("/metrics").text


def test_status_carries_the_phase_table(app: tuple[TestClient, Services]) -> None:
    """Every startup phase, as /health/startup shows it, so the page needs one poll."""
    client, svc = app
    svc.startup.start("bind")
    body = client.get("/status").json()
    startup = client.get("/health/startup").json()
    assert [p["name"] for p in body["phases"]] == [p["name"] for p in startup["phases"]]
    assert body["phases"][0]["state"] == "running" and body["status"] == "starting"


def test_a_browser_gets_the_page(app: tuple[TestClient, Services]) -> None:
    """GET / with text/html in Accept: the self-contained HTML page, which polls /status."""
    response = app[0].get("/", headers=HTML)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    assert "accept" in response.headers["vary"]
    assert 'fetch("/status"' in response.text and "<script src" not in response.text  # nothing from elsewhere


def test_other_clients_get_a_json_pointer(app: tuple[TestClient, Services]) -> None:
    """GET / without text/html in Accept: JSON naming the page and the endpoints beside it."""
    response = app[0].get("/", headers={"accept": "application/json"})
    assert response.status_code == 200
    assert response.json()["status"] == "/status"


def test_page_and_status_need_no_api_key(guarded: tuple[TestClient, Services]) -> None:
    """Like the probes and /metrics, the page and its numbers are open: they expose nothing more."""
    client, _ = guarded
    assert client.get("/", headers=HTML).status_code == 200
    assert client.get("/status").status_code == 200


def test_post_root_still_needs_the_api_key(guarded: tuple[TestClient, Services]) -> None:
    """Only GET / is open: POST / (an API route) and the API routes still answer 401 without the key."""
    client, _ = guarded
    assert client.post("/", json={"inputs": "x"}).status_code == 401
    assert client.post("/v1/embeddings", json={"input": "x"}).status_code == 401
    assert client.get("/v1/models").status_code == 401


def test_several_models_sum_their_engines_and_compiled_engines() -> None:
    """With several models (phases engine:NAME, compile:NAME) the figures are summed over them."""
    with ThreadPoolExecutor(2) as executor:
        startup = StartupState(models=["a", "b"])
        svc = Services(settings=Settings(), startup=startup, executor=executor)
        startup.for_model("a").start("engine", engines=1, up=1)
        startup.for_model("b").start("engine", engines=2, up=2, restarts=1)
        startup.for_model("a").done("compile", engines={"0": {"mode": "compiled"}})
        startup.for_model("b").skip("compile", "WARMPOOL_COMPILE=off", engines={"0": {"mode": "eager"}})
        with TestClient(with_middleware(create_app(svc))) as client:
            engines = client.get("/status").json()["engines"]
    assert (engines["configured"], engines["up"], engines["restarts_in_window"]) == (3, 3, 1)
    assert (engines["compiled"], engines["compile"]) == (1, "done/skipped")
