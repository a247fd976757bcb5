"""A deadline on request headers: uvicorn waits for them forever, so a client that connects and
sends nothing, or drips a request line, would hold a connection for good (a slowloris).

`with_header_timeout(seconds)` is uvicorn's httptools protocol with one timer: armed when a
connection opens and when a request begins, cancelled once its headers are complete; past it the
connection is closed. Bodies have their own deadline in the request pipeline (408). A request
answered before its body arrived (401, 413, 503) re-arms the timer too: the rest of the body
must arrive, and the next request begin, within it, or the connection is closed.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class _HeaderTimeoutProtocol(HttpToolsProtocol):
    header_timeout_s: float = 30.0
    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

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


def with_header_timeout(seconds: float) -> type[Any]:
    """The protocol class for uvicorn.Config(http=...), closing connections whose headers take longer."""
    return type("HeaderTimeoutProtocol", (_HeaderTimeoutProtocol,), {"header_timeout_s": seconds})
