"""Debian's headless Chromium, driven over the DevTools protocol (the websockets client uvicorn brings)."""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import httpx
from websockets.sync.client import ClientConnection, connect

from tests.server_process import wait_for

MISSING = "Debian's chromium is not installed: `make test` installs it (apt-get install -y chromium, as root)"


class HeadlessChromium:
    """One browser with one tab open at `url`; `evaluate` runs JavaScript in it, `screenshot` saves a PNG."""

    def __init__(self, url: str, width: int = 1100, height: int = 900) -> None:
        binary = shutil.which("chromium")
        assert binary is not None, MISSING
        self._closing = contextlib.ExitStack()
        profile = Path(
            self._closing.enter_context(
                tempfile.TemporaryDirectory(prefix="warmpool-chromium-", ignore_cleanup_errors=True)
            )
        )
        self.proc = subprocess.Popen(
            [
                binary,
                "--headless",
                "--no-sandbox",  # tests run as root, where Chromium's sandbox refuses to start
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                f"--window-size={width},{height}",
                "--remote-debugging-port=0",  # Chromium picks a port and writes it to DevToolsActivePort
                f"--user-data-dir={profile}",
                url,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self._closing.callback(self._stop)  # runs before the profile is removed
        self._ids = itertools.count(1)
        try:
            self.ws = self._closing.enter_context(self._attach(profile / "DevToolsActivePort", url))
        except BaseException:
            self.close()
            raise

    def _attach(self, port_file: Path, url: str) -> ClientConnection:
        def written() -> str | None:
            assert self.proc.poll() is None, f"chromium exited with {self.proc.returncode}"
            lines = port_file.read_text().split() if port_file.exists() else []
            return lines[0] if lines else None

        port = wait_for(written, 30, "chromium's DevTools port")

        def page() -> str | None:
            targets = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=5).json()
            return next((t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page"), None)

        return connect(wait_for(page, 30, f"chromium's tab at {url}"), max_size=None, open_timeout=10)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """One DevTools command; events arriving meanwhile are dropped."""
        ident = next(self._ids)
        self.ws.send(json.dumps({"id": ident, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv(timeout=30))
            if message.get("id") == ident:
                assert "error" not in message, message["error"]
                result: dict[str, Any] = message["result"]
                return result

    def evaluate(self, expression: str) -> Any:
        """The JSON-able value of `expression` in the page."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        assert "exceptionDetails" not in result, result["exceptionDetails"]
        return result["result"].get("value")

    def hover(self, x: float, y: float) -> None:
        self.call("Input.dispatchMouseEvent", type="mouseMoved", x=x, y=y)

    def screenshot(self, path: Path) -> Path:
        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"]))
        return path

    def close(self) -> None:
        """The DevTools connection, then the browser, then its profile."""
        self._closing.close()

    def _stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
