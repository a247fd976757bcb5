"""A real redis-server for the shared cache's tests (Debian's package; `make test` installs it): on a
free loopback port, no persistence, in a temporary folder; ready once it answers PING. And a server
that accepts connections and never answers, for a Redis that hangs."""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
from pathlib import Path

import pytest

from tests.server_process import free_port, wait_for

START_TIMEOUT_S = 10.0


class RedisServer:
    def __init__(self, folder: Path, port: int | None = None) -> None:
        self.folder = folder
        self.port = port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> RedisServer:
        binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        if not Path(binary).exists():
            pytest.fail("redis-server is not installed: `make redis-server` (as root) installs Debian's")
        self.process = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            cwd=self.folder,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for(self.pings, START_TIMEOUT_S, f"redis-server answering PING on {self.port}")
        return self

    def pings(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as conn:
                conn.sendall(b"PING\r\n")
                return conn.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def keys(self) -> int:
        """How many keys it holds (DBSIZE), over a plain socket."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=2) as conn:
            conn.sendall(b"DBSIZE\r\n")
            return int(conn.recv(64).strip().lstrip(b":"))

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(10)
            self.process = None


class SilentServer:
    """Accepts connections, reads what it is sent, answers nothing: a Redis that hangs."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"redis://127.0.0.1:{self.sock.getsockname()[1]}/0"
        self.accepted: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted.append(conn)  # held open, never answered

    def close(self) -> None:
        self.sock.close()
        for conn in self.accepted:
            conn.close()
