"""Start-up, crashes, signals and failed starts, each on its own real server process."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.server_process import ServerProcess, steady_load, wait_for

TEXTS = ["The forkserver keeps engines a fork away.", "Readiness flips only when warm."]


@pytest.fixture
def log_path(tmp_path: Path) -> Path:
    return tmp_path / "server.log"


def gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except OSError:
        return True


def test_live_answers_before_the_engine_is_loaded(model_dir: Path, log_path: Path) -> None:
    """The headline "live within the first second" as the ordering that implies it: the first
    liveness answer comes from the early responder, a stdlib thread that answers before the web
    stack (~0.5 s of imports) is even imported, while the forkserver is still importing torch."""
    server = ServerProcess(model_dir, log_path)
    try:
        live = wait_for(lambda: (r := server.get("/health/live")).status_code == 200 and r, 30, "liveness", 0.01)
        first_live = time.monotonic() - server.started
        assert live.headers["server"] == "warmpool-early", live.headers
        startup = server.get("/health/startup")
        ready = server.get("/health/ready")
        embed = server.post("/v1/embeddings", json={"input": "too early"})
        print(f"first /health/live answer {first_live:.2f}s after launch")
        # The port answers while torch is still being imported by the forkserver.
        assert startup.status_code == 503 and ready.status_code == 503
        phases = {p["name"]: p["state"] for p in startup.json()["phases"]}
        assert phases["bind"] == "done"
        assert phases["forkserver"] in ("pending", "running"), phases
        assert phases["ready"] == "pending"
        assert embed.status_code == 503 and embed.headers["retry-after"]
        assert embed.json()["error"]["phase"] in ("prefetch", "forkserver")
        server.wait_ready()
        assert server.post("/v1/embeddings", json={"input": "now"}).status_code == 200
    finally:
        assert server.stop() == 0


@pytest.mark.alone  # a fixed load on both cores: beside another worker its engine threads thrash
@pytest.mark.parametrize("engines", [1, 2])
def test_kill_engine_under_load_recovers(model_dir: Path, log_path: Path, engines: int) -> None:
    """One engine: 503s while it re-forks. Two: the survivor takes the dead one's inputs, no request fails."""
    server = ServerProcess(model_dir, log_path, engines=engines).wait_ready()
    old_pids = server.wait_engines()["pids"]
    victim = old_pids[-1]
    statuses: list[int] = []
    readiness: list[int] = []

    def replaced() -> bool:
        readiness.append(server.get("/health/ready").status_code)
        detail = server.phase("engine")["detail"]
        return victim not in detail["pids"] and detail["up"] == engines and readiness[-1] == 200

    try:
        with steady_load(server, 8, {"input": TEXTS * 8}, statuses):
            wait_for(lambda: len(statuses) >= 16, 60, "load to build up")
            os.kill(victim, signal.SIGKILL)
            wait_for(replaced, 30, "the killed engine to be replaced and ready", interval=0.005)
            served_after = len(statuses)
            wait_for(lambda: len(statuses) >= served_after + 16, 60, "requests after the restart")
        new_pids = server.phase("engine")["detail"]["pids"]
        assert victim not in new_pids and old_pids[:-1] == new_pids[:-1] and gone(victim)
        assert statuses[-8:] == [200] * 8
        assert server.phase("engine")["detail"]["restarts"] == 1
        if engines == 1:
            assert set(statuses) <= {200, 503}, set(statuses)
            assert 503 in readiness, "readiness never dropped while the only engine was down"
        else:
            assert set(statuses) == {200}, "a request failed although another engine was up"
            assert set(readiness) == {200}, "readiness dropped although another engine was up"
    finally:
        assert server.stop() == 0


