"""A local HTTP server of one PNG, for the image-URL tests: /cat.png, /moved redirecting to it, and
/slow.png, the same PNG answered `slow_s` after it is asked (a slow host)."""

from __future__ import annotations

import contextlib
import http.server
import threading
import time
from collections.abc import Iterator
from typing import Any

from tests.tiny_vision import image_bytes


@contextlib.contextmanager
def png_host(slow_s: float = 1.0) -> Iterator[str]:
    """The server's base URL while it runs."""
    png = image_bytes("PNG", seed=5)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/slow.png":
                time.sleep(slow_s)  # the slow host itself, not a wait for anything
                self.path = "/cat.png"
            if self.path == "/moved":
                self.send_response(302)
                self.send_header("Location", "/cat.png")
                self.end_headers()
                return
            self.send_response(200 if self.path == "/cat.png" else 404)
            self.send_header("Content-Length", str(len(png)))
            self.end_headers()
            self.wfile.write(png)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
