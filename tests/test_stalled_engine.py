"""A stopped engine during large requests, on a real two-engine server: routed around and shown as
stalled within a quarter of the stall timeout, its inputs finished by the other engine, and kept
(not killed) when it wakes before the stall timeout."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from tests.server_process import ServerProcess, steady_load, wait_for

STALL_TIMEOUT_S = 16.0  # taken for stalled after 4 s: the test ends long before a kill
LARGE = {"input": [f"sentence number {i} of a large request about warm pools" for i in range(32)]}


@pytest.mark.alone  # a stall is a deadline missed: beside another worker a busy engine could miss it too
def test_a_stopped_engine_is_routed_around_and_shown_stalled_before_it_is_killed(
    model_dir: Path, tmp_path: Path
) -> None:
    """SIGSTOP one engine under large requests: within a quarter of the stall timeout it is shown
    stalled (engine.detail.stalled, warmpool_engines_stalled) while readiness stays 200, one-input
    requests are answered by the other engine in well under the stall timeout, the large requests it
    held finish, and SIGCONT clears the stall without a kill or a restart."""
    server = ServerProcess(
        model_dir, tmp_path / "server.log", engines=2, engine_stall_timeout=STALL_TIMEOUT_S, request_timeout=30
    ).wait_ready()
    victim = server.wait_engines()["pids"][0]
    statuses: list[int] = []
    try:
        with steady_load(server, 3, LARGE, statuses):
            wait_for(lambda: len(statuses) >= 6, 60, "load to build up")
            os.kill(victim, signal.SIGSTOP)
            stopped = time.monotonic()
            wait_for(lambda: server.phase("engine")["detail"]["stalled"] == [0], 12, "the stall shown")
            shown_after = time.monotonic() - stopped
            assert 'warmpool_engines_stalled{model="all-MiniLM-L6-v2"} 1.0' in server.get("/metrics").text
            assert server.get("/health/ready").status_code == 200  # the other engine answers
            with httpx.Client(base_url=server.url, timeout=STALL_TIMEOUT_S / 4) as http:
                small = [http.post("/v1/embeddings", json={"input": f"one input {i}"}).status_code for i in range(8)]
            assert small == [200] * 8
            served = len(statuses)
            wait_for(lambda: len(statuses) >= served + 3, 30, "large requests while it is stopped")
            assert server.phase("engine")["detail"]["stalls"] == 0  # all of it before any kill
            os.kill(victim, signal.SIGCONT)
            wait_for(lambda: server.phase("engine")["detail"]["stalled"] == [], 10, "the stall cleared")
        detail = server.phase("engine")["detail"]
        assert detail["stalls"] == 0 and detail["restarts"] == 0 and victim in detail["pids"]
        assert set(statuses) == {200}, statuses
        print(f"stall shown {shown_after:.1f} s after SIGSTOP (stall timeout {STALL_TIMEOUT_S:.0f} s)")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGCONT)
        assert server.stop() == 0