@pytest.mark.alone  # a fixed load on both cores: beside another worker its engine threads thrash
def test_sigterm_finishes_in_flight_requests(model_dir: Path, log_path: Path) -> None:
    # The drain limit is far above the ~10 s this work takes: the test is about nothing lost, not speed.
    server = ServerProcess(model_dir, log_path, max_concurrent_inputs=4096, drain_timeout=90).wait_ready()
    children = server.children()
    assert len(children) >= 2  # forkserver (+ resource tracker) and the engine
    batch = [" ".join(["drain"] * 120)] * 16  # 16 x 122 tokens: ~0.4 s of engine time per request here

    def post() -> int:
        with httpx.Client(base_url=server.url, timeout=120) as http:
            return http.post("/v1/embeddings", json={"input": batch}).status_code

    with ThreadPoolExecutor(24) as pool:
        futures = [pool.submit(post) for _ in range(24)]
        # every request in flight before SIGTERM (one arriving after it is rightly answered 503)
        wait_for(lambda: server.startup()["in_flight"] >= 24, 30, "24 requests in flight")
        server.proc.send_signal(signal.SIGTERM)
        wait_for(lambda: server.get("/health/ready").status_code == 503, 10, "draining readiness")
        late = server.post("/v1/embeddings", json={"input": "late"})
        assert late.status_code == 503 and "shutting down" in late.json()["error"]["message"]
        codes = [f.result(timeout=120) for f in futures]
    assert codes == [200] * 24
    assert server.stop() == 0
    wait_for(lambda: all(gone(pid) for pid in children), 10, "children to exit")


@pytest.mark.parametrize("damage", ["missing", "truncated", "bad_config", "wrong_types", "no_tokenizer"])
def test_broken_model_fails_its_phase_and_exits_nonzero(
    model_dir: Path, tmp_path: Path, log_path: Path, damage: str
) -> None:
    folder = tmp_path / "model"
    if damage != "missing":
        shutil.copytree(model_dir, folder)
    if damage == "truncated":
        weights = folder / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    if damage == "bad_config":
        (folder / "config.json").write_text("{ not json")
    if damage == "wrong_types":  # valid JSON the forkserver preload once crashed on, before probes
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, "max_position_embeddings": "lots"}))
    if damage == "no_tokenizer":  # neither tokenizer.json nor sentencepiece's spiece.model
        (folder / "tokenizer.json").unlink()
    server = ServerProcess(folder, log_path, fail_linger=2)
    try:
        failed = server.wait_failed()
        assert [p["name"] for p in failed] == ["engine"]
        error = failed[0]["detail"]["error"]
        expected = {
            "missing": "not found",
            "truncated": "model",
            "bad_config": "config.json",
            "wrong_types": "lots",
            "no_tokenizer": "no tokenizer",
        }[damage]
        assert expected in error, error
        assert "\n" not in error and "Traceback" not in error  # one line; the traceback is in the log
        assert server.get("/health/ready").status_code == 503

        def exited_with_the_phase_failed_throughout() -> bool:
            if server.proc.poll() is not None:
                return True
            states = {p["name"]: p["state"] for p in server.startup()["phases"]}
            assert states["engine"] == "failed" and states["ready"] == "skipped", states
            return False

        wait_for(exited_with_the_phase_failed_throughout, 30, "the exit after the linger")
        assert server.proc.returncode != 0
    finally:
        server.stop()


def test_spawn_fallback_says_why_and_serves(model_dir: Path, log_path: Path) -> None:
    server = ServerProcess(model_dir, log_path, start_method="spawn").wait_ready()
    try:
        detail = server.phase("forkserver")["detail"]
        assert detail["method"] == "spawn"
        assert "WARMPOOL_START_METHOD" in detail["fallback_reason"]
        assert server.phase("engine")["detail"]["preloaded"] is False
        assert server.post("/v1/embeddings", json={"input": TEXTS}).status_code == 200
    finally:
        assert server.stop() == 0


