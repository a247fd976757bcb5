"""A full server's refusals are cheap: 429 before the body is read, its body encoded once, its
access-log line at debug level (the metrics still count it). Raw ASGI calls into the real app."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from server.core.admission import Admission
from server.core.services import ServedModel, Services
from server.http.app import create_app, with_middleware
from tests.unit.served import served

OVERLOADED = "server is overloaded: too many inputs in flight; retry later"
BODY = json.dumps({"input": "refused"}).encode()


@pytest.fixture
def svc(model_dir: Path) -> Iterator[Services]:
    """The embedded model served, every phase done, its 4 permits all held."""
    with served(model_dir, permits=4, threads=1) as services:
        services.admission.try_acquire(4)
        yield services


def post(app: Any, path: str = "/v1/embeddings") -> tuple[int, dict[str, str], bytes, int]:
    """(status, headers, body, how many times the app asked for the request body)."""
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "path": path,
        "raw_path": path.encode(), "root_path": "", "scheme": "http", "query_string": b"", "server": ("t", 80),
        "client": ("127.0.0.1", 1), "headers": [(b"content-type", b"application/json"), (b"content-length", b"19")],
    }  # fmt: skip
    reads = 0
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal reads
        reads += 1
        return {"type": "http.request", "body": BODY, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    headers = {k.decode(): v.decode() for k, v in sent[0]["headers"]}
    return sent[0]["status"], headers, b"".join(m.get("body", b"") for m in sent[1:]), reads


def test_a_full_server_refuses_before_reading_the_body(svc: Services) -> None:
    status, headers, body, reads = post(with_middleware(create_app(svc)))
    assert status == 429 and headers["retry-after"] == "1" and reads == 0
    assert json.loads(body)["error"]["code"] == "overloaded"
    assert svc.metrics.rejections.labels(reason="overloaded")._value.get() == 1


def test_with_a_model_of_its_own_permits_the_body_decides_and_is_read_first(svc: Services) -> None:
    """With several models each has its own permits: the body names the model, so it is read."""
    served = svc.models["minilm"]
    svc.models["minilm"] = ServedModel(served.name, served.folder, served.tokenizers, served.engine, Admission(1))
    svc.models["minilm"].admission.try_acquire(1)  # type: ignore[union-attr]
    status, _, _, reads = post(with_middleware(create_app(svc)))
    assert status == 429 and reads == 1


def test_a_refusal_is_logged_at_debug_level(svc: Services) -> None:
    """Under a flood an info line per 429 was most of a refusal's CPU; the metrics count them."""
    with capture_logs() as logs:
        post(with_middleware(create_app(svc)))
    (access,) = [e for e in logs if e["event"] == "request"]
    assert access["status"] == 429 and access["log_level"] == "debug"


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/v1/embeddings", {"error": {"message": OVERLOADED, "type": "rate_limit_error", "param": None,
                                      "code": "overloaded"}}),
        ("/embed", {"error": OVERLOADED, "error_type": "overloaded"}),
    ],
)  # fmt: skip
def test_the_refusal_body_is_the_surface_s_error_shape_every_time(svc: Services, path: str, expected: Any) -> None:
    """Its bytes are encoded once (server/http/errors.py): the same answer, call after call."""
    app = with_middleware(create_app(svc))
    first, second = post(app, path), post(app, path)
    assert json.loads(first[2]) == json.loads(second[2]) == expected
    assert first[1]["content-type"] == "application/json" and first[1]["content-length"] == str(len(first[2]))
