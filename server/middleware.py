"""ASGI middleware: request ids and the in-flight count that draining waits on."""

from __future__ import annotations

import hmac
import uuid

import structlog
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.errors import APIError, error_response
from server.runtime import Runtime


class RequestTracking:
    """Echo or mint x-request-id, bind it to the log context, and count requests in flight."""

    def __init__(self, app: ASGIApp, rt: Runtime) -> None:
        self.app = app
        self.rt = rt

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = _header(scope, b"x-request-id") or uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers.append((b"x-request-id", request_id.encode("latin-1")))
                message["headers"] = headers
            await send(message)

        self.rt.in_flight += 1
        try:
            with structlog.contextvars.bound_contextvars(request_id=request_id):
                await self.app(scope, receive, send_with_id)
        finally:
            self.rt.in_flight -= 1


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key == name:
            text: str = value.decode("latin-1")[:512]
            return text
    return None


OPEN_PATHS = ("/health", "/version", "/metrics")


class ApiKeyGuard:
    """Bearer-token check on every route but probes, version and metrics; constant-time compare."""

    def __init__(self, app: ASGIApp, key: str) -> None:
        self.app = app
        self.expected = f"Bearer {key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self._open(scope["path"]):
            await self.app(scope, receive, send)
            return
        given = (_header(scope, b"authorization") or "").encode("latin-1")
        if hmac.compare_digest(given, self.expected):
            await self.app(scope, receive, send)
            return
        response = error_response(APIError(401, "missing or invalid API key", code="invalid_api_key"))
        response.headers["www-authenticate"] = "Bearer"
        await response(scope, receive, send)

    @staticmethod
    def _open(path: str) -> bool:
        return any(path == p or path.startswith(p + "/") for p in OPEN_PATHS)
