"""A request sent as soon as the port answers, held through the start (WARMPOOL_HOLD_DURING_START):
when it is answered against when readiness turns 200, over several fresh starts. Prints; never asserts.
Usage: .venv/bin/python -m bench.held_start [--starts 6] [--model DIR]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from bench.common import MODEL
from tests.server_process import ServerProcess, wait_for


def one_start(model: Path) -> tuple[float, float, float, int]:
    """(sent, ready, answered) seconds after launch, and the held request's status."""
    with tempfile.TemporaryDirectory() as tmp:
        server = ServerProcess(model, Path(tmp) / "server.log", hold_during_start="on")
        try:
            wait_for(lambda: server.get("/health/live").status_code == 200, 30, "liveness", 0.005)
            sent = time.monotonic()
            out: dict[str, Any] = {}

            def post() -> None:
                with httpx.Client(base_url=server.url, timeout=60) as client:
                    out["status"] = client.post("/v1/embeddings", json={"input": "the first request"}).status_code
                out["at"] = time.monotonic()

            thread = threading.Thread(target=post)
            thread.start()
            wait_for(lambda: server.get("/health/ready").status_code == 200, 60, "readiness", 0.005)
            ready = time.monotonic()
            thread.join(60)
            return sent - server.started, ready - server.started, out["at"] - server.started, out["status"]
        finally:
            server.wait_ready()
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--starts", type=int, default=6)
    parser.add_argument("--model", type=Path, default=MODEL)
    args = parser.parse_args()
    rows = [one_start(args.model) for _ in range(args.starts)]
    for sent, ready, answered, status in rows:
        print(f"sent {sent:.2f} s, ready {ready:.2f} s, answered {answered:.2f} s after launch: {status}")
    print(f"answered after readiness: median {statistics.median(a - r for _, r, a, _ in rows) * 1000:.0f} ms")


if __name__ == "__main__":
    main()