def test_too_many_engine_restarts_exit_nonzero(model_dir: Path, log_path: Path) -> None:
    """Past the restart budget the engine phase fails with the reason, readiness turns 503 at once
    (although the other engine is still up), and the process exits non-zero after the linger."""
    server = ServerProcess(model_dir, log_path, engines=2, max_restarts=1, fail_linger=3).wait_ready()
    try:
        first = server.phase("engine")["detail"]["pids"][0]
        os.kill(first, signal.SIGKILL)
        second = wait_for(
            lambda: (
                (detail := server.phase("engine")["detail"])["pids"][0] != first
                and detail["restarts"] == 1
                and detail["up"] == detail["engines"]
                and detail["pids"][0]
            ),
            30,
            "the first restart",
        )
        os.kill(second, signal.SIGKILL)
        failed = wait_for(lambda: (phase := server.phase("engine"))["state"] == "failed" and phase, 30, "failure")
        assert "restarted 1 times" in failed["detail"]["error"], failed
        assert failed["detail"]["up"] == 1  # the other engine is still up, yet:
        assert server.get("/health/ready").status_code == 503
        server.proc.wait(timeout=30)
        assert server.proc.returncode != 0
    finally:
        server.stop()


@pytest.mark.alone  # a stall is a deadline missed: beside another worker a busy engine could miss it too
def test_a_stopped_engine_is_killed_and_replaced_without_failing_requests(model_dir: Path, log_path: Path) -> None:
    """SIGSTOP an engine under load: past the stall timeout it is killed and re-forked, its inputs
    move to the other engine, and every request still gets 200."""
    server = ServerProcess(model_dir, log_path, engines=2, engine_stall_timeout=2).wait_ready()
    victim = server.wait_engines()["pids"][1]
    statuses: list[int] = []

    try:
        with steady_load(server, 4, {"input": TEXTS * 4}, statuses):
            wait_for(lambda: len(statuses) >= 8, 60, "load to build up")
            os.kill(victim, signal.SIGSTOP)
            detail = wait_for(
                lambda: (
                    (d := server.phase("engine")["detail"])["stalls"] == 1
                    and victim not in d["pids"]
                    and d["up"] == 2
                    and d
                ),
                60,
                "the stopped engine to be killed and replaced",
            )
            served = len(statuses)
            wait_for(lambda: len(statuses) >= served + 8, 60, "requests after the replacement")
        assert gone(victim) and detail["restarts"] == 1
        assert set(statuses) == {200}, "a request failed although another engine was up"
        assert 'warmpool_engine_stalls_total{model="all-MiniLM-L6-v2"} 1.0' in server.get("/metrics").text
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGCONT)
        assert server.stop() == 0


def test_a_blank_api_key_file_fails_the_start_instead_of_serving_open(model_dir: Path, tmp_path: Path) -> None:
    """A key file holding only whitespace (a secret that did not mount right): the start fails with
    the reason on /health/startup and the process exits 1; nothing is served unauthenticated."""
    key = tmp_path / "api-key"
    key.write_text("  \n")
    server = ServerProcess(model_dir, tmp_path / "server.log", api_key_file=key, fail_linger=2)
    try:
        body = wait_for(
            lambda: (r := server.get("/health/startup")).json()["status"] == "failed" and r.json(), 30, "failure"
        )
        failed = [p for p in body["phases"] if p["state"] == "failed"]
        assert [p["name"] for p in failed] == ["bind"] and "is empty" in failed[0]["detail"]["error"]
        assert server.post("/v1/embeddings", json={"input": "x"}).status_code == 503
        assert server.proc.wait(timeout=30) == 1
    finally:
        server.stop()


def test_sigterm_past_the_drain_timeout_answers_what_remains_and_exits(model_dir: Path, log_path: Path) -> None:
    """Work that outlasts WARMPOOL_DRAIN_TIMEOUT: at the deadline every request still waiting is
    answered 503 (no reset, no hang), responses while draining carry `connection: close`, and the
    process exits 0 on its own."""
    server = ServerProcess(model_dir, log_path, engines=1, drain_timeout=1, max_concurrent_inputs=4096).wait_ready()
    batch = [f"{' '.join(['drain'] * 200)} {i}" for i in range(200)]  # seconds of engine work each

    def post() -> httpx.Response:
        with httpx.Client(base_url=server.url, timeout=60) as http:
            return http.post("/v1/embeddings", json={"input": batch})

    with ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(post) for _ in range(6)]
        wait_for(lambda: server.startup()["in_flight"] >= 6, 30, "6 requests in flight")
        server.proc.send_signal(signal.SIGTERM)
        late = wait_for(lambda: (r := server.get("/health/ready")).status_code == 503 and r, 10, "draining")
        assert late.headers["connection"] == "close"
        answers = [f.result(timeout=60) for f in futures]  # every client answered: none hangs
    assert {r.status_code for r in answers} <= {200, 503} and 503 in {r.status_code for r in answers}
    assert all(r.headers.get("retry-after") for r in answers if r.status_code == 503)
    assert server.proc.wait(timeout=30) == 0


