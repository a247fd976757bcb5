"""ASGI middleware: request ids and the in-flight count that draining waits on."""

from __future__ import annotations

import uuid

import structlog
from starlette.types import ASGIApp, Message, Receive, Scope, Send

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
            text: str = value.decode("latin-1")[:128]
            return text
    return None
