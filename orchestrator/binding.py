"""Bind the port first, and answer probes from a stdlib thread while the web stack is imported.

FastAPI, uvicorn and the server modules take ~0.5 s to import on these machines; the early
responder makes /health/live answer within milliseconds of the bind, then hands the same
listening socket to uvicorn.
"""

from __future__ import annotations

import json
import select
import socket
import threading
from typing import Any

from common.startup import StartupState

_REASONS = {200: "OK", 503: "Service Unavailable"}
# Says who answered: this stdlib thread, before the web stack is even imported (uvicorn says "uvicorn").
SERVER_HEADER = "warmpool-early"


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    return sock


class EarlyResponder:
    """Minimal HTTP/1.1 answers (Connection: close) until uvicorn takes the socket over."""

    def __init__(self, sock: socket.socket, startup: StartupState) -> None:
        self.sock = sock
        self.startup = startup
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="early-responder", daemon=True)

    def start(self) -> EarlyResponder:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _serve(self) -> None:
        while not self._stop.is_set():
            readable, _, _ = select.select([self.sock], [], [], 0.02)
            if not readable or self._stop.is_set():
                continue
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            with conn:
                self._answer(conn)

    def _answer(self, conn: socket.socket) -> None:
        conn.settimeout(1.0)
        try:
            head = conn.recv(8192).split(b"\r\n", 1)[0].decode("latin-1")
            path = head.split(" ")[1] if head.count(" ") >= 2 else "/"
            status, body = self._route(path.split("?")[0])
            payload = json.dumps(body).encode()
            conn.sendall(
                f"HTTP/1.1 {status} {_REASONS[status]}\r\nserver: {SERVER_HEADER}\r\ncontent-type: application/json\r\n"
                f"content-length: {len(payload)}\r\nretry-after: 1\r\nconnection: close\r\n\r\n".encode()
                + payload
            )
        except OSError:
            pass

    def _route(self, path: str) -> tuple[int, dict[str, Any]]:
        if path == "/health/live":
            return 200, {"status": "alive"}
        if path.startswith("/health"):
            return 503, self.startup.snapshot()
        phase = self.startup.current()
        error = {
            "message": f"server is starting (phase '{phase}')",
            "type": "service_unavailable",
            "param": None,
            "code": "not_ready",
            "status": "starting",
            "phase": phase,
        }
        return 503, {"error": error}