def test_cuda_without_a_gpu_fails_the_engine_phase_and_exits(model_dir: Path, tmp_path: Path) -> None:
    """WARMPOOL_DEVICE=cuda on a machine with no visible GPU: the engine phase fails with the reason
    (no engine is forked), /health/startup says so, and the process exits 1."""
    server = ServerProcess(model_dir, tmp_path / "server.log", device="cuda", fail_linger=2)
    try:
        body = wait_for(
            lambda: (r := server.get("/health/startup")).json()["status"] == "failed" and r.json(), 30, "failure"
        )
        failed = {p["name"]: p["detail"].get("error") for p in body["phases"] if p["state"] == "failed"}
        assert list(failed) == ["engine"] and "WARMPOOL_DEVICE=cuda" in failed["engine"], failed
        assert server.proc.wait(timeout=30) == 1
    finally:
        server.stop()


def test_sigterm_with_an_upload_still_arriving_answers_it_503(model_dir: Path, log_path: Path) -> None:
    """A request whose body is still arriving when the drain ends is answered 503 with
    `connection: close`, not cancelled into a 500; nothing is logged as an unhandled error, and the
    process exits 0."""
    import socket

    server = ServerProcess(model_dir, log_path, engines=1, drain_timeout=1).wait_ready()
    head = b"POST /v1/embeddings HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n"
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(head + b'{"input": ')
        wait_for(lambda: server.startup()["in_flight"] >= 1, 10, "the upload in flight")
        server.proc.send_signal(signal.SIGTERM)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    status, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 503 ") and b"connection: close" in status.lower()
    assert b"shutting down" in body
    assert server.proc.wait(timeout=30) == 0
    assert "Traceback" not in server.logs() and "Exception in ASGI application" not in server.logs()


def forkserver_pid(server: ServerProcess) -> int:
    memory = server.phase("engine")["detail"]["memory"]
    return int(next(m["pid"] for m in memory if m["process"] == "forkserver"))


def test_a_hung_forkserver_is_replaced_when_a_refork_overruns(model_dir: Path, log_path: Path) -> None:
    """SIGSTOP the forkserver, then SIGKILL the only engine: its re-fork blocks on the forkserver
    until the fork limit, which kills and replaces the forkserver; the engine comes back from the new
    one and serves (before, the server said "recovering" with 0 engines for good)."""
    server = ServerProcess(model_dir, log_path, engines=1).wait_ready()
    victim = server.wait_engines()["pids"][0]
    hung = forkserver_pid(server)
    try:
        os.kill(hung, signal.SIGSTOP)
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: server.get("/health/ready").status_code == 503, 30, "readiness to drop")
        detail = wait_for(
            lambda: (d := server.phase("engine")["detail"])["up"] == 1 and victim not in d["pids"] and d,
            90,
            "the engine back from a new forkserver",
        )
        assert detail["forkserver_replacements"] == 1 and detail["restarts"] == 2  # the overrun try, then one
        assert forkserver_pid(server) != hung and gone(hung)
        assert server.post("/v1/embeddings", json={"input": TEXTS}).status_code == 200
        assert "forkserver_replaced" in server.logs()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(hung, signal.SIGCONT)
        children = server.children()
        assert server.stop() == 0
    # Engines exit once their pipe to the server closes, a moment after the server itself
    wait_for(lambda: all(gone(pid) for pid in children), 10, "every process the server had to exit")
