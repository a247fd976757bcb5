"""Tenants of WARMPOOL_API_KEYS_FILE through the real app: 401, 403, 404 and 429 in each surface's
shape, quotas refilling on a fake clock, a key reloaded without a restart, and no key or digest in
the logs, the metrics or the traces."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from server.core import engine_turns
from server.tenants.buckets import LimitsTable
from tests.app.inprocess import InProcessServer, serving
from tests.app.test_errors import assert_openai_error

SEARCH, ADMIN, LIMITED, NARROW, SCRAPER = "search-key", "admin-key", "limited-key", "narrow-key", "scrape-key"
WAIT_S = 10.0


def keys_document(extra_key: str | None = None) -> dict[str, Any]:
    search_keys = ["sha256:" + hashlib.sha256(SEARCH.encode()).hexdigest()] + ([extra_key] if extra_key else [])
    return {
        "tenants": {
            "search": {"keys": search_keys, "scopes": ["inference"], "models": ["*"]},
            "ops": {"keys": [ADMIN], "scopes": ["admin", "metrics"]},
            "limited": {
                "keys": [LIMITED],
                "scopes": ["inference"],
                "quota": {"requests_per_second": 1, "tokens_per_minute": 12},
            },
            "narrow": {"keys": [NARROW], "scopes": ["inference"], "models": ["another-model"]},
            "scraper": {"keys": [SCRAPER], "scopes": ["metrics"]},
        }
    }


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def tenant_server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessServer]:
    path = tmp_path_factory.mktemp("secrets") / "keys.json"
    path.write_text(json.dumps(keys_document()))
    with serving(model_dir, api_keys_file=path) as app:
        yield app


@pytest.fixture
def clock(tenant_server: InProcessServer) -> FakeClock:
    """Fresh buckets on a fake clock: refills without sleeping."""
    keys = tenant_server.services.keys
    assert keys is not None
    fake = FakeClock()
    keys.clock = fake
    keys.next_check = fake()
    keys.limits = LimitsTable(fake)
    keys.limits.update(keys.ring)
    return fake


def post(server: InProcessServer, path: str, key: str | None, body: dict[str, Any]) -> Any:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return server.client.post(path, json=body, headers=headers)


SURFACES = [("/v1/embeddings", {"input": "hello"}), ("/embed", {"inputs": "hello"}), ("/v1/embed", {"texts": ["hi"]})]


def assert_shape(r: Any, path: str, status: int) -> None:
    assert r.status_code == status, r.text
    body = r.json()
    if path == "/embed":
        assert set(body) == {"error", "error_type"}
    elif path == "/v1/embed":
        assert set(body) == {"id", "message"}
    else:
        assert_openai_error(r, status)


@pytest.mark.parametrize(("path", "body"), SURFACES)
def test_no_key_is_a_401_in_the_surfaces_shape(tenant_server: InProcessServer, path: str, body: dict) -> None:  # type: ignore[type-arg]
    r = post(tenant_server, path, None, body)
    assert_shape(r, path, 401)
    assert r.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize(("path", "body"), SURFACES)
def test_a_tenants_key_is_served(tenant_server: InProcessServer, clock: FakeClock, path: str, body: dict) -> None:  # type: ignore[type-arg]
    assert post(tenant_server, path, SEARCH, body).status_code == 200


def test_the_admin_api_needs_the_admin_scope(tenant_server: InProcessServer) -> None:
    r = post(tenant_server, "/admin/models/nope/load", SEARCH, {})
    assert_openai_error(r, 403, "'admin' scope")
    assert r.json()["error"]["type"] == "permission_error"


def test_the_admin_api_without_a_key_is_a_401(tenant_server: InProcessServer) -> None:
    assert_openai_error(post(tenant_server, "/admin/models/nope/load", None, {}), 401)


def test_metrics_need_the_metrics_scope(tenant_server: InProcessServer) -> None:
    client = tenant_server.client
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers={"authorization": f"Bearer {SEARCH}"}).status_code == 403
    assert client.get("/metrics", headers={"authorization": f"Bearer {SCRAPER}"}).status_code == 200


@pytest.mark.parametrize(("path", "body"), SURFACES)
def test_requests_over_the_rate_are_a_429_with_ratelimit_headers(
    tenant_server: InProcessServer,
    clock: FakeClock,
    path: str,
    body: dict,  # type: ignore[type-arg]
) -> None:
    assert post(tenant_server, path, LIMITED, body).status_code == 200
    r = post(tenant_server, path, LIMITED, body)
    assert_shape(r, path, 429)
    assert r.headers["retry-after"] == "1"
    assert r.headers["x-ratelimit-limit-requests"] == "1"
    assert r.headers["x-ratelimit-remaining-requests"] == "0"
    assert r.headers["x-ratelimit-reset-requests"] == "1s"
    assert r.headers["x-ratelimit-limit-tokens"] == "12"


def test_a_refilled_bucket_serves_again(tenant_server: InProcessServer, clock: FakeClock) -> None:
    assert post(tenant_server, "/v1/embeddings", LIMITED, {"input": "a"}).status_code == 200
    assert post(tenant_server, "/v1/embeddings", LIMITED, {"input": "a"}).status_code == 429
    clock.now += 1.0
    assert post(tenant_server, "/v1/embeddings", LIMITED, {"input": "a"}).status_code == 200


def test_a_tenant_at_its_limit_does_not_stop_the_others(tenant_server: InProcessServer, clock: FakeClock) -> None:
    post(tenant_server, "/v1/embeddings", LIMITED, {"input": "a"})
    assert post(tenant_server, "/v1/embeddings", LIMITED, {"input": "a"}).status_code == 429
    assert post(tenant_server, "/v1/embeddings", SEARCH, {"input": "a"}).status_code == 200


def test_tokens_over_the_minute_are_a_429_before_the_engine(tenant_server: InProcessServer, clock: FakeClock) -> None:
    """'hello world' is 4 tokens with [CLS] and [SEP]: three such inputs fit 12 a minute, a fourth not."""
    assert post(tenant_server, "/v1/embeddings", LIMITED, {"input": ["hello world"] * 3}).status_code == 200
    clock.now += 1.0  # a request more, but no token
    r = post(tenant_server, "/embed", LIMITED, {"inputs": "hello world"})
    assert_shape(r, "/embed", 429)
    assert r.headers["x-ratelimit-remaining-tokens"] == "0"
    assert "tokens per minute" in r.json()["error"]


def test_a_model_outside_the_tenants_list_is_a_404(tenant_server: InProcessServer) -> None:
    model = tenant_server.services.configured[0]
    r = post(tenant_server, "/v1/embeddings", NARROW, {"input": "a", "model": model})
    assert_openai_error(r, 404, "may not use it")


def test_the_default_model_outside_the_tenants_list_is_a_404(tenant_server: InProcessServer) -> None:
    r = post(tenant_server, "/embed", NARROW, {"inputs": "a"})
    assert_shape(r, "/embed", 404)


def wait_for(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def test_a_key_added_to_the_file_is_served_without_a_restart(tenant_server: InProcessServer, clock: FakeClock) -> None:
    keys = tenant_server.services.keys
    assert keys is not None
    assert post(tenant_server, "/v1/embeddings", "brand-new-key", {"input": "a"}).status_code == 401
    keys.path.write_text(json.dumps(keys_document(extra_key="brand-new-key")))
    reloads = keys.reloads
    clock.now += keys.interval
    post(tenant_server, "/v1/embeddings", SEARCH, {"input": "a"})  # its poll starts the check
    wait_for(lambda: keys.reloads > reloads)
    assert post(tenant_server, "/v1/embeddings", "brand-new-key", {"input": "a"}).status_code == 200


def test_the_tenant_is_in_the_access_log_and_no_key_is(tenant_server: InProcessServer, clock: FakeClock) -> None:
    with capture_logs() as logs:
        post(tenant_server, "/v1/embeddings", LIMITED, {"input": "a"})
        post(tenant_server, "/v1/embeddings", LIMITED, {"input": "a"})
        post(tenant_server, "/v1/embeddings", "wrong-key", {"input": "a"})
    requests = [e for e in logs if e["event"] == "request"]
    assert [e["tenant"] for e in requests] == ["limited", "limited", None]
    text = repr(logs)
    for secret in (LIMITED, "wrong-key", hashlib.sha256(LIMITED.encode()).hexdigest()):
        assert secret not in text


def test_metrics_count_by_tenant_name_never_by_key(tenant_server: InProcessServer, clock: FakeClock) -> None:
    post(tenant_server, "/v1/embeddings", LIMITED, {"input": "a"})
    post(tenant_server, "/v1/embeddings", LIMITED, {"input": "a"})
    text = tenant_server.client.get("/metrics", headers={"authorization": f"Bearer {ADMIN}"}).text
    assert 'warmpool_tenant_rejections_total{reason="requests",tenant="limited"}' in text
    assert 'warmpool_tenant_tokens_total{tenant="limited"}' in text
    for secret in (LIMITED, SEARCH, hashlib.sha256(LIMITED.encode()).hexdigest()):
        assert secret not in text


def test_a_tenant_pressing_past_its_quota_is_demoted(tenant_server: InProcessServer, clock: FakeClock) -> None:
    """Let through after a refusal, the tenant's request runs as bulk work, and /metrics says so."""

    def demoted() -> str:
        text = tenant_server.client.get("/metrics", headers={"authorization": f"Bearer {ADMIN}"}).text
        return next((line for line in text.splitlines() if line.startswith("warmpool_tenant_demoted_total{")), "")

    assert post(tenant_server, "/v1/embeddings", LIMITED, {"input": "a"}).status_code == 200
    before = demoted()
    assert post(tenant_server, "/v1/embeddings", LIMITED, {"input": "a"}).status_code == 429
    clock.now += 1.0
    assert post(tenant_server, "/v1/embeddings", LIMITED, {"input": "a"}).status_code == 200
    after = demoted()
    assert after.startswith('warmpool_tenant_demoted_total{tenant="limited"}')
    assert float(after.split()[-1]) == (float(before.split()[-1]) if before else 0.0) + 1


