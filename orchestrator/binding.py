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
import time
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
    """Minimal HTTP/1.1 answers (Connection: close) until uvicorn takes the socket over. With
    `hold_s` (WARMPOOL_HOLD_DURING_START), a POST is not answered but held, at most `hold_limit` of
    them for at most `hold_s` each (then 503): once uvicorn has the socket, each held connection is
    relayed to it, bytes both ways, and waits there for the model like any request."""

    def __init__(
        self, sock: socket.socket, startup: StartupState, hold_s: float | None = None, hold_limit: int = 0
    ) -> None:
        self.sock = sock
        self.startup = startup
        self.hold_s, self.hold_limit = hold_s, hold_limit
        self._held: list[tuple[socket.socket, bytes, float]] = []  # connection, bytes read, deadline
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="early-responder", daemon=True)

    def start(self) -> EarlyResponder:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        host, port = self.sock.getsockname()[:2]
        # a wildcard socket is reached on loopback (IPv4 too for a dual-stack "::", where ::1 may be off)
        targets = (
            [(h, port) for h in ("::1", "127.0.0.1")]
            if host == "::"
            else [("127.0.0.1" if host == "0.0.0.0" else host, port)]
        )
        for conn, data, _ in self._held:
            threading.Thread(target=self._relay, args=(conn, data, targets), name="early-relay", daemon=True).start()
        self._held.clear()

    def _relay(self, client: socket.socket, data: bytes, targets: list[tuple[str, int]]) -> None:
        """A held connection handed to uvicorn, or answered 503 where it cannot be reached."""
        for target in targets:
            try:
                upstream = socket.create_connection(target, timeout=10)
            except OSError:
                continue
            _pipe(client, upstream, data)
            return
        with client:
            self._answer(client, data)

    def _serve(self) -> None:
        while not self._stop.is_set():
            readable, _, _ = select.select([self.sock], [], [], 0.02)
            self._expire()
            if not readable or self._stop.is_set():
                continue
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self._take(conn)

    def _take(self, conn: socket.socket) -> None:
        conn.settimeout(1.0)
        try:
            data = conn.recv(8192)
        except OSError:
            conn.close()
            return
        room = not self.startup.failed and len(self._held) < self.hold_limit
        if self.hold_s is not None and room and data.startswith(b"POST "):
            self._held.append((conn, data, time.monotonic() + self.hold_s))
            return
        with conn:
            self._answer(conn, data)

    def _expire(self) -> None:
        """Held connections past their deadline, or all of them once the start failed: a 503."""
        now = float("inf") if self.startup.failed else time.monotonic()
        for entry in [e for e in self._held if e[2] <= now]:
            self._held.remove(entry)
            with entry[0] as conn:
                self._answer(conn, entry[1])

    def _answer(self, conn: socket.socket, data: bytes) -> None:
        try:
            head = data.split(b"\r\n", 1)[0].decode("latin-1")
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


def _pipe(client: socket.socket, upstream: socket.socket, data: bytes) -> None:
    """What was read of the client's connection, then every byte both ways; a side that stops
    sending is shut for writing on the other, and the pipe ends once both have (uvicorn's own
    deadlines bound how long that is)."""
    with client, upstream:
        client.settimeout(None)
        upstream.settimeout(None)
        try:
            upstream.sendall(data)
            open_ends = [client, upstream]
            while open_ends:
                readable, _, _ = select.select(open_ends, [], [], 60)
                for side in readable:
                    other = upstream if side is client else client
                    chunk = side.recv(65536)
                    if chunk:
                        other.sendall(chunk)
                        continue
                    open_ends.remove(side)  # half-closed: pass it on, keep the other way open
                    other.shutdown(socket.SHUT_WR)
                    if side is upstream:  # the server has answered and closed: nothing more to carry
                        return
        except OSError:
            return
