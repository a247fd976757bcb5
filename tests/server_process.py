"""A real `python -m orchestrator` process on a free port, and condition waits with deadlines."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(condition: Callable[[], Any], timeout: float, what: str, interval: float = 0.02) -> Any:
    """Poll until condition() is truthy; fail with `what` past the deadline."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = condition()
            if value:
                return value
        except (httpx.HTTPError, OSError) as exc:
            last_error = exc
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last error: {last_error})")


class Served:
    """What a test asks of a serving app, in its own process (ServerProcess) or in this one
    (tests/app/inprocess.py): requests through `client`, the startup state, the batch count."""

    client: httpx.Client
    url: str

    def get(self, path: str, **kw: Any) -> httpx.Response:
        return self.client.get(path, **kw)

    def post(self, path: str, **kw: Any) -> httpx.Response:
        return self.client.post(path, **kw)

    def startup(self) -> dict[str, Any]:
        body: dict[str, Any] = self.get("/health/startup").json()
        return body

    def phase(self, name: str) -> dict[str, Any]:
        return next(p for p in self.startup()["phases"] if p["name"] == name)

    def batches(self) -> float:
        """Engine batches run so far, every model's (none yet: the histogram has no line)."""
        lines = self.get("/metrics").text.splitlines()
        return sum(float(line.split()[-1]) for line in lines if line.startswith("warmpool_batch_size_count"))


# Settings every ServerProcess gets unless its caller names them (bench/__init__.py: the result cache
# off, so a benchmark measures the engine's path, not repeated texts answered from the cache)
DEFAULT_SETTINGS: dict[str, Any] = {}


class ServerProcess(Served):
    def __init__(
        self,
        model: Path | str,
        log_path: Path,
        source: Path = ROOT,
        args: tuple[str, ...] = (),
        environ: dict[str, str] | None = None,
        port_variable: str = "WARMPOOL_PORT",
        **settings: Any,
    ) -> None:
        """`source`: the tree `python -m orchestrator` runs from (benchmarks compare commits with it);
        `args` its command line; `environ` more variables (a platform's, OTEL_*), and `port_variable`
        the one that carries the port (WARMPOOL_PORT then names another, which must lose)."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("WARMPOOL_", "AIP_", "SAGEMAKER_"))}
        # compiling is tested where asked for: elsewhere a background compile would only load the machine
        env.update({"HF_HUB_OFFLINE": "1", "WARMPOOL_LOG_FORMAT": "json", "WARMPOOL_COMPILE": "off"})
        env.update({f"WARMPOOL_{k.upper()}": str(v) for k, v in {**DEFAULT_SETTINGS, **settings}.items()})
        env.update({"WARMPOOL_MODEL": str(model), "WARMPOOL_PORT": str(self.port), **(environ or {})})
        if port_variable != "WARMPOOL_PORT":
            env.update({port_variable: str(self.port), "WARMPOOL_PORT": str(free_port())})
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115  (closed in stop())
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "orchestrator", *args],
            cwd=source,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self.client = httpx.Client(base_url=self.url, timeout=30)

    def wait_ready(self, timeout: float = 120) -> ServerProcess:
        def ready() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited with {self.proc.returncode}:\n{self.logs()}")
            return self.get("/health/ready").status_code == 200

        wait_for(ready, timeout, "readiness")
        return self

    def wait_failed(self, timeout: float = 60) -> list[dict[str, Any]]:
        """Waits for /health/startup to say failed; returns the failed phases."""
        body: dict[str, Any] = wait_for(
            lambda: (r := self.get("/health/startup")).json()["status"] == "failed" and r.json(),
            timeout,
            "the failed phase",
        )
        return [p for p in body["phases"] if p["state"] == "failed"]

    def wait_engines(self, timeout: float = 60) -> dict[str, Any]:
        """Readiness needs one engine; this waits for all of them. Returns the engine phase's detail."""

        def all_up() -> dict[str, Any] | None:
            detail: dict[str, Any] = self.phase("engine")["detail"]
            return detail if detail["up"] == detail["engines"] else None

        result: dict[str, Any] = wait_for(all_up, timeout, "every engine up")
        return result

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def children(self) -> list[int]:
        """Every descendant pid (engines are grandchildren, under the forkserver)."""
        found, frontier = [], [self.proc.pid]
        while frontier:
            pid = frontier.pop()
            try:
                kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            except OSError:
                continue
            found += [int(k) for k in kids]
            frontier += [int(k) for k in kids]
        return found

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 40) -> int:
        """Signal the server and wait for its exit; past `timeout`, dump its threads' stacks into its
        log (SIGUSR1, orchestrator/__main__.py), print the log's tail for the failing test, kill it."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.send_signal(signal.SIGUSR1)
                with contextlib.suppress(AssertionError):
                    wait_for(lambda: "most recent call first" in self.logs(), 5, "the stack dump")
                print(f"server did not exit within {timeout} s of {signal.Signals(sig).name}:\n{self.logs()}")
                self.proc.kill()
                self.proc.wait()
        self.client.close()
        self._log.close()
        return self.proc.returncode


@contextlib.contextmanager
def steady_load(server: ServerProcess, clients: int, body: dict[str, Any], statuses: list[int]) -> Iterator[None]:
    """`clients` threads posting `body` to /v1/embeddings in a loop, each status appended to
    `statuses`, for the duration of the block; the block ends only once every client has (none hangs)."""
    stop = threading.Event()

    def client() -> None:
        with httpx.Client(base_url=server.url, timeout=60) as http:
            while not stop.is_set():
                statuses.append(http.post("/v1/embeddings", json=body).status_code)

    with ThreadPoolExecutor(clients) as pool:
        futures = [pool.submit(client) for _ in range(clients)]
        try:
            yield
        finally:
            stop.set()  # inside the pool's block: its exit waits for the clients to end
        for future in futures:
            future.result(timeout=90)  # no request hung, none raised


@contextlib.contextmanager
def serving(model: Path | str, log_path: Path, **settings: Any) -> Iterator[ServerProcess]:
    """A ready server for the duration of the block, stopped (SIGTERM) after it."""
    proc = ServerProcess(model, log_path, **settings)
    try:
        yield proc.wait_ready()
    finally:
        proc.stop()
