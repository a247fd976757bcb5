"""Bounds on a request's head: a deadline, and caps on its bytes and header count.

uvicorn waits for a head forever, so a client that connects and sends nothing, or drips a request
line, would hold a connection for good (a slowloris); and it reads a head of any size, growing it
by concatenation on the event loop (one ~150 MB header value held /health/live up for 3.5-4.9 s).

`with_head_limits(seconds, max_bytes, max_headers)` is uvicorn's httptools protocol with one timer,
armed when a connection opens and when a request begins, cancelled once its headers are complete
(past it the connection is closed), and a count of the bytes that arrive while a head is incomplete:
past `max_bytes` (at most one read beyond it) the answer is 431, or 414 where the request line
alone is that long, and past `max_headers` headers 431, each with `connection: close`. Bodies have
their own deadline in the request pipeline (408). A request answered before its body arrived (401,
413, 503) re-arms the timer too: the rest of the body must arrive, and the next request begin,
within it, or the connection is closed.
"""

from __future__ import annotations

import asyncio
import json
from http import HTTPStatus
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from server.http.errors import APIError, openai_body


class HeadRefused(Exception):
    """Raised from a parser callback to stop parsing a head that was just refused."""


class _HeadLimitsProtocol(HttpToolsProtocol):
    header_timeout_s: float = 30.0
    max_head_bytes: int = 64 * 1024
    max_headers: int = 128
    _header_timer: asyncio.TimerHandle | None = None
    _in_head = True  # a head has begun (or may begin) and is not complete
    _head_bytes = 0
    _url_bytes = 0
    _header_count = 0
    _refused = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # the answer is written and the connection closing: nothing more is parsed
        super().data_received(data)
        if self._in_head and not self._refused:
            # Counted only while the head stays incomplete: a read that completes it (and any body
            # after it) never counts, so the cap errs by at most the one read that crosses it.
            self._head_bytes += len(data)
            if self._head_bytes > self.max_head_bytes:
                self._refuse(431, f"request headers longer than {self.max_head_bytes} bytes")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head, self._head_bytes, self._url_bytes, self._header_count = True, 0, 0, 0
        self._arm()

    def on_url(self, url: bytes) -> None:
        self._url_bytes += len(url)
        if self._url_bytes > self.max_head_bytes:
            self._refuse(414, f"request line longer than {self.max_head_bytes} bytes")
            raise HeadRefused  # stops the parser: the rest of this read is never looked at
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        if self._header_count > self.max_headers:
            self._refuse(431, f"more than {self.max_headers} request headers")
            raise HeadRefused
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._disarm()
        super().on_headers_complete()

    def send_400_response(self, msg: str) -> None:
        if not self._refused:  # uvicorn's answer to the parser's error, which HeadRefused is
            super().send_400_response(msg)

    def _refuse(self, status: int, message: str) -> None:
        """An OpenAI-shaped error, then the connection closed: the rest of this head is never read."""
        self._refused = True
        self._disarm()
        self.logger.warning("request refused: %s", message)
        body = json.dumps(openai_body(APIError(status, message, code=str(status)))).encode()
        head = (
            f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\ncontent-type: application/json\r\n"
            f"connection: close\r\ncontent-length: {len(body)}\r\n\r\n"
        )
        self.transport.write(head.encode() + body)
        self.transport.close()

    def on_response_complete(self) -> None:
        unread_body = getattr(self.cycle, "more_body", False)
        super().on_response_complete()
        if unread_body:
            self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_too_slow)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing():
            self.transport.close()


def with_head_limits(seconds: float, max_bytes: int, max_headers: int) -> type[Any]:
    """The protocol class for uvicorn.Config(http=...), with these bounds on every request's head."""
    limits = {"header_timeout_s": seconds, "max_head_bytes": max_bytes, "max_headers": max_headers}
    return type("HeadLimitsProtocol", (_HeadLimitsProtocol,), limits)
