"""ASGI middleware: request ids, in-flight count, metrics and access log; body limit; which paths need
no key (the key check itself: server/tenants/guard.py)."""

from __future__ import annotations

import time
from typing import Any

import structlog
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.core.ids import random_hex
from server.core.services import Services
from server.http.errors import APIError, error_response

OPEN_PATHS = ("/health", "/version", "/status")  # /metrics: the key check decides (server/tenants/guard.py)
OPEN_PAGES = ("/",)  # open to GET only (the status page): POST / is an API route and keeps the key
TRACESTATE_LIMIT = 8192  # 32 entries of 256 characters, what W3C trace context allows
UPLOAD_FORM_BYTES = 64 * 1024  # a Batch API upload's multipart framing and its other fields
QUIET_PATHS = ("/health", "/metrics", "/status")  # probes, scrapes and the status page's polls log at debug level

access_log = structlog.get_logger("warmpool.access")


class RequestTracking:
    """Echo or mint x-request-id; count requests in flight (draining waits on it); one access event each."""

    def __init__(self, app: ASGIApp, svc: Services, routes: set[str], probes: tuple[str, ...] = ()) -> None:
        self.app = app
        self.svc = svc
        self.routes = routes
        self.probes = probes  # the platforms' probe paths (/ping, a Vertex health route): quiet too

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        request_id = _header(scope, b"x-request-id") or random_hex()
        state: dict[str, Any] = scope.setdefault("state", {})
        status = 500
        path = scope["path"]
        ids = {"request_id": request_id}
        tracing, span = self.svc.tracing, None
        if tracing is not None and not self._quiet(path):  # probes and scrapes are not traced
            span = tracing.start_request(scope["method"], _trace_headers(scope))
            ids["trace_id"] = tracing.trace_id(span)

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                extra = [(b"x-request-id", request_id.encode("latin-1"))]
                if span is not None:
                    extra.append((b"x-trace-id", ids["trace_id"].encode()))
                if self.svc.startup.draining:  # pooled clients move to another replica
                    extra.append((b"connection", b"close"))
                message["headers"] = [*message.get("headers", []), *extra]
            await send(message)

        self.svc.in_flight += 1
        try:
            with structlog.contextvars.bound_contextvars(**ids):
                await self.app(scope, receive, send_with_id)
        finally:
            self.svc.in_flight -= 1
            route = path if path in self.routes else "other"
            self._record(scope["method"], path, route, status, state, time.perf_counter() - started, ids)
            if span is not None:
                access = {**(state.get("access") or state.get("traced") or {}), "tenant": _tenant(state)}
                tracing.end_request(span, scope["method"], path, route, status, access)  # type: ignore[union-attr]

    def _quiet(self, path: str) -> bool:
        return (path.startswith(QUIET_PATHS) and not _dot_segments(path)) or path in self.probes

    def _record(
        self,
        method: str,
        path: str,
        route: str,
        status: int,
        state: dict[str, Any],
        seconds: float,
        ids: dict[str, str],
    ) -> None:
        self.svc.metrics.requests.labels(route=route, status=str(status)).observe(seconds)
        access = state.get("access") or {}
        timings = access.get("timings")
        if timings is not None:
            self.svc.metrics.tokenization_time.observe(timings.tokenization_ms / 1000)
        # refusals too: under a flood, a line for each 429 was most of the CPU a refusal cost (the
        # metrics count them: warmpool_requests_total's status, warmpool_rejections_total)
        log = access_log.debug if status == 429 or self._quiet(path) else access_log.info
        log(
            "request",
            **ids,
            method=method,
            route=route,
            tenant=_tenant(state),
            status=status,
            inputs=access.get("inputs"),
            tokens=access.get("tokens"),
            queue_ms=round(timings.queue_ms, 2) if timings else None,
            inference_ms=round(timings.inference_ms, 2) if timings else None,
            total_ms=round(seconds * 1000, 2),
        )


class BodyLimit:
    """413 for a body over the limit: at once from Content-Length, or as soon as a streamed body passes it."""

    def __init__(self, app: ASGIApp, svc: Services) -> None:
        self.app = app
        self.svc = svc
        self.limit = svc.settings.max_body_bytes
        # a Batch API upload is bounded by its own limit (and its form's few fields)
        self.upload_limit = svc.settings.batch_max_file_bytes + UPLOAD_FORM_BYTES

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        upload = scope["path"] == "/v1/files" and scope["method"] == "POST"
        limit = self.upload_limit if upload else self.limit
        declared = _header(scope, b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await self._reject(scope, receive, send, limit)
            return
        seen = 0

        async def counting_receive() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > limit:
                self.svc.metrics.rejections.labels(reason="body_too_large").inc()
                raise self._too_large(limit)
            return message

        await self.app(scope, counting_receive, send)

    def _too_large(self, limit: int) -> APIError:
        return APIError(413, f"request body is larger than the limit of {limit} bytes", code="body_too_large")

    async def _reject(self, scope: Scope, receive: Receive, send: Send, limit: int) -> None:
        self.svc.metrics.rejections.labels(reason="body_too_large").inc()
        await error_response(self._too_large(limit))(scope, receive, send)


def _tenant(state: dict[str, Any]) -> str | None:
    """The request's tenant's name (server/tenants/guard.py), never its key."""
    tenant = state.get("tenant")
    return tenant.name if tenant is not None else None


def is_open(path: str, method: str, probes: tuple[str, ...] = ()) -> bool:
    """Paths answered without a key: probes, version, the status page and its polls."""
    if _dot_segments(path):  # /health/../admin/... is no probe: the key decides, the router 404s
        return False
    if method in ("GET", "HEAD") and (path in OPEN_PAGES or path in probes):
        return True
    return any(path == p or path.startswith(p + "/") for p in OPEN_PATHS)


def _dot_segments(path: str) -> bool:
    """A `.` or `..` segment: uvicorn hands the path percent-decoded (%2e%2e is `..` here) but never
    normalised, and a proxy in front may resolve it to another route than the prefix says."""
    return any(segment in (".", "..") for segment in path.split("/"))


def _trace_headers(scope: Scope) -> dict[str, str]:
    """W3C trace context from the request: `traceparent`, and `tracestate` with repeated header
    lines joined (RFC 9110), each within what the SDK would parse (it drops a longer tracestate)."""
    parent: str | None = None
    states: list[str] = []
    for key, value in scope.get("headers", []):
        if key == b"traceparent" and parent is None:
            parent = value.decode("latin-1")[:128]
        elif key == b"tracestate":
            states.append(value.decode("latin-1"))
    found = {} if parent is None else {"traceparent": parent}
    state = ",".join(states)
    if states and len(state) <= TRACESTATE_LIMIT:
        found["tracestate"] = state
    return found


def _header(scope: Scope, name: bytes, limit: int | None = 512) -> str | None:
    """A header's value; cut to `limit` characters (ids echoed and logged stay bounded), except
    where the whole value matters (the API key: any length the HTTP server accepts)."""
    for key, value in scope.get("headers", []):
        if key == name:
            text: str = value.decode("latin-1")[:limit]
            return text
    return None
