"""A server of the CLI's own when no --url is given: `python -m orchestrator` on a free loopback port,
waited for until /health/ready answers (within a deadline), stopped with SIGTERM at the end whatever
ends the run (SIGKILL past a deadline)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

POLL_S = 0.2
STOP_TIMEOUT_S = 60.0  # the server drains what it holds first
LOG_TAIL_BYTES = 4000


class ApplianceError(RuntimeError):
    """The server of its own did not come up: exit code 1."""


@contextlib.contextmanager
def own_appliance(model: str | None, start_timeout_s: float) -> Iterator[str]:
    """The URL of a server started for this run; its settings are the environment's WARMPOOL_*
    (the model folder: `model`, else WARMPOOL_MODEL)."""
    with tempfile.TemporaryDirectory(prefix="warmpool-embed-") as folder:
        port_file, log_path = Path(folder) / "port", Path(folder) / "server.log"
        command = [sys.executable, "-m", "orchestrator", "--host", "127.0.0.1", "--port", "0"]
        command += ["--port-file", str(port_file)] + (["--model", model] if model else [])
        with log_path.open("wb") as log:
            # a session of its own: a Ctrl-C at the terminal reaches this process, which stops it
            server = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        try:
            url = _wait_ready(server, port_file, log_path, time.monotonic() + start_timeout_s)
            yield url
        finally:
            stop(server)


def _wait_ready(server: subprocess.Popen[bytes], port_file: Path, log: Path, deadline: float) -> str:
    with httpx.Client(timeout=5.0) as client:
        while time.monotonic() < deadline:
            if server.poll() is not None:
                raise ApplianceError(f"the server exited with {server.returncode}:\n{_tail(log)}")
            port = port_file.read_text().strip() if port_file.exists() else ""
            if port:
                url = f"http://127.0.0.1:{port}"
                with contextlib.suppress(httpx.TransportError):
                    if client.get(f"{url}/health/ready").status_code == 200:
                        return url
            time.sleep(POLL_S)
    raise ApplianceError(f"the server was not ready within the start timeout:\n{_tail(log)}")


def stop(server: subprocess.Popen[bytes]) -> None:
    if server.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(server.pid, signal.SIGTERM)
        try:
            server.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def _tail(log: Path) -> str:
    data = log.read_bytes()[-LOG_TAIL_BYTES:]
    return data.decode("utf-8", "replace")