def test_a_demoted_request_lets_the_others_go_first_and_its_queue_time_says_so(
    tenant_server: InProcessServer, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its wait for the others (server/core/engine_turns.py) is part of its time queued; the others' is not."""
    monkeypatch.setattr(engine_turns, "HOLD_MIN_S", 1.0)
    monkeypatch.setattr(engine_turns, "HOLD_MAX_S", 1.0)
    first = post(tenant_server, "/v1/embeddings", LIMITED, {"input": "held one"})
    assert first.status_code == 200 and float(first.headers["x-queue-time"]) < 1000
    assert post(tenant_server, "/v1/embeddings", LIMITED, {"input": "held two"}).status_code == 429
    clock.now += 1.0
    demoted = post(tenant_server, "/v1/embeddings", LIMITED, {"input": "held three"})  # none cached
    assert demoted.status_code == 200 and float(demoted.headers["x-queue-time"]) >= 1000


def test_the_engines_routing_weighs_each_tenants_tokens_by_name(
    tenant_server: InProcessServer, clock: FakeClock
) -> None:
    """The tenant's name reaches the engine client with its inputs: its share of the engines' work is
    what keeps a tenant sending past the others off the engine kept for them (server/core/engine_routing.py)."""
    (model,) = tenant_server.services.models.values()
    shares = model.engine.routing.shares
    before = shares.sent("search", time.monotonic())
    assert post(tenant_server, "/v1/embeddings", SEARCH, {"input": ["one two three", "four"]}).status_code == 200
    assert shares.sent("search", time.monotonic()) > before + 2  # its tokens, not the anonymous ""


def test_traces_carry_the_tenant_never_the_key(tenant_server: InProcessServer, clock: FakeClock) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from server.http.tracing import Tracing

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    svc = tenant_server.services
    svc.tracing = Tracing(provider)
    try:
        post(tenant_server, "/v1/embeddings", LIMITED, {"input": "a"})
    finally:
        svc.tracing = None
    spans = exporter.get_finished_spans()
    server_span = next(s for s in spans if s.name == "POST /v1/embeddings")
    assert server_span.attributes is not None and server_span.attributes["warmpool.tenant"] == "limited"
    text = repr([(s.name, dict(s.attributes or {}), [dict(e.attributes or {}) for e in s.events]) for s in spans])
    assert LIMITED not in text and hashlib.sha256(LIMITED.encode()).hexdigest() not in text


def test_status_shows_the_keys_file(tenant_server: InProcessServer) -> None:
    keys = tenant_server.client.get("/status").json()["keys"]
    assert keys["tenants"] == 5 and keys["error"] is None


def test_models_lists_only_the_tenants_models(tenant_server: InProcessServer) -> None:
    """`narrow` may use `another-model` only: the served model is not listed to it, and is to `search`."""
    listed = tenant_server.client.get("/v1/models", headers={"authorization": f"Bearer {NARROW}"}).json()["data"]
    assert listed == []
    every = tenant_server.client.get("/v1/models", headers={"authorization": f"Bearer {SEARCH}"}).json()["data"]
    assert len(every) == 1
